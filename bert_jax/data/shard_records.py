"""The records of one split of a shard at one sequence length, by generation engine, with the
statistics they add to the run's summary (`generate.make_shard_records` calls one per split).

* `original`: `examples.instances_from_documents`, google-research/bert's random stream;
* `fast`: `batch_instances.instances_from_documents`, in bulk, with its own stream.

Both take (documents, length, max_predictions, GenerationConfig, MaskingSpec, seed, the length's
statistics dict, updated in place) and return the serialized records; both count and serialize
their instances the same way, as padded rows (`_records`, `example_proto.serialize_arrays`).
"""

import itertools
import random
from typing import NamedTuple

import numpy as np

from bert_jax.data import batch_instances, example_proto, examples

PAD_BLOCK = 4096  # the original engine's instances padded and serialized at a time


class _Rows(NamedTuple):
  """N instances padded to one length: input ids with [PAD], everything else with 0."""

  input_ids_NxL: np.ndarray
  segment_ids_NxL: np.ndarray
  lengths_N: np.ndarray
  masked_positions_NxP: np.ndarray
  masked_ids_NxP: np.ndarray
  num_masked_N: np.ndarray
  is_random_next_N: np.ndarray
  short_target_N: np.ndarray


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
  for lo in range(0, len(instances), PAD_BLOCK):  # rows for a block at a time: memory flat
    rows = _padded(instances[lo : lo + PAD_BLOCK], length, max_predictions, spec.pad_id)
    records += _records(rows, config, spec, length_stats)
  return records


def fast(documents, length, max_predictions, config, spec, seed, length_stats):
  """The records of one split at one length, made in bulk (batch_instances)."""
  a = batch_instances.instances_from_documents(
    documents,
    *_procedure(config, length, max_predictions, spec),
    seed,
    config.rates,
    config.sentence_pairs,
  )
  rows = _Rows(
    a.input_ids_NxL,
    a.segment_ids_NxL,
    a.lengths_N,
    a.masked_positions_NxP,
    a.masked_ids_NxP,
    a.num_masked_N,
    a.is_random_next_N,
    a.short_target_N,
  )
  return _records(rows, config, spec, length_stats)


def _padded(instances: list[examples.Instance], length, max_predictions, pad_id) -> _Rows:
  """`examples.Instance`s -> padded rows (each list written into its row's leading slots)."""
  n = len(instances)
  lengths = np.fromiter((len(i.input_ids) for i in instances), np.int32, n)
  num_masked = np.fromiter((len(i.masked_positions) for i in instances), np.int32, n)
  if lengths.max(initial=0) > length:
    raise ValueError(f"an instance of {lengths.max()} tokens exceeds max_seq_length {length}")
  if num_masked.max(initial=0) > max_predictions:
    raise ValueError(f"{num_masked.max()} masks exceed max_predictions_per_seq {max_predictions}")

  def filled(lists, shape, used, fill, dtype):
    out = np.full(shape, fill, dtype)
    out[used] = np.fromiter(itertools.chain.from_iterable(lists), dtype, int(used.sum()))
    return out  # boolean-mask assignment fills row by row, each row's values in order

  inside = np.arange(length)[None] < lengths[:, None]
  real = np.arange(max_predictions)[None] < num_masked[:, None]
  shape_L, shape_P = (n, length), (n, max_predictions)
  return _Rows(
    filled((i.input_ids for i in instances), shape_L, inside, pad_id, np.int32),
    filled((i.segment_ids for i in instances), shape_L, inside, 0, np.int8),
    lengths,
    filled((i.masked_positions for i in instances), shape_P, real, 0, np.int32),
    filled((i.masked_ids for i in instances), shape_P, real, 0, np.int32),
    num_masked,
    np.fromiter((i.is_random_next for i in instances), bool, n),
    np.fromiter((i.short_target for i in instances), bool, n),
  )


def _records(rows: _Rows, config, spec, length_stats) -> list[bytes]:
  """Adds the rows' counts to ``length_stats``; their serialized Examples."""
  n, length = rows.input_ids_NxL.shape
  lengths = rows.lengths_N.astype(np.int64)
  length_stats["tokens"] += int(lengths.sum())
  real = np.arange(rows.masked_positions_NxP.shape[1])[None] < rows.num_masked_N[:, None]
  if config.sentence_pairs:
    length_stats["maskable"] += int((lengths - 3).sum())
  else:  # the maskable tokens: not [CLS], [SEP] or [PAD] before masking
    restored = rows.input_ids_NxL.copy()
    r, slot = np.nonzero(real)
    restored[r, rows.masked_positions_NxP[r, slot]] = rows.masked_ids_NxP[r, slot]
    inside = np.arange(length)[None] < lengths[:, None]
    special = np.isin(restored, [spec.cls_id, spec.sep_id, spec.pad_id])
    length_stats["packed"] += n
    length_stats["maskable"] += int((inside & ~special).sum())
  length_stats["masked"] += int(rows.num_masked_N.sum())
  length_stats["random_next"] += int(rows.is_random_next_N.sum())
  length_stats["short_targets"] += int(rows.short_target_N.sum())
  at_masks = np.take_along_axis(rows.input_ids_NxL, rows.masked_positions_NxP, axis=1)
  is_mask = real & (at_masks == spec.mask_id)
  kept = real & ~is_mask & (at_masks == rows.masked_ids_NxP)
  length_stats["mask_token"] += int(is_mask.sum())
  length_stats["kept"] += int(kept.sum())
  length_stats["replaced"] += int(real.sum() - is_mask.sum() - kept.sum())
  return _serialize(rows)


def _serialize(rows: _Rows) -> list[bytes]:
  return example_proto.serialize_arrays(
    rows.input_ids_NxL,
    rows.lengths_N,
    rows.segment_ids_NxL,
    rows.masked_positions_NxP,
    rows.masked_ids_NxP,
    rows.num_masked_N,
    rows.is_random_next_N,
  )
