"""Device mesh, logical-axis shardings, multi-host start-up and global batch assembly."""

from bert_jax.parallel.distributed import initialize_distributed
from bert_jax.parallel.mesh import MESH_AXES, create_mesh, data_parallel_size, resolve_mesh_shape
from bert_jax.parallel.sharding import (
  batch_spec,
  check_batch_size,
  fit_spec,
  host_batch_size,
  logical_shardings,
  make_global_batch,
  mesh_context,
  normalize_rules,
)

__all__ = [
  "MESH_AXES",
  "batch_spec",
  "check_batch_size",
  "create_mesh",
  "data_parallel_size",
  "fit_spec",
  "host_batch_size",
  "initialize_distributed",
  "logical_shardings",
  "make_global_batch",
  "mesh_context",
  "normalize_rules",
  "resolve_mesh_shape",
]
