"""`tf.train.Example` serialization without importing TensorFlow (for generation workers).

The message types of tensorflow/core/example/{feature,example}.proto are declared to protobuf's
descriptor API in a private pool, so a worker process serializes Examples with the `protobuf`
package alone (TensorFlow takes seconds to import per process). Serialization is deterministic
(map keys sorted), so the bytes equal `tf.train.Example(...).SerializeToString(deterministic=True)`
(tested against TensorFlow's own classes).
"""

import functools

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto


def _field(
  message,
  name,
  number,
  field_type,
  label=_F.LABEL_OPTIONAL,
  type_name=None,
  packed=None,
  oneof_index=None,
):
  field = message.field.add(name=name, number=number, type=field_type, label=label)
  if type_name:
    field.type_name = type_name
  if packed is not None:
    field.options.packed = packed
  if oneof_index is not None:
    field.oneof_index = oneof_index
  return field


@functools.lru_cache(maxsize=1)
def _example_class():
  """Builds (once per process) the Example message class of TensorFlow's example.proto."""
  file_proto = descriptor_pb2.FileDescriptorProto(
    name="bert_jax/tensorflow_example.proto", package="tensorflow", syntax="proto3"
  )
  for name, field_type in (
    ("BytesList", _F.TYPE_BYTES),
    ("FloatList", _F.TYPE_FLOAT),
    ("Int64List", _F.TYPE_INT64),
  ):
    message = file_proto.message_type.add(name=name)
    _field(
      message,
      "value",
      1,
      field_type,
      _F.LABEL_REPEATED,
      packed=None if field_type == _F.TYPE_BYTES else True,
    )
  feature = file_proto.message_type.add(name="Feature")
  feature.oneof_decl.add(name="kind")
  for number, (name, type_name) in enumerate(
    (
      ("bytes_list", ".tensorflow.BytesList"),
      ("float_list", ".tensorflow.FloatList"),
      ("int64_list", ".tensorflow.Int64List"),
    ),
    start=1,
  ):
    _field(feature, name, number, _F.TYPE_MESSAGE, type_name=type_name, oneof_index=0)
  features = file_proto.message_type.add(name="Features")
  entry = features.nested_type.add(name="FeatureEntry")
  entry.options.map_entry = True
  _field(entry, "key", 1, _F.TYPE_STRING)
  _field(entry, "value", 2, _F.TYPE_MESSAGE, type_name=".tensorflow.Feature")
  _field(
    features,
    "feature",
    1,
    _F.TYPE_MESSAGE,
    _F.LABEL_REPEATED,
    type_name=".tensorflow.Features.FeatureEntry",
  )
  example = file_proto.message_type.add(name="Example")
  _field(example, "features", 1, _F.TYPE_MESSAGE, type_name=".tensorflow.Features")
  pool = descriptor_pool.DescriptorPool()
  pool.Add(file_proto)
  return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def serialize_example(
  input_ids: list[int],
  segment_ids: list[int],
  masked_positions: list[int],
  masked_ids: list[int],
  is_random_next: bool,
  max_seq_length: int,
  max_predictions_per_seq: int,
  pad_id: int = 0,
) -> bytes:
  """One instance -> a serialized tf.train.Example of the original schema, padded like the
  original (input_ids with `pad_id`, everything else with 0)."""
  n = len(input_ids)
  if n > max_seq_length:
    raise ValueError(f"instance of {n} tokens exceeds max_seq_length {max_seq_length}")
  num_masks = len(masked_positions)
  if num_masks > max_predictions_per_seq:
    raise ValueError(f"{num_masks} masks exceed max_predictions_per_seq {max_predictions_per_seq}")
  pad = max_seq_length - n
  mask_pad = max_predictions_per_seq - num_masks
  example = _example_class()()
  feature = example.features.feature
  feature["input_ids"].int64_list.value.extend(list(input_ids) + [pad_id] * pad)
  feature["input_mask"].int64_list.value.extend([1] * n + [0] * pad)
  feature["segment_ids"].int64_list.value.extend(list(segment_ids) + [0] * pad)
  feature["masked_lm_positions"].int64_list.value.extend(list(masked_positions) + [0] * mask_pad)
  feature["masked_lm_ids"].int64_list.value.extend(list(masked_ids) + [0] * mask_pad)
  feature["masked_lm_weights"].float_list.value.extend([1.0] * num_masks + [0.0] * mask_pad)
  feature["next_sentence_labels"].int64_list.value.append(1 if is_random_next else 0)
  return example.SerializeToString(deterministic=True)


# The schema's features in the order deterministic serialization writes them (keys sorted).
_BATCH_FEATURES = (
  "input_ids",
  "input_mask",
  "masked_lm_ids",
  "masked_lm_positions",
  "masked_lm_weights",
  "next_sentence_labels",
  "segment_ids",
)
_BLOCK_ROWS = 4096


