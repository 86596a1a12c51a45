"""The records of one split of a shard at one sequence length, by generation engine, with the
statistics they add to the run's summary (`generate.make_shard_records` calls one per split).

* `original`: `examples.instances_from_documents`, google-research/bert's random stream, each
  instance serialized by `example_proto.serialize_example`;
* `fast`: `batch_instances.instances_from_documents`, in bulk, serialized by
  `example_proto.serialize_arrays`.

Both take (documents, length, max_predictions, GenerationConfig, MaskingSpec, seed, the length's
statistics dict, updated in place) and return the serialized records.
"""

import random

import numpy as np

from bert_jax.data import batch_instances, example_proto, examples


def _procedure(config, length, max_predictions, spec) -> tuple:
  """The settings both engines' instances_from_documents take after the documents, in order."""
  return (
    length,
    config.dupe_factor,
    config.short_seq_prob,
    config.masked_lm_prob,
    max_predictions,
    spec,
    config.whole_word_mask,
  )


def original(documents, length, max_predictions, config, spec, seed, length_stats):
  """The records of one split at one length, google-research/bert's random stream."""
  instances = examples.instances_from_documents(
    documents,
    *_procedure(config, length, max_predictions, spec),
    random.Random(seed),
    config.rates,
    config.sentence_pairs,
  )
  records = []
  for inst in instances:
    records.append(
      example_proto.serialize_example(
        inst.input_ids,
        inst.segment_ids,
        inst.masked_positions,
        inst.masked_ids,
        inst.is_random_next,
        length,
        max_predictions,
        pad_id=spec.pad_id,
      )
    )
    length_stats["tokens"] += len(inst.input_ids)
    if config.sentence_pairs:
      length_stats["maskable"] += len(inst.input_ids) - 3
    else:
      length_stats["packed"] += 1
      length_stats["maskable"] += sum(
        t not in (spec.cls_id, spec.sep_id, spec.pad_id) for t in _restored(inst)
      )
    length_stats["masked"] += len(inst.masked_positions)
    length_stats["random_next"] += inst.is_random_next
    length_stats["short_targets"] += inst.short_target
    for position, label in zip(inst.masked_positions, inst.masked_ids):
      token_id = inst.input_ids[position]
      kind = (
        "mask_token" if token_id == spec.mask_id else "kept" if token_id == label else "replaced"
      )
      length_stats[kind] += 1
  return records


def fast(documents, length, max_predictions, config, spec, seed, length_stats):
  """The records of one split at one length, made in bulk (batch_instances)."""
  arrays = batch_instances.instances_from_documents(
    documents,
    *_procedure(config, length, max_predictions, spec),
    seed,
    config.rates,
    config.sentence_pairs,
  )
  lengths = arrays.lengths_N.astype(np.int64)
  length_stats["tokens"] += int(lengths.sum())
  real = np.arange(max_predictions)[None] < arrays.num_masked_N[:, None]
  if config.sentence_pairs:
    length_stats["maskable"] += int((lengths - 3).sum())
  else:
    restored = arrays.input_ids_NxL.copy()
    rows, slots = np.nonzero(real)
    restored[rows, arrays.masked_positions_NxP[rows, slots]] = arrays.masked_ids_NxP[rows, slots]
    inside = np.arange(length)[None] < lengths[:, None]
    special = np.isin(restored, [spec.cls_id, spec.sep_id, spec.pad_id])
    length_stats["packed"] += len(lengths)
    length_stats["maskable"] += int((inside & ~special).sum())
  length_stats["masked"] += int(arrays.num_masked_N.sum())
  length_stats["random_next"] += int(arrays.is_random_next_N.sum())
  length_stats["short_targets"] += int(arrays.short_target_N.sum())
  at_masks = np.take_along_axis(arrays.input_ids_NxL, arrays.masked_positions_NxP, axis=1)
  is_mask = real & (at_masks == spec.mask_id)
  kept = real & ~is_mask & (at_masks == arrays.masked_ids_NxP)
  length_stats["mask_token"] += int(is_mask.sum())
  length_stats["kept"] += int(kept.sum())
  length_stats["replaced"] += int(real.sum() - is_mask.sum() - kept.sum())
  return example_proto.serialize_arrays(
    arrays.input_ids_NxL,
    arrays.lengths_N,
    arrays.segment_ids_NxL,
    arrays.masked_positions_NxP,
    arrays.masked_ids_NxP,
    arrays.num_masked_N,
    arrays.is_random_next_N,
  )


def _restored(inst: examples.Instance) -> list[int]:
  ids = list(inst.input_ids)
  for position, label in zip(inst.masked_positions, inst.masked_ids):
    ids[position] = label
  return ids
