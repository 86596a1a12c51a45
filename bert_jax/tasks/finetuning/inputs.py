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
``prediction_axes``; the batches are planned and run by ``bert_jax.tasks.inference.batches``
(``InferenceBatches`` over the run's mesh), as the inference tools' are. With bucketing on, the rows are visited shortest first (a stable sort on
each row's needed length, the same on every process), so each batch holds rows of similar
length and is cut as short as they allow; the outputs come back in the split's order. A split
smaller than ``eval_batch_size`` runs in one batch of its rows rounded up to the data-parallel
size (``split_batch_size``; logged once per split), not one padded to ``eval_batch_size``. A
pass logs its progress (batches done, rate, ETA) at least every 30 s while it runs
(``bert_jax.train.progress.Progress``).

Packing (``config.packing.enabled``; GLUE and NER). A ``Packer`` puts several rows, each its own
``[CLS] ... [SEP]`` sequence, into one row of ``max_seq_length``: best-fit decreasing
(``place_sequences``), at most ``config.packing.max_sequences_per_row`` a row, with restarting
``position_ids``, ``sequence_ids`` that keep attention inside each sequence, ``cls_positions``
and per-slot ``sequence_weights`` (the layout: ``Packer``). A training step packs exactly the
rows it would feed unpacked (the same permutation; with gradient accumulation, each
micro-batch's rows on their own), so the loss is the unpacked one over the same rows; the
packed row count is rounded by ``packed_rows`` (at most 8 counts a run, so few compiled steps).
Evaluation packs the whole split, runs the packed rows in batches of ``eval_batch_size`` and
unpacks the outputs into the split's order (``Packer.unpack``), so ``task.evaluate`` sees what
it sees unpacked. Length buckets are not used for packed batches.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from absl import logging

from bert_jax import parallel
from bert_jax.tasks.base import SplitData, Task
from bert_jax.tasks.finetuning.length_buckets import MASK_KEY, LengthBucketer, parse_buckets
from bert_jax.tasks.inference.batches import InferenceBatches
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
# The arrays a packed batch adds: the model's packing inputs and the weight of each sequence slot.
PACKED_MODEL_KEYS = ("position_ids", "sequence_ids", "cls_positions")
SEQUENCE_WEIGHTS = "sequence_weights"


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where each packed sequence goes: its row, slot (0..S-1) and first position in that row."""

  row_N: np.ndarray
  slot_N: np.ndarray
  offset_N: np.ndarray
  length_N: np.ndarray
  num_rows: int


def place_sequences(length_N: np.ndarray, row_length: int, max_sequences: int) -> Placement:
  """Best-fit decreasing: the longest sequence first (ties in input order), each into the row
  with the least room that still holds it and has a free slot, else a new row. Deterministic:
  the same lengths in the same order always give the same placement."""
  length_N = np.asarray(length_N, np.int64)
  n = length_N.size
  if n and (length_N.min() < 1 or length_N.max() > row_length):
    raise ValueError(
      f"a sequence of {int(length_N.max() if length_N.max() > row_length else length_N.min())}"
      f" tokens cannot be packed into rows of config.max_seq_length={row_length}"
    )
  row_N, slot_N, offset_N = (np.zeros(n, np.int64) for _ in range(3))
  # by_room[c]: rows with exactly c positions left and a free slot (last opened on top).
  by_room: list[list[int]] = [[] for _ in range(row_length + 1)]
  used_R: list[int] = []  # positions used per row
  count_R: list[int] = []  # sequences per row
  for i in np.argsort(-length_N, kind="stable"):
    need = int(length_N[i])
    room = next((c for c in range(need, row_length + 1) if by_room[c]), None)
    if room is None:
      r = len(used_R)
      used_R.append(0), count_R.append(0)
    else:
      r = by_room[room].pop()
    row_N[i], slot_N[i], offset_N[i] = r, count_R[r], used_R[r]
    used_R[r] += need
    count_R[r] += 1
    if count_R[r] < max_sequences and used_R[r] < row_length:
      by_room[row_length - used_R[r]].append(r)
  return Placement(row_N, slot_N, offset_N, length_N, len(used_R))


@dataclasses.dataclass(frozen=True)
class Packer:
  """Packs rows of a split, each one sequence ``[CLS] ... [SEP]`` padded to ``row_length``,
  several to a row (``config.packing.enabled``).

  A packed batch of R rows holds: ``input_mask`` (1 on every packed token), the arrays of
  ``token_keys`` (input ids, token types, NER's per-token labels and weights) moved with their
  tokens, ``position_ids`` restarting at 0 in each sequence, ``sequence_ids`` (0 padding, 1..S
  the sequence's slot + 1), ``cls_positions`` [R, S] (where each sequence's [CLS] is; 0 for an
  empty slot), ``sequence_weights`` [R, S] (1 for a sequence, 0 for an empty slot), and every
  other array of the split (per sequence: GLUE's ``label``) as [R, S, ...], 0 in empty slots.
  """

  row_length: int
  max_sequences: int
  token_keys: tuple[str, ...]

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

  def lengths(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Each row's sequence length (its ``input_mask`` is 1 on a prefix)."""
    return arrays[MASK_KEY].sum(axis=1).astype(np.int64)

  def place(self, length_N: np.ndarray) -> Placement:
    return place_sequences(length_N, self.row_length, self.max_sequences)

  def pack(
    self, arrays: dict[str, np.ndarray], idx: np.ndarray, placement: Placement, num_rows: int
  ) -> dict[str, np.ndarray]:
    """Rows ``idx`` of ``arrays`` (placed by ``placement``, in idx's order) as ``num_rows``
    packed rows (rows past ``placement.num_rows`` stay empty)."""
    R, L, S = num_rows, self.row_length, self.max_sequences
    if placement.num_rows > R:
      raise ValueError(f"{placement.num_rows} packed rows do not fit a batch of {R}")
    out = {MASK_KEY: np.zeros((R, L), np.int32)}
    for k in self.token_keys:
      out[k] = np.zeros((R, L), arrays[k].dtype)
    out["position_ids"] = np.zeros((R, L), np.int32)
    out["sequence_ids"] = np.zeros((R, L), np.int32)
    out["cls_positions"] = np.zeros((R, S), np.int32)
    out[SEQUENCE_WEIGHTS] = np.zeros((R, S), np.float32)
    per_sequence = [k for k in arrays if k != MASK_KEY and k not in self.token_keys]
    for k in per_sequence:
      out[k] = np.zeros((R, S) + arrays[k].shape[1:], arrays[k].dtype)
    r_N, s_N, o_N, n_N = placement.row_N, placement.slot_N, placement.offset_N, placement.length_N
    for j, i in enumerate(idx):
      r, s, o, n = int(r_N[j]), int(s_N[j]), int(o_N[j]), int(n_N[j])
      for k in self.token_keys:
        out[k][r, o : o + n] = arrays[k][i, :n]
      out[MASK_KEY][r, o : o + n] = 1
      out["position_ids"][r, o : o + n] = np.arange(n)
      out["sequence_ids"][r, o : o + n] = s + 1
      out["cls_positions"][r, s] = o
      out[SEQUENCE_WEIGHTS][r, s] = 1.0
    if len(idx):
      rows, slots = r_N[: len(idx)], s_N[: len(idx)]
      for k in per_sequence:
        out[k][rows, slots] = arrays[k][idx]
    return out

  def unpack(
    self, outputs: dict[str, np.ndarray], placement: Placement, token_outputs: Mapping[str, int]
  ) -> dict[str, np.ndarray]:
    """Per-sequence outputs (in the placed order) from packed ones: the keys of
    ``token_outputs`` (a length axis 1, e.g. NER's label ids) are cut from each sequence's
    positions back to [N, row_length] (padded like ``LengthBucketer.pad``); the rest are
    [R, S, ...] and taken at each sequence's slot."""
    result = {}
    r_N, s_N, o_N, n_N = placement.row_N, placement.slot_N, placement.offset_N, placement.length_N
    for key, x in outputs.items():
      if key in token_outputs:
        fill = np.finfo(x.dtype).min if np.issubdtype(x.dtype, np.floating) else 0
        y = np.full((len(r_N), self.row_length) + x.shape[2:], fill, x.dtype)
        for j in range(len(r_N)):
          r, o, n = int(r_N[j]), int(o_N[j]), int(n_N[j])
          y[j, :n] = x[r, o : o + n]
        result[key] = y
      else:
        result[key] = x[r_N, s_N]
    return result

  def batch_spec(self, spec: Mapping[str, jax.ShapeDtypeStruct]) -> dict:
    """A packed batch's shapes from the unpacked ``spec`` of the same number of rows."""
    out = {}
    for k, v in spec.items():
      if k == MASK_KEY or k in self.token_keys:
        out[k] = v
      else:  # one per sequence slot
        out[k] = jax.ShapeDtypeStruct((v.shape[0], self.max_sequences) + v.shape[1:], v.dtype)
    b, L, S = spec[MASK_KEY].shape[0], spec[MASK_KEY].shape[1], self.max_sequences
    out["position_ids"] = jax.ShapeDtypeStruct((b, L), np.int32)
    out["sequence_ids"] = jax.ShapeDtypeStruct((b, L), np.int32)
    out["cls_positions"] = jax.ShapeDtypeStruct((b, S), np.int32)
    out[SEQUENCE_WEIGHTS] = jax.ShapeDtypeStruct((b, S), np.float32)
    return out


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
