"""The pre-training input pipeline (tf.data): `PretrainInput` (training) and `eval_batches`.

Training order, per epoch e (a pure function of seed, host, e):
  this host's files, shuffled by (seed, e) -> interleaved records (deterministic) ->
  [record-level host split when files < hosts] -> shuffle buffer seeded by (seed, e) ->
  numbered 0, 1, ... . Epochs are chained without a gap, then batched (drop_remainder: every
batch is full); each batch is parsed with vector ops, batches in parallel and in order, and
prefetched; the consumer's `next` then masks it (`dynamic_masking`, NumPy vector ops, seeded by
seed, host, and the epoch and number of the batch's first record). The state is {"epoch",
"position"}: the epoch and the number of records of it already delivered; `set_state` rebuilds
the stream and skips `position` serialized records of that epoch before any parsing, so a resumed
run sees exactly the batches it would have seen.

Masks: the files' static masks as they are; `dynamic_masking` draws fresh ones per read (with
`masked_lm_prob`, `whole_word_mask`, `mask_rates`); `unmask` undoes the static masks and zeroes
the masked_lm features, for objectives that read the original text (left-to-right LM).

Host split: with at least as many files as hosts, host i reads files i, i + n, ... (sorted);
otherwise every host reads all files and keeps records i, i + n, ... .
"""

import jax
import numpy as np
import tensorflow as tf
from absl import logging

from bert_jax.data import corpus, masking, tfrecord
from bert_jax.data import dynamic_masking as dynamic_masking_lib

_META_KEYS = ("_epoch", "_position")


def _host(process_index, process_count):
  if process_index is None or process_count is None:
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, process_count={process_count})")
  return process_index, process_count


def host_files(file_patterns, process_index: int, process_count: int) -> tuple[list[str], bool]:
  """(files this host reads, whether records must be split by host instead of files)."""
  files = corpus.expand_patterns(file_patterns)
  if len(files) >= process_count:
    return files[process_index::process_count], False
  return files, True


def _check_nonempty(
  files: list[str], by_record: bool, process_index: int, process_count: int
) -> None:
  """A host with no record would make the repeated stream spin forever: refuse it upfront."""
  if by_record:
    available = 0
    for path in files:
      available += tfrecord.check_record_framing(path, max_records=process_count - available)
      if available >= process_count:
        return
    raise ValueError(
      f"{files}: {available} records for {process_count} hosts; host {process_index} would get none"
    )
  if not any(tf.io.gfile.stat(p).length > 0 for p in files):
    raise ValueError(f"host {process_index}'s input files are all empty: {files}")


