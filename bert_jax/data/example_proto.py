"""`tf.train.Example` serialization without importing TensorFlow (for generation workers).

The message types of tensorflow/core/example/{feature,example}.proto are declared to protobuf's
descriptor API in a private pool, so a worker process serializes Examples with the `protobuf`
package alone (TensorFlow takes seconds to import per process). Serialization is deterministic
(map keys sorted), so the bytes equal `tf.train.Example(...).SerializeToString(deterministic=True)`
(tested against TensorFlow's own classes).
"""

import functools

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
