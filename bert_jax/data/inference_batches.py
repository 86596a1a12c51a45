"""Bucketed, sharded batches for inference: rows of varying length through one jitted function.

  batches = InferenceBatches(batch_size=32, buckets=parse_buckets("32", 128))  # local devices
  params = batches.replicate(params)
  for batch, out in batches.run(jitted, params, lengths_N, make):
    ...                       # out: fn's outputs (numpy) for rows batch.rows (then padding)
  out_N = batches.run_in_order(jitted, params, lengths_N, make)   # fixed-shape outputs

The rows are visited shortest first (a stable sort on ``lengths``) in consecutive batches of
``batch_size``; a batch's sequence arrays are cut to the smallest bucket that holds its longest
row (``buckets`` come from ``bert_jax.data.length_buckets.parse_buckets``, the parser of
fine-tuning's ``config.length_buckets``); the last batch is padded to ``batch_size`` with
copies of its first row, whose outputs are dropped. ``make(index, length)`` builds a batch: a
dict of arrays with ``len(index)`` rows, its sequence arrays ``length`` long. So a run compiles
``fn`` once per bucket it uses, whatever the rows. Each batch is dispatched before the previous one's outputs are fetched, so the device
does not wait on the host.

The mesh is built by ``bert_jax.parallel.create_mesh`` (``data`` = every
device given, default this host's local devices); params are replicated and each batch is
split over ``data`` x ``fsdp`` (``parallel.make_global_batch``, or one device_put where the mesh
is this process's devices of a multi-process run), so ``batch_size`` is rounded up to a
multiple of the data-parallel size. A caller may pass its own ``mesh`` and ``rules`` instead
(a mesh across processes: each process builds only its share of every batch).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import parallel

# Batches split over data x fsdp, as configs/common.py's logical_axis_rules split them.
DATA_PARALLEL_RULES: parallel.sharding.Rules = (("batch", ("data", "fsdp")),)

Make = Callable[[np.ndarray, int], Mapping[str, np.ndarray]]


def data_parallel_mesh(devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """The mesh with ``data`` over ``devices`` (default: this host's local devices). Meshes over
  the same devices are equal, so jitted functions compiled for one serve the next."""
  return parallel.create_mesh(
    {"data": -1}, list(jax.local_devices() if devices is None else devices)
  )


@dataclasses.dataclass(frozen=True)
class Batch:
  """One batch of a plan: ``rows`` (indices into the input, shortest first), ``index`` (rows
  padded to the batch size with copies of the first) and its bucket ``length``."""

  rows: np.ndarray
  index: np.ndarray
  length: int


def pad_ragged(seqs: Sequence[Sequence[int]], index: np.ndarray, length: int) -> np.ndarray:
  """int32 [len(index), length]: row r holds ``seqs[index[r]]``, zeros after it."""
  out = np.zeros((len(index), length), np.int32)
  for r, i in enumerate(index):
    out[r, : len(seqs[i])] = seqs[i]
  return out


class InferenceBatches:
  """Plans bucketed batches of rows and runs a jitted function over them (module docstring)."""

  def __init__(
    self,
    batch_size: int,
    buckets: Sequence[int],
    devices: Sequence[jax.Device] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    rules: parallel.sharding.Rules = DATA_PARALLEL_RULES,
  ):
    buckets = tuple(int(b) for b in buckets)
    if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
      raise ValueError(f"buckets must be ascending positive lengths, got {buckets}")
    if batch_size < 1:
      raise ValueError(f"batch_size must be positive, got {batch_size}")
    self.buckets = buckets
    self.mesh = data_parallel_mesh(devices) if mesh is None else mesh
    self.rules = rules
    self.granule = parallel.data_parallel_size(self.mesh)
    self.batch_size = -(-batch_size // self.granule) * self.granule
    self._replicated = NamedSharding(self.mesh, PartitionSpec())
    here = jax.process_index()
    self._local_only = jax.process_count() > 1 and all(
      d.process_index == here for d in self.mesh.devices.flat
    )
    self._used: set[tuple[int, int]] = set()  # (id of fn, length) already run

  def bucket(self, length: int) -> int:
    """The smallest bucket holding ``length`` tokens; ValueError past the longest."""
    for b in self.buckets:
      if b >= length:
        return b
    raise ValueError(f"a row of {length} tokens is longer than the longest bucket {self.buckets}")

  def plan(self, lengths: Sequence[int], batch_size: int | None = None) -> list[Batch]:
    """The batches for rows of ``lengths`` (module docstring); ``batch_size`` (a multiple of
    the data-parallel size) overrides the object's."""
    b = batch_size or self.batch_size
    if b % self.granule:
      raise ValueError(f"batch size {b} is not a multiple of the data-parallel size {self.granule}")
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    order = np.argsort(lengths, kind="stable")
    out = []
    for start in range(0, order.size, b):
      rows = order[start : start + b]
      index = np.concatenate([rows, np.full(b - rows.size, rows[0], rows.dtype)])
      out.append(Batch(rows, index, self.bucket(int(lengths[rows].max()))))
    return out

  def replicate(self, tree: Any) -> Any:
    """``tree`` on every device of the mesh (params: once, not with every batch)."""
    return jax.device_put(tree, self._replicated)

  def shard(self, make: Make, index: np.ndarray, length: int) -> dict[str, jax.Array]:
    """The batch ``make`` builds for ``index``, split over the mesh's data-parallel axes (a
    mesh across processes: this process builds and puts only its share of the rows)."""
    if self._local_only:
      batch = {k: np.asarray(v) for k, v in make(index, length).items()}
      return {
        k: jax.device_put(v, NamedSharding(self.mesh, parallel.batch_spec(v.ndim, self.rules)))
        for k, v in batch.items()
      }
    share = parallel.host_batch_size(len(index))
    p = jax.process_index()
    batch = make(index[p * share : (p + 1) * share], length)
    return parallel.make_global_batch(batch, self.mesh, self.rules)

  def run(
    self,
    fn: Callable[[Any, dict[str, jax.Array]], Any],
    params: Any,
    lengths: Sequence[int],
    make: Make,
    batch_size: int | None = None,
    compiling: Callable[[int], contextlib.AbstractContextManager] | None = None,
  ) -> Iterator[tuple[Batch, Any]]:
    """Yields (batch, ``fn(params, batch arrays)`` as numpy) for each batch of ``plan(lengths,
    batch_size)``, shortest first. ``compiling(length)`` wraps the first call of ``fn`` at each
    length this object has not run it at (a heartbeat while it compiles)."""
    pending = None
    for batch in [*self.plan(lengths, batch_size), None]:
      dispatched = None
      if batch is not None:
        arrays = self.shard(make, batch.index, batch.length)
        key = (id(fn), batch.length)
        first = compiling is not None and key not in self._used
        with compiling(batch.length) if first else contextlib.nullcontext():
          dispatched = (batch, fn(params, arrays))
        self._used.add(key)
      if pending is not None:
        yield pending[0], jax.tree_util.tree_map(_fetch, pending[1])
      pending = dispatched

  def run_in_order(
    self,
    fn: Callable[[Any, dict[str, jax.Array]], Any],
    params: Any,
    lengths: Sequence[int],
    make: Make,
    batch_size: int | None = None,
    finish: Callable[[Any], Any] | None = None,
    on_batch: Callable[[Batch], None] | None = None,
    compiling: Callable[[int], contextlib.AbstractContextManager] | None = None,
  ) -> Any:
    """``fn``'s outputs (a pytree of arrays with a leading row axis, the same shape from every
    batch, after ``finish``) for every row, in the input order (None for no rows); ``on_batch``
    is called after each batch (progress); ``compiling`` as in ``run``."""
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    outs, order = [], []
    for batch, out in self.run(fn, params, lengths, make, batch_size, compiling):
      out = finish(out) if finish is not None else out
      outs.append(jax.tree_util.tree_map(lambda x, n=batch.rows.size: x[:n], out))
      order.append(batch.rows)
      if on_batch is not None:
        on_batch(batch)
    if not outs:
      return None
    rows = np.concatenate(order)

    def restore(*parts):
      in_plan = np.concatenate(parts)
      result = np.empty_like(in_plan)
      result[rows] = in_plan
      return result

    return jax.tree_util.tree_map(restore, *outs)


def _fetch(x: Any) -> np.ndarray:
  """A jitted output on the host: the first device's copy of a replicated one (or of one that
  spans processes), else the whole array."""
  if isinstance(x, jax.Array) and (x.sharding.is_fully_replicated or not x.is_fully_addressable):
    return np.asarray(x.addressable_data(0))
  return np.asarray(x)
