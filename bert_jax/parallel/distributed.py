"""Multi-process (multi-host) start-up: ``jax.distributed.initialize`` when there is more than
one process.

  initialize_distributed(config.distributed)   # call before anything touches jax.devices()

Values come from ``config.distributed`` first, then the environment:
$JAX_COORDINATOR_ADDRESS (host:port of process 0), $JAX_NUM_PROCESSES, $JAX_PROCESS_ID. With
``auto_detect=True`` JAX finds them itself on TPU pods, SLURM, Open MPI and Kubernetes jobs.
On CPU the cross-process collectives use gloo.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
from absl import logging


def _resolve(cfg: Mapping[str, Any], key: str, env: str, default: Any) -> Any:
  value = cfg[key]
  if value not in ("", -1, None):
    return value
  return type(default)(os.environ[env]) if os.environ.get(env) else default


def initialize_distributed(cfg: Mapping[str, Any]) -> bool:
  """Joins the job's processes; returns True when jax.distributed was initialised here."""
  if jax.distributed.is_initialized():
    return False
  num_processes = int(_resolve(cfg, "num_processes", "JAX_NUM_PROCESSES", 1))
  if cfg["auto_detect"] and num_processes <= 1:
    jax.distributed.initialize()
    logging.info(
      "jax.distributed (auto-detected): process %d of %d", jax.process_index(), jax.process_count()
    )
    return True
  if num_processes <= 1:
    return False
  coordinator = _resolve(cfg, "coordinator_address", "JAX_COORDINATOR_ADDRESS", "")
  process_id = int(_resolve(cfg, "process_id", "JAX_PROCESS_ID", -1))
  if not coordinator or process_id < 0:
    raise ValueError(
      f"config.distributed: num_processes={num_processes} needs coordinator_address and "
      "process_id (or $JAX_COORDINATOR_ADDRESS and $JAX_PROCESS_ID)"
    )
  if process_id >= num_processes:
    raise ValueError(
      f"config.distributed: process_id {process_id} >= num_processes {num_processes}"
    )
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
    coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
  )
  logging.info(
    "jax.distributed: process %d of %d, coordinator %s, %d local / %d global devices",
    jax.process_index(),
    jax.process_count(),
    coordinator,
    jax.local_device_count(),
    jax.device_count(),
  )
  return True
