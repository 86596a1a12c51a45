"""Fine-tuning batches: the training input (resumable, length-bucketed or packed) and the
evaluation pass.

Training. ``FinetuneInput`` yields this process's rows of each global batch. The rows of step
``s`` are ``perm[k*B:(k+1)*B]`` with ``(epoch, k) = divmod(s, steps_per_epoch)`` and ``perm`` a
permutation seeded by ``(seed, epoch)``; the remainder of an epoch is dropped. So a step's
batch depends only on the step, and ``get_state()`` (``{"step": s}``, saved with every
checkpoint) is all a resumed run needs to see exactly the batches of the uninterrupted one.
With length bucketing the cut length is a function of the step's rows too, so resume stays
exact. The length is decided from the *global* batch (every process holds the whole split), so
all processes cut to the same shape.

Evaluation. ``Predictor`` runs ``task.predict`` over every row of a split in global batches of
``eval_batch_size`` (the last one padded with copies of its first row, whose outputs are
dropped), each cut to its bucket and padded back to ``max_seq_length`` on the task's
``prediction_axes``; the batches are planned and run by ``bert_jax.data.inference_batches``
(``InferenceBatches`` over the run's mesh), as the inference tools' are. With bucketing on, the rows are visited shortest first (a stable sort on
each row's needed length, the same on every process), so each batch holds rows of similar
length and is cut as short as they allow; the outputs come back in the split's order. A split
smaller than ``eval_batch_size`` runs in one batch of its rows rounded up to the data-parallel
size (``split_batch_size``; logged once per split), not one padded to ``eval_batch_size``. A
pass logs its progress (batches done, rate, ETA) at least every 30 s while it runs
(``bert_jax.train.progress.Progress``).

Packing (``config.packing.enabled``; GLUE and NER). A ``Packer`` (``bert_jax.data.packing``:
the packed-row layout every task shares and its best-fit packer; ``Packer.for_task`` here)
puts several rows, each its own ``[CLS] ... [SEP]`` sequence, into one row of
``max_seq_length``: best-fit decreasing, at most ``config.packing.max_sequences_per_row`` a
row, with restarting ``position_ids``, ``sequence_ids`` that keep attention inside each
sequence, ``cls_positions`` and per-slot ``sequence_weights``. A training step packs exactly the
rows it would feed unpacked (the same permutation; with gradient accumulation, each
micro-batch's rows on their own), so the loss is the unpacked one over the same rows; the
packed row count is rounded by ``packed_rows`` (at most 8 counts a run, so few compiled steps).
Evaluation packs the whole split, runs the packed rows in batches of ``eval_batch_size`` and
unpacks the outputs into the split's order (``Packer.unpack``), so ``task.evaluate`` sees what
it sees unpacked. Length buckets are not used for packed batches.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from absl import logging

from bert_jax import parallel
from bert_jax.data import packing
from bert_jax.data.inference_batches import InferenceBatches
from bert_jax.data.length_buckets import MASK_KEY, LengthBucketer, parse_buckets
from bert_jax.tasks.base import SplitData, Task
from bert_jax.train.progress import INTERVAL_SEC, Progress
from bert_jax.train.train_step import jit_eval_step


def make_bucketer(task: Task, config: Any) -> LengthBucketer:
  """The run's bucketer from ``config.length_buckets`` and the task's declared axes."""
  return LengthBucketer(
    parse_buckets(config.length_buckets, int(config.max_seq_length)),
    task.sequence_axes,
    tuple(task.position_keys),
  )


# --- packing -----------------------------------------------------------------------------------
class Packer(packing.Packer):
  """``bert_jax.data.packing.Packer`` (best fit, the one packed-row layout), made from a task's
  declared axes and the run's config by ``for_task``."""

  @classmethod
  def for_task(cls, task: Task, config: Any) -> Packer:
    """The run's packer (``config.packing.enabled``); ValueError naming the key where the task or the
    run cannot be packed."""
    s = int(config.packing.max_sequences_per_row)
    if s < 1:
      raise ValueError(f"config.packing.max_sequences_per_row must be at least 1, got {s}")
    reason = task.packing_unsupported()
    if reason:
      raise ValueError(f"config.packing.enabled=True: {reason}")
    keys = tuple(k for k in task.sequence_axes if k != MASK_KEY)
    bad = {k: a for k, a in task.sequence_axes.items() if a != 1}
    if bad:
      raise ValueError(
        f"config.packing.enabled=True: task {task.name!r} has length axes {bad}, not 1"
      )
    return cls(int(config.max_seq_length), s, keys)


