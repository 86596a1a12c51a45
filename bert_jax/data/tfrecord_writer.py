"""TFRecord files written without TensorFlow: the generator's processes never import it.

A TFRecord file is a sequence of records, each framed as
``uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)`` (little
endian), where ``masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xA282EAD8 (mod 2**32)``, as
TensorFlow's guide "TFRecord and tf.train.Example" documents the format. CRC-32C comes from
``google-crc32c`` (Google's C implementation, with hardware CRC where the CPU has it).
Importing TensorFlow costs a generation run 6-7 s of start-up on this host; this module's
bytes equal ``tf.io.TFRecordWriter``'s (tests/test_data_tfrecord_writer.py).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import google_crc32c

_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
# Records are joined into chunks of about this many bytes before each write() call.
_CHUNK_BYTES = 1 << 22


def masked_crc32c(data: bytes) -> int:
  crc = google_crc32c.value(data)
  return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF  # rotate right 15, add


def write_records(path: str, records: Iterable[bytes]) -> None:
  """Writes ``records`` to a new local file ``path`` (replacing one there), uncompressed.

  Callers that need the file to appear whole write to a temporary name and rename it (as
  bert_jax.data.generate does)."""
  pack_crc = _CRC.pack
  headers: dict[int, bytes] = {}  # length -> its 12 framing bytes (records repeat lengths)
  with open(path, "wb") as f:
    parts, size = [], 0
    for record in records:
      n = len(record)
      header = headers.get(n)
      if header is None:
        length = _LENGTH.pack(n)
        header = headers[n] = length + pack_crc(masked_crc32c(length))
      parts += (header, record, pack_crc(masked_crc32c(record)))
      size += n
      if size >= _CHUNK_BYTES:
        f.write(b"".join(parts))
        parts, size = [], 0
    f.write(b"".join(parts))
