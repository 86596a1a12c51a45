"""JAX's persistent compilation cache, switched on once at the start of a run from its config.

  enable_compilation_cache(config.compilation_cache)     # first thing in a run, before any jit

``config.compilation_cache`` (``configs/common.py``, so every entry point has it):
  dir                    where compiled programs are kept across processes ("" = leave JAX's
                         own setting, e.g. $JAX_COMPILATION_CACHE_DIR, untouched); ``~`` and
                         environment variables are expanded; a gs:// path works on pods
  min_compile_time_secs  only programs that took at least this long to compile are written
  max_size_bytes         least recently used entries are evicted beyond this size (-1: no limit)

A re-run of the same shapes (another seed, a sweep's next learning rate, a resumed job, an
evaluation after training) then loads the train and eval steps instead of compiling them. The
cache key covers the program, the compiler flags, the backend and the devices, so a changed
model, batch, sequence bucket or mesh simply compiles (and adds an entry).

JAX trusts what it reads from the cache: keep the directory private to the user (the default
is under the user's home).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
from absl import logging
from jax.experimental.compilation_cache import compilation_cache


def enable_compilation_cache(cfg: Mapping[str, Any]) -> str | None:
  """Points JAX's persistent cache at ``cfg["dir"]``; returns the directory (None when off).

  Safe to call more than once in a process (tests, notebooks, a sweep run in-process): the
  same directory is a no-op; a different one takes over from the next compilation on.
  """
  path = str(cfg["dir"]).strip()
  if not path:
    return None
  if "://" not in path:
    path = os.path.abspath(os.path.expanduser(os.path.expandvars(path)))
    try:
      os.makedirs(path, exist_ok=True)
    except OSError as e:
      raise ValueError(
        f"config.compilation_cache.dir={cfg['dir']!r}: cannot create {path}: {e}"
      ) from None
  jax.config.update(
    "jax_persistent_cache_min_compile_time_secs", float(cfg["min_compile_time_secs"])
  )
  jax.config.update("jax_compilation_cache_max_size", int(cfg["max_size_bytes"]))
  if jax.config.jax_compilation_cache_dir != path:
    compilation_cache.set_cache_dir(path)
    compilation_cache.reset_cache()  # re-initialised at the next compilation, at `path`
    logging.info(
      "JAX persistent compilation cache: %s (programs compiling >= %.1f s)",
      path,
      float(cfg["min_compile_time_secs"]),
    )
  return path