def packed_rows(needed: int, cap: int, granule: int) -> int:
  """A step's packed row count: ``needed`` rounded up to a multiple of ``granule`` x
  ceil(cap / granule / 8), so a run compiles its step for at most 8 row counts, and at most
  ``cap`` rounded up to ``granule``."""
  cap_units = max(1, -(-cap // granule))
  quantum = -(-cap_units // 8)
  units = -(-max(1, -(-needed // granule)) // quantum) * quantum
  return granule * min(cap_units, units)


def split_batch_size(batch_size: int, num_rows: int, mesh) -> int:
  """The global batch a split of ``num_rows`` rows is evaluated in: ``batch_size``, or fewer
  where the split is smaller: its rows rounded up to a multiple of the data-parallel size and
  the process count (which divide ``batch_size`` too), so a small split is not padded to a huge
  ``eval_batch_size``."""
  step = math.lcm(parallel.data_parallel_size(mesh), jax.process_count())
  return min(batch_size, max(step, -(-num_rows // step) * step))


def _host_share(idx: np.ndarray, batch_size: int) -> np.ndarray:
  hb = parallel.host_batch_size(batch_size)
  return idx[jax.process_index() * hb : (jax.process_index() + 1) * hb]


def _bucketed_need(data: SplitData, bucketer: LengthBucketer | None) -> np.ndarray | None:
  """Each row's needed length (once per split), or None when bucketing is off. A batch's cut is
  ``bucketer.bucket_for(need_N[global rows].max())``, equal to ``length_of`` on those rows."""
  if bucketer is None or not bucketer.enabled:
    return None
  return np.maximum(bucketer.row_lengths(data.arrays), 1)


class FinetuneInput:
  """The training rows as an iterator of this host's batches, with get_state/set_state."""

  def __init__(
    self,
    data: SplitData,
    per_epoch: int,
    batch_size: int,
    seed: int,
    bucketer: LengthBucketer | None = None,
    packer: Packer | None = None,
    grad_accum_steps: int = 1,
    row_granule: int = 1,
  ):
    """``packer``: pack each step's rows (``bucketer`` is then not used); the rows of
    micro-batch j (``grad_accum_steps``) are packed on their own into packed rows i*k+j, so
    each micro-batch holds the same sequences as unpacked; ``row_granule`` (the data-parallel
    size and the process count divide it) rounds a step's packed row count (``packed_rows``)."""
    self.data, self.per_epoch, self.batch_size, self.seed = data, per_epoch, batch_size, seed
    self.bucketer = bucketer
    self.packer, self.grad_accum_steps, self.row_granule = packer, grad_accum_steps, row_granule
    self._need_N = None if packer is not None else _bucketed_need(data, bucketer)
    self._length_N = packer.lengths(data.arrays) if packer is not None else None
    self.step = 0
    self._perm_epoch, self._perm = -1, np.zeros((0,), np.int64)

  def __iter__(self):
    return self

  def global_rows(self, step: int) -> np.ndarray:
    """Indices into the split of the global batch of ``step``."""
    epoch, k = divmod(step, self.per_epoch)
    if epoch != self._perm_epoch:  # one permutation per epoch, not per step
      self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.data.num_rows)
      self._perm_epoch = epoch
    return self._perm[k * self.batch_size : (k + 1) * self.batch_size]

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """This process's rows of the global batch of ``step``, cut to the step's bucket (or
    packed)."""
    idx = self.global_rows(step)
    if self.packer is not None:
      return self._packed(idx)
    host = {key: v[_host_share(idx, self.batch_size)] for key, v in self.data.arrays.items()}
    if self._need_N is None:
      return host
    return self.bucketer.cut(host, self.bucketer.bucket_for(int(self._need_N[idx].max())))

  def _packed(self, idx: np.ndarray) -> dict[str, np.ndarray]:
    k = max(1, self.grad_accum_steps)
    micro = [idx[j::k] for j in range(k)]
    placements = [self.packer.place(self._length_N[m]) for m in micro]
    rows = packed_rows(max(p.num_rows for p in placements), self.batch_size // k, self.row_granule)
    packed = [self.packer.pack(self.data.arrays, m, p, rows) for m, p in zip(micro, placements)]
    # Row i of micro-batch j is global row i*k+j (train_step's split).
    full = {key: np.stack([p[key] for p in packed], axis=1) for key in packed[0]}
    full = {key: v.reshape((rows * k,) + v.shape[2:]) for key, v in full.items()}
    hb = parallel.host_batch_size(rows * k)
    p = jax.process_index()
    return {key: v[p * hb : (p + 1) * hb] for key, v in full.items()}

  def __next__(self) -> dict[str, np.ndarray]:
    batch = self.batch(self.step)
    self.step += 1
    return batch

  def get_state(self) -> dict:
    return {"step": self.step}

  def set_state(self, state: dict) -> None:
    self.step = int(state["step"])


class Predictor:
  """Runs ``task.predict`` over every row of a split in padded, bucketed global batches."""

  def __init__(
    self,
    task: Task,
    model,
    mesh,
    rules,
    batch_size: int,
    bucketer: LengthBucketer | None = None,
    max_seq_length: int = 0,
    step=None,
    packer: Packer | None = None,
  ):
    """``step``: the jitted ``(params, batch) -> task.predict(outputs)`` that runs under the
    mesh (the trainer's evaluation step); None jits one here. ``packer``: the split's rows are
    packed (``Packer``; the bucketer is then not used) and the outputs unpacked into the
    split's order."""
    self.mesh, self.rules, self.batch_size = mesh, rules, batch_size
    self.packer = packer
    self.bucketer, self.max_seq_length = bucketer, max_seq_length
    self.prediction_axes = dict(task.prediction_axes)
    if step is None:
      fn = lambda params, batch: task.predict(task.apply(model, params, batch, True))
      step = jit_eval_step(fn, mesh, rules)
    self._step = step
    self.progress_interval_sec = INTERVAL_SEC
    self._small_splits: set[str] = set()  # splits already logged as run in a smaller batch
    self._packed_splits: set[str] = set()  # splits whose packing was logged

  def __call__(self, params, data: SplitData, what: str = "") -> dict[str, np.ndarray]:
    """The task's predictions for every row of ``data``; progress is logged as ``what``
    (default "predicting <split>")."""
    if self.packer is not None:
      return self._packed(params, data, what)
    n = data.num_rows
    b = split_batch_size(self.batch_size, n, self.mesh)
    if b < self.batch_size and data.split not in self._small_splits:
      self._small_splits.add(data.split)
      logging.info(
        "%s: %d rows, fewer than eval_batch_size=%d: one batch of %d",
        data.split,
        n,
        self.batch_size,
        b,
      )
    need_N = _bucketed_need(data, self.bucketer)
    bucketed = need_N is not None

    def make(index, length):
      rows = {k: v[index] for k, v in data.arrays.items()}
      return self.bucketer.cut(rows, length) if bucketed else rows

    def finish(out):
      if bucketed:
        return LengthBucketer.pad(out, self.prediction_axes, self.max_seq_length)
      return out

    progress = Progress(
      what or f"predicting {data.split}",
      total=-(-n // b),
      unit="batches",
      interval_sec=self.progress_interval_sec,
    )
    batches = self._batches(self.bucketer.buckets if bucketed else None)
    with progress:
      result = batches.run_in_order(
        self._step,
        params,
        need_N if bucketed else np.zeros(n, np.int64),  # unbucketed: the split's order
        make,
        b,
        finish,
        on_batch=lambda _: progress.update(),
      )
    return {} if result is None else result

  def _batches(self, buckets: tuple[int, ...] | None) -> InferenceBatches:
    """The planner of this predictor's batches (shortest first, the last padded with copies of
    its first row) over its mesh, cut to ``buckets`` (None: no cut)."""
    return InferenceBatches(
      self.batch_size, buckets or (max(1, self.max_seq_length),), mesh=self.mesh, rules=self.rules
    )

  def _packed(self, params, data: SplitData, what: str) -> dict[str, np.ndarray]:
    """Every row of ``data`` packed (``Packer.place`` over the whole split), run in batches of
    packed rows, and unpacked back to the split's order."""
    n = data.num_rows
    if n == 0:
      return {}
    placement = self.packer.place(self.packer.lengths(data.arrays))
    packed = self.packer.pack(data.arrays, np.arange(n), placement, placement.num_rows)
    num_rows = placement.num_rows
    b = split_batch_size(self.batch_size, num_rows, self.mesh)
    if data.split not in self._packed_splits:  # once per split
      self._packed_splits.add(data.split)
      logging.info("%s: %d rows packed into %d, batches of %d", data.split, n, num_rows, b)
    progress = Progress(
      what or f"predicting {data.split}",
      total=-(-num_rows // b),
      unit="batches",
      interval_sec=self.progress_interval_sec,
    )
    with progress:
      outputs = self._batches(None).run_in_order(
        self._step,
        params,
        np.zeros(num_rows, np.int64),  # packed rows in their order
        lambda index, _: {k: v[index] for k, v in packed.items()},
        b,
        on_batch=lambda _: progress.update(),
      )
    return self.packer.unpack(outputs, placement, self.prediction_axes)