class PretrainInput:
  """An endless, resumable iterator of this host's pre-training batches (dicts of numpy).

  Keys: input_ids, input_mask, segment_ids (int32 [b, max_seq_length]); masked_lm_positions,
  masked_lm_ids (int32 [b, max_predictions_per_seq]), masked_lm_weights (float32 [b, P]);
  next_sentence_labels (int32 [b]).
  """

  def __init__(
    self,
    file_patterns,
    batch_size: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    shuffle_buffer_size: int = 10_000,
    process_index: int | None = None,
    process_count: int | None = None,
    dynamic_masking: bool = False,
    tokenizer=None,
    masked_lm_prob: float = 0.15,
    whole_word_mask: bool = False,
    mask_rates: masking.MaskRates = masking.MaskRates(),
    unmask: bool = False,
    cycle_length: int = 8,
    prefetch: int = 2,
  ):
    """Args:
    file_patterns: comma-separated globs or a list (TFRecords of the original schema).
    batch_size: this host's batch (global batch / process_count).
    max_seq_length, max_predictions_per_seq: the files' shapes.
    seed: shuffling (and dynamic masking) seed; the same seed gives the same stream.
    dynamic_masking: draw a fresh mask per read (needs `tokenizer`, the data's vocabulary);
      masked_lm_prob, whole_word_mask, mask_rates (a MaskRates or (mask, same, random)) apply
      to it. Static masks in the files are undone first.
    unmask: undo the files' static masks (input_ids are the original tokens) and zero
      masked_lm_positions/ids/weights (the left-to-right LM reads the original text); not with
      dynamic_masking.
    process_index, process_count: this host; None asks jax.
    """
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    self.process_index, self.process_count = _host(process_index, process_count)
    self.files, self.by_record = host_files(file_patterns, self.process_index, self.process_count)
    _check_nonempty(self.files, self.by_record, self.process_index, self.process_count)
    self.batch_size = batch_size
    self.max_seq_length = max_seq_length
    self.max_predictions_per_seq = max_predictions_per_seq
    self.seed = seed
    self.shuffle = shuffle
    self.shuffle_buffer_size = shuffle_buffer_size
    self.cycle_length = cycle_length
    self.prefetch = prefetch
    self.masker = None
    self.unmask = bool(unmask)
    if dynamic_masking and unmask:
      raise ValueError("dynamic_masking and unmask exclude each other (unmask reads no masks)")
    if dynamic_masking:
      if tokenizer is None:
        raise ValueError(
          "dynamic_masking=True needs the tokenizer of the data (its special ids, "
          "vocabulary and word starts)"
        )
      self.masker = dynamic_masking_lib.DynamicMasker(
        masking.MaskingSpec.from_tokenizer(tokenizer),
        masked_lm_prob,
        max_predictions_per_seq,
        whole_word_mask,
        masking.MaskRates.parse(mask_rates),
      )
    self._state = {"epoch": 0, "position": 0}
    self._iterator = None

  # -- state -------------------------------------------------------------------------------------
  def get_state(self) -> dict:
    """{"epoch", "position"} after the last batch returned (JSON-serialisable)."""
    return dict(self._state)

  def set_state(self, state: dict) -> None:
    """Continues right after the batch at which `state` was taken."""
    try:
      epoch, position = int(state["epoch"]), int(state["position"])
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(
        f"input state must be {{'epoch': int, 'position': int}}, got {state!r}"
      ) from e
    if epoch < 0 or position < 0:
      raise ValueError(f"input state must be non-negative, got {state!r}")
    self._state = {"epoch": epoch, "position": position}
    self._iterator = None

  # -- the stream --------------------------------------------------------------------------------
  def _epoch_records(self, epoch, skip):
    files = tf.constant(self.files)
    if self.shuffle:
      files = tf.random.experimental.stateless_shuffle(
        files, seed=tf.stack([tf.constant(self.seed, tf.int64), epoch])
      )
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
      tf.data.TFRecordDataset,
      cycle_length=min(self.cycle_length, len(self.files)),
      block_length=1,
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=True,
    )
    if self.by_record:
      ds = ds.shard(self.process_count, self.process_index)
    if self.shuffle:
      ds = ds.shuffle(
        self.shuffle_buffer_size, seed=epoch * 1_000_003 + self.seed, reshuffle_each_iteration=False
      )
    ds = ds.enumerate().skip(skip)
    return ds.map(lambda position, record: (epoch, position, record))

  def _parse_batch(self, epoch_B, position_B, records_B):
    """A batch of serialized records -> parsed features and the meta keys."""
    features = tfrecord.parse_batch(records_B, self.max_seq_length, self.max_predictions_per_seq)
    features["_epoch"] = epoch_B
    features["_position"] = position_B
    return features

  def _mask(self, batch: dict) -> dict:
    """A parsed NumPy batch with its masks re-drawn or undone (`dynamic_masking`, `unmask`)."""
    if self.masker is not None:
      # One seed per batch, from its first example (a resumed run restarts at a batch
      # boundary, so it draws the same masks).
      seed = [
        self.seed % 2**64,
        self.process_index,
        int(batch["_epoch"][0]),
        int(batch["_position"][0]),
      ]
      return self.masker(batch, seed)
    if self.unmask:
      return dynamic_masking_lib.unmask(batch)
    return batch

  def _build(self):
    start_epoch = tf.constant(self._state["epoch"], tf.int64)
    start_position = tf.constant(self._state["position"], tf.int64)
    ds = tf.data.Dataset.counter(start=self._state["epoch"]).flat_map(
      lambda e: self._epoch_records(e, tf.where(e == start_epoch, start_position, 0))
    )
    # Batch the serialized records, then parse whole batches (vector ops per batch, batches in
    # parallel over the host's cores, in order); `__next__` masks them.
    ds = ds.batch(self.batch_size, drop_remainder=True)
    ds = ds.map(self._parse_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.prefetch(self.prefetch)
    options = tf.data.Options()
    options.deterministic = True
    return iter(ds.with_options(options))

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self._iterator is None:
      self._iterator = self._build()
    try:
      batch = next(self._iterator)
    except tf.errors.DataLossError as e:
      raise ValueError(
        tfrecord.find_broken_file(self.files)
        or f"corrupt TFRecord data in {self.files}: {e.message}"
      ) from None
    except tf.errors.InvalidArgumentError as e:
      broken = tfrecord.find_broken_file(self.files)
      raise ValueError(
        broken
        or (
          f"records of {self.files} do not match the pre-training schema with max_seq_length="
          f"{self.max_seq_length}, max_predictions_per_seq={self.max_predictions_per_seq}: "
          f"{e.message}"
        )
      ) from None
    try:
      batch = self._mask({k: v.numpy() for k, v in batch.items()})
    except ValueError as e:
      raise ValueError(f"records of {self.files}: {e}") from None
    self._state = {"epoch": int(batch["_epoch"][-1]), "position": int(batch["_position"][-1]) + 1}
    return {k: v for k, v in batch.items() if k not in _META_KEYS}


def eval_batches(
  file_patterns,
  batch_size: int,
  max_seq_length: int,
  max_predictions_per_seq: int,
  *,
  process_index: int | None = None,
  process_count: int | None = None,
  unmask: bool = False,
):
  """Held-out data: one pass in a fixed order, the last batch padded to `batch_size`.

  Hosts split the records (record i goes to host i % process_count), so their batch counts
  differ by at most one. Each batch has an extra key `example_weights` (float32 [b]): 1 for real
  examples, 0 for padding (whose masked_lm_weights are also 0). `unmask`: as PretrainInput's
  (original tokens, masked_lm_* all zero).
  """
  process_index, process_count = _host(process_index, process_count)
  files = corpus.expand_patterns(file_patterns)
  ds = tf.data.TFRecordDataset(files).shard(process_count, process_index)
  ds = ds.batch(batch_size).map(
    lambda r: tfrecord.parse_batch(r, max_seq_length, max_predictions_per_seq)
  )
  iterator = iter(ds.prefetch(2))
  while True:
    try:
      batch = next(iterator)
    except StopIteration:
      return
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
      raise ValueError(
        tfrecord.find_broken_file(files) or f"{files}: unreadable pre-training records: {e.message}"
      ) from None
    batch = {k: v.numpy() for k, v in batch.items()}
    if unmask:
      try:
        batch = dynamic_masking_lib.unmask(batch)
      except ValueError as e:
        raise ValueError(f"records of {files}: {e}") from None
    n = batch["input_ids"].shape[0]
    weights = np.ones([batch_size], np.float32)
    if n < batch_size:
      weights[n:] = 0
      batch = {
        k: np.concatenate([v, np.zeros((batch_size - n,) + v.shape[1:], v.dtype)])
        for k, v in batch.items()
      }
    batch["example_weights"] = weights
    yield batch


def log_input(inp: PretrainInput) -> None:
  logging.info(
    "pre-training input: host %d/%d reads %d files (%s split), batch %d, seed %d%s",
    inp.process_index,
    inp.process_count,
    len(inp.files),
    "record" if inp.by_record else "file",
    inp.batch_size,
    inp.seed,
    ", dynamic masking" if inp.masker is not None else ", unmasked" if inp.unmask else "",
  )