def serialize_arrays(
  input_ids_NxL,
  lengths_N,
  segment_ids_NxL,
  masked_positions_NxP,
  masked_ids_NxP,
  num_masked_N,
  is_random_next_N,
) -> list[bytes]:
  """N padded instances (see batch_instances.InstanceArrays) -> the bytes `serialize_example`
  gives for each, encoded for all rows at once.

  protobuf serializes one message per call (about 30 us per Example of seq 128 here, most of it
  turning numpy rows into Python ints); TensorFlow's batched `tf.io.encode_proto` needs a
  layer of calls per nesting level of the map and was no faster. So the wire format of this one
  fixed schema is written directly: each value's varint bytes in byte "slots" ([rows, values x
  width]) with a mask of the slots used, the length prefixes computed from the payload sizes,
  and the masked slots read out row by row, which is exactly each row's message. Tested
  byte-identical to protobuf's deterministic serialization.
  """
  lengths_N = np.asarray(lengths_N)
  num_masked_N = np.asarray(num_masked_N)
  n, L = input_ids_NxL.shape
  P = masked_positions_NxP.shape[1]
  out = []
  for lo in range(0, n, _BLOCK_ROWS):
    b = slice(lo, lo + _BLOCK_ROWS)
    columns = {
      "input_ids": input_ids_NxL[b],
      "input_mask": np.arange(L)[None] < lengths_N[b, None],
      "masked_lm_ids": masked_ids_NxP[b],
      "masked_lm_positions": masked_positions_NxP[b],
      "masked_lm_weights": (np.arange(P)[None] < num_masked_N[b, None]).astype("<f4"),
      "next_sentence_labels": np.asarray(is_random_next_N[b])[:, None],
      "segment_ids": segment_ids_NxL[b],
    }
    out += _encode_block([(name, columns[name]) for name in _BATCH_FEATURES])
  return out


def _varint_size(x):
  return 1 + (x >= 1 << 7) + (x >= 1 << 14) + (x >= 1 << 21)


def _varint_slots(values_NxK):
  """Non-negative ints below 2**28 -> ([N, K x w] varint bytes, [N, K x w] which are used), w the
  widest varint of the block."""
  v = np.asarray(values_NxK)
  if v.size and (v.min() < 0 or v.max() >= 1 << 28):
    raise ValueError(f"values must be in [0, 2**28) for serialization, got {v.min()}..{v.max()}")
  v = v.astype(np.uint32)
  n = v.shape[0]
  width = int(_varint_size(int(v.max(initial=0))))
  if width == 1:
    return v.astype(np.uint8), np.ones(v.shape, bool)
  slots = np.empty(v.shape + (width,), np.uint8)
  used = np.empty(v.shape + (width,), bool)
  for k in range(width):
    more = (v >= 1 << 7 * (k + 1)).astype(np.uint8)
    slots[..., k] = ((v >> 7 * k) & 0x7F).astype(np.uint8) | (more << 7)
    used[..., k] = True if k == 0 else v >= 1 << 7 * k
  return slots.reshape(n, -1), used.reshape(n, -1)


def _fixed(n: int, data: bytes):
  row = np.frombuffer(data, np.uint8)
  return np.broadcast_to(row, (n, len(row))), np.ones((n, len(row)), bool)


def _encode_block(features) -> list[bytes]:
  """[(name, [N, K] ints or float32)] in key order -> N serialized Examples."""
  n = len(features[0][1])
  parts, entry_sizes = [], []
  for name, values in features:
    if values.dtype == np.float32:  # FloatList: packed fixed32, field 2 of Feature.
      payload = np.ascontiguousarray(values, "<f4").view(np.uint8).reshape(n, -1)
      payload_used = np.ones(payload.shape, bool)
      kind = 0x12
    else:  # Int64List: packed varints, field 3 of Feature.
      payload, payload_used = _varint_slots(values)
      kind = 0x1A
    size = payload_used.sum(axis=1, dtype=np.int64)
    list_size = 1 + _varint_size(size) + size  # Int64List / FloatList: field 1, packed.
    feature_size = 1 + _varint_size(list_size) + list_size
    key = name.encode()
    entry_size = 3 + len(key) + _varint_size(feature_size) + feature_size
    entry_sizes.append(entry_size)
    parts += [
      _fixed(n, b"\x0a"),  # Features.feature (a map entry), field 1
      _varint_slots(entry_size[:, None]),
      _fixed(n, b"\x0a" + bytes([len(key)]) + key + b"\x12"),  # entry key; entry value
      _varint_slots(feature_size[:, None]),
      _fixed(n, bytes([kind])),
      _varint_slots(list_size[:, None]),
      _fixed(n, b"\x0a"),  # the list's packed values, field 1
      _varint_slots(size[:, None]),
      (payload, payload_used),
    ]
  features_size = sum(1 + _varint_size(e) + e for e in entry_sizes)
  parts = [_fixed(n, b"\x0a"), _varint_slots(features_size[:, None]), *parts]  # Example.features
  slots = np.concatenate([s for s, _ in parts], axis=1)
  used = np.concatenate([u for _, u in parts], axis=1)
  data = slots[used].tobytes()  # Row by row: each row's used slots are its message.
  ends = np.cumsum(used.sum(axis=1)).tolist()
  return [data[a:b] for a, b in zip([0, *ends[:-1]], ends)]
