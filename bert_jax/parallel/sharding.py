"""Shardings from logical axis names, and global batches assembled from per-host data.

The model names each parameter dimension (vocab, embed, mlp, heads, kv) and each activation
dimension (batch, length, ...). ``config.logical_axis_rules`` maps those names to mesh axes:

  rules = normalize_rules(config.logical_axis_rules)
  shardings = logical_shardings(abstract_boxed_tree, mesh, rules)   # NamedSharding per leaf
  with mesh_context(mesh, rules):          # activations' with_logical_constraint take effect
    out = jitted_fn(...)
  batch = make_global_batch(host_batch_of_numpy, mesh, rules)

A parameter dimension that its mesh axes do not divide (a 30,522 vocab over tensor=4) is left
unsharded on that dimension, and a log line says so; nothing fails.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax.parallel.mesh import data_parallel_size

Rules = tuple[tuple[str, Any], ...]


def normalize_rules(rules: Sequence[Sequence[Any]]) -> Rules:
  """Config rules (lists or tuples, from a ConfigDict or JSON) as hashable nested tuples."""
  out = []
  for i, rule in enumerate(rules):
    if len(rule) != 2 or not isinstance(rule[0], str):
      raise ValueError(
        f"config.logical_axis_rules[{i}] must be (logical_name, mesh_axes), got {rule!r}"
      )
    axes = rule[1]
    if isinstance(axes, (list, tuple)):
      axes = tuple(axes)
    out.append((rule[0], axes))
  return tuple(out)


@contextlib.contextmanager
def mesh_context(
  mesh: jax.sharding.Mesh, rules: Rules, set_global_mesh: bool = True
) -> Iterator[None]:
  """Makes ``mesh`` and the logical rules current while tracing model code.

  With the global mesh set, the model's activation constraints (``nn.with_logical_constraint``
  on batch/length/embed/heads/mlp) take effect, so XLA keeps activations sharded as the rules
  say instead of inferring it from the params' and batch's shardings alone.
  """
  with contextlib.ExitStack() as stack:
    if set_global_mesh:
      stack.enter_context(jax.set_mesh(mesh))
    stack.enter_context(nn.logical_axis_rules(rules))
    yield


def _axis_size(mesh: jax.sharding.Mesh, axes: Any) -> int:
  if axes is None:
    return 1
  if isinstance(axes, str):
    return mesh.shape[axes]
  return math.prod(mesh.shape[a] for a in axes)


def fit_spec(
  spec: PartitionSpec, shape: Sequence[int], mesh: jax.sharding.Mesh, name: str = ""
) -> PartitionSpec:
  """``spec`` with the mesh axes dropped from any dimension they do not divide evenly."""
  entries = list(spec) + [None] * (len(shape) - len(spec))
  for i, axes in enumerate(entries):
    if axes is not None and shape[i] % _axis_size(mesh, axes):
      logging.info(
        "Leaving dimension %d (size %d) of %s unsharded: mesh axes %s (size %d) do not divide it",
        i,
        shape[i],
        name or "an array",
        axes,
        _axis_size(mesh, axes),
      )
      entries[i] = None
  return PartitionSpec(*entries)


def _drop_masked_boxes(tree: Any) -> Any:
  """The tree with each logical box around an ``optax.MaskedNode`` (the placeholder a parameter
  group's optimizer state holds for another group's parameter) replaced by the bare node."""

  def unbox_masked(x):
    if isinstance(x, nn.meta.AxisMetadata) and isinstance(x.unbox(), optax.MaskedNode):
      return x.unbox()
    return x

  return jax.tree_util.tree_map(
    unbox_masked, tree, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata)
  )


def logical_shardings(abstract_tree: Any, mesh: jax.sharding.Mesh, rules: Rules) -> Any:
  """NamedShardings for a tree whose leaves may be ``nn.Partitioned`` (abstract or concrete).

  The result has the structure of the *unboxed* tree. Leaves without logical names (step
  counters, rng, scalars of optimizer state) are replicated.
  """
  abstract_tree = _drop_masked_boxes(abstract_tree)
  specs = nn.get_partition_spec(abstract_tree)
  mesh_specs = nn.logical_to_mesh(specs, rules)
  unboxed = nn.meta.unbox(abstract_tree)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(unboxed)
  spec_leaves = treedef.flatten_up_to(mesh_specs)
  out = []
  for (path, leaf), spec in zip(leaves, spec_leaves):
    shape = getattr(leaf, "shape", ())
    spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec()
    spec = fit_spec(spec, shape, mesh, jax.tree_util.keystr(path))
    out.append(NamedSharding(mesh, spec))
  return jax.tree_util.tree_unflatten(treedef, out)


def batch_spec(ndim: int, rules: Rules) -> PartitionSpec:
  """The partition spec of a [batch, ...] input array: batch over its rule's mesh axes."""
  return nn.logical_to_mesh_axes(("batch",) + (None,) * (ndim - 1), rules)


def check_batch_size(
  batch_size: int,
  mesh: jax.sharding.Mesh,
  key: str = "train_batch_size",
) -> None:
  """ValueError naming the config ``key`` when the data-parallel size does not divide it."""
  dp = data_parallel_size(mesh)
  if batch_size <= 0 or batch_size % dp:
    raise ValueError(
      f"config.{key}={batch_size} is not divisible by the data-parallel size {dp} "
      f"(mesh data={mesh.shape['data']} x fsdp={mesh.shape['fsdp']})"
    )
  if batch_size % jax.process_count():
    raise ValueError(
      f"config.{key}={batch_size} is not divisible by the number of processes {jax.process_count()}"
    )


def make_global_batch(
  local_batch: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh, rules: Rules
) -> dict[str, jax.Array]:
  """This process's rows of a global batch -> global jax.Arrays sharded along ``batch``.

  Every process passes its own, equally sized share (rows in process order).
  """
  out = {}
  for key, x in local_batch.items():
    x = np.asarray(x)
    sharding = NamedSharding(mesh, batch_spec(x.ndim, rules))
    global_shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
    out[key] = jax.make_array_from_process_local_data(sharding, x, global_shape)
  return out


def host_batch_size(global_batch_size: int) -> int:
  """This process's share of a global batch."""
  return global_batch_size // jax.process_count()
