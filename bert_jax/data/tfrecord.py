"""The pre-training TFRecord schema (google-research/bert's, also NVIDIA's) and shard integrity.

Every record is a `tf.train.Example` with int64 features `input_ids`, `input_mask`,
`segment_ids` [max_seq_length], `masked_lm_positions`, `masked_lm_ids`
[max_predictions_per_seq], `next_sentence_labels` [1] and a float feature
`masked_lm_weights` [max_predictions_per_seq]. `next_sentence_labels` is 1 when segment B is a
random segment ("is_random_next"), 0 when it is the real continuation. Records are serialized by
`example_proto.serialize_arrays` and written by `tfrecord_writer.write_records`, neither of
which needs TensorFlow; reading and checking them here does.
"""

import struct

import tensorflow as tf

from bert_jax.data import corpus

FEATURE_NAMES = (
  "input_ids",
  "input_mask",
  "segment_ids",
  "masked_lm_positions",
  "masked_lm_ids",
  "masked_lm_weights",
  "next_sentence_labels",
)


def feature_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
  """The `tf.io.parse_single_example` spec of the original create_pretraining_data.py files."""
  return {
    "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
    "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
    "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
    "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
    "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
    "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
    "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
  }


def parse_batch(serialized_B: tf.Tensor, max_seq_length: int, max_predictions_per_seq: int) -> dict:
  """A batch of serialized Examples -> dict of int32/float32 tensors (labels squeezed to [B])."""
  parsed = tf.io.parse_example(serialized_B, feature_spec(max_seq_length, max_predictions_per_seq))
  out = {}
  for name, value in parsed.items():
    if value.dtype == tf.int64:
      value = tf.cast(value, tf.int32)
    out[name] = value
  out["next_sentence_labels"] = tf.reshape(out["next_sentence_labels"], [-1])
  return out


def check_record_framing(path: str, max_records: int | None = None) -> int:
  """Walks the TFRecord framing (8-byte length, 4-byte crc, data, 4-byte crc) of a file.

  Returns the number of records seen (stopping after `max_records` when given). Raises a
  ValueError naming the file, the record and the byte offset when the file is cut mid-record.
  Cheap: reads 12 bytes per record and seeks over the data.
  """
  size = tf.io.gfile.stat(path).length
  count = 0
  offset = 0
  with tf.io.gfile.GFile(path, "rb") as f:
    while offset < size:
      if max_records is not None and count >= max_records:
        break
      header = f.read(12)
      if len(header) < 12:
        raise ValueError(
          f"{path}: TFRecord file truncated inside the header of record {count} "
          f"(byte {offset} of {size}); the shard is incomplete, regenerate it"
        )
      (length,) = struct.unpack("<Q", header[:8])
      end = offset + 12 + length + 4
      if end > size:
        raise ValueError(
          f"{path}: TFRecord file truncated inside record {count} (starts at byte "
          f"{offset}, needs {end} bytes, file has {size}); the shard is "
          "incomplete, regenerate it"
        )
      f.seek(end)
      offset = end
      count += 1
  return count


def find_broken_file(paths: list[str]) -> str | None:
  """Names the first unreadable file among `paths` (error path only): a framing walk finds
  truncation cheaply; a full read per file finds corruption (TensorFlow's CRC check)."""
  for path in paths:
    try:
      check_record_framing(path)
    except ValueError as e:
      return str(e)
  for path in paths:
    try:
      for _ in tf.data.TFRecordDataset(path):
        pass
    except tf.errors.DataLossError as e:
      return f"{path}: corrupt TFRecord data ({e.message}); regenerate this shard"
  return None


def records_have_sentence_pairs(
  file_patterns, max_seq_length: int, max_predictions_per_seq: int, max_records: int = 64
) -> bool:
  """Whether the files hold sentence pairs (NSP data): True if any of the first `max_records`
  records (files in sorted order) has a segment id 1, False if none has (single segments, as
  `create_pretraining_data --sentence_pairs=false` writes). Every pair record has segment 1
  (B is never empty), so a few records decide. ValueError when the files hold no record.

  `max_predictions_per_seq` is accepted for symmetry with the other readers (only segment_ids
  is parsed).
  """
  del max_predictions_per_seq
  files = corpus.expand_patterns(file_patterns)
  spec = {"segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64)}
  seen = 0
  try:
    for record in tf.data.TFRecordDataset(files).take(max_records):
      segment_ids = tf.io.parse_single_example(record, spec)["segment_ids"]
      if bool(tf.reduce_any(segment_ids == 1)):
        return True
      seen += 1
  except tf.errors.DataLossError as e:
    raise ValueError(
      find_broken_file(files) or f"{files}: corrupt TFRecord data: {e.message}"
    ) from None
  except tf.errors.InvalidArgumentError as e:
    raise ValueError(
      f"records of {files} do not match the pre-training schema with max_seq_length="
      f"{max_seq_length}: {e.message}"
    ) from None
  if not seen:
    raise ValueError(f"{files}: no records to read")
  return False


def record_shape(file_patterns) -> tuple[int, int]:
  """(sequence length, predictions per sequence) of the files' records, from the first record
  (files in sorted order): the lengths of its input_ids and masked_lm_positions. ValueError
  when the files hold no record or it is not of the pre-training schema."""
  files = corpus.expand_patterns(file_patterns)
  try:
    for record in tf.data.TFRecordDataset(files).take(1):
      example = tf.train.Example.FromString(record.numpy())
      features = example.features.feature
      if "input_ids" not in features or "masked_lm_positions" not in features:
        raise ValueError(
          f"{files[0]}: its first record has no input_ids / masked_lm_positions (not the "
          "pre-training schema)"
        )
      return (
        len(features["input_ids"].int64_list.value),
        len(features["masked_lm_positions"].int64_list.value),
      )
  except tf.errors.DataLossError as e:
    raise ValueError(
      find_broken_file(files) or f"{files}: corrupt TFRecord data: {e.message}"
    ) from None
  raise ValueError(f"{files}: no records to read")
