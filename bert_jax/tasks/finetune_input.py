"""Fine-tuning batches: the training input (resumable, length-bucketed) and the evaluation pass.

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
``prediction_axes``. With bucketing on, the rows are visited shortest first (a stable sort on
each row's needed length, the same on every process), so each batch holds rows of similar
length and is cut as short as they allow; the outputs come back in the split's order. A split
smaller than ``eval_batch_size`` runs in one batch of its rows rounded up to the data-parallel
size (``split_batch_size``; logged once per split), not one padded to ``eval_batch_size``. A
pass logs its progress (batches done, rate, ETA) at least every 30 s while it runs
(``bert_jax.train.progress.Progress``).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from absl import logging

from bert_jax import parallel
from bert_jax.tasks.base import SplitData, Task
from bert_jax.tasks.length_buckets import LengthBucketer, parse_buckets
from bert_jax.train.progress import INTERVAL_SEC, Progress
from bert_jax.train.train_step import jit_eval_step


def make_bucketer(task: Task, config: Any) -> LengthBucketer:
  """The run's bucketer from ``config.length_buckets`` and the task's declared axes."""
  return LengthBucketer(
    parse_buckets(config.length_buckets, int(config.max_seq_length)),
    task.sequence_axes,
    tuple(task.position_keys),
  )


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
  ):
    self.data, self.per_epoch, self.batch_size, self.seed = data, per_epoch, batch_size, seed
    self.bucketer = bucketer
    self._need_N = _bucketed_need(data, bucketer)
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
    """This process's rows of the global batch of ``step``, cut to the step's bucket."""
    idx = self.global_rows(step)
    host = {key: v[_host_share(idx, self.batch_size)] for key, v in self.data.arrays.items()}
    if self._need_N is None:
      return host
    return self.bucketer.cut(host, self.bucketer.bucket_for(int(self._need_N[idx].max())))

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
  ):
    """``step``: the jitted ``(params, batch) -> task.predict(outputs)`` that runs under the
    mesh (the trainer's evaluation step); None jits one here."""
    self.mesh, self.rules, self.batch_size = mesh, rules, batch_size
    self.bucketer, self.max_seq_length = bucketer, max_seq_length
    self.prediction_axes = dict(task.prediction_axes)
    if step is None:
      fn = lambda params, batch: task.predict(task.apply(model, params, batch, True))
      step = jit_eval_step(fn, mesh, rules)
    self._step = step
    self.progress_interval_sec = INTERVAL_SEC
    self._small_splits: set[str] = set()  # splits already logged as run in a smaller batch

  def __call__(self, params, data: SplitData, what: str = "") -> dict[str, np.ndarray]:
    """The task's predictions for every row of ``data``; progress is logged as ``what``
    (default "predicting <split>")."""
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
    order = np.argsort(need_N, kind="stable") if bucketed else np.arange(n)
    outs = []
    progress = Progress(
      what or f"predicting {data.split}",
      total=-(-n // b),
      unit="batches",
      interval_sec=self.progress_interval_sec,
    )
    with progress:
      for start in range(0, n, b):
        idx = order[start : start + b]
        idx = np.concatenate([idx, np.full(b - idx.size, idx[0], idx.dtype)])
        rows = {k: v[_host_share(idx, b)] for k, v in data.arrays.items()}
        if bucketed:
          rows = self.bucketer.cut(rows, self.bucketer.bucket_for(int(need_N[idx].max())))
        out = self._step(params, parallel.make_global_batch(rows, self.mesh, self.rules))
        out = {k: np.asarray(v.addressable_data(0)) for k, v in out.items()}
        if bucketed:
          out = LengthBucketer.pad(out, self.prediction_axes, self.max_seq_length)
        outs.append(out)
        progress.update()
    if not outs:
      return {}
    result = {}
    for k in outs[0]:
      in_order = np.concatenate([o[k] for o in outs])[:n]
      result[k] = np.empty_like(in_order)
      result[k][order] = in_order
    return result
