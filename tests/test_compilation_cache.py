"""The persistent compilation cache knob: a second process loads what the first compiled."""

import json
import subprocess
import sys

import jax
import pytest

from bert_jax.parallel.compilation_cache import enable_compilation_cache

_PROGRAM = r"""
import json, sys
import jax, jax.numpy as jnp
from bert_jax.parallel.compilation_cache import enable_compilation_cache
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None)
path = enable_compilation_cache({"dir": sys.argv[1], "min_compile_time_secs": 0.0,
                                 "max_size_bytes": -1})
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
f(jnp.ones((64, 64))).block_until_ready()
print(json.dumps({"path": path, "hits": len(hits)}))
"""


def _run(cache_dir, env) -> dict:
  proc = subprocess.run(
    [sys.executable, "-c", _PROGRAM, str(cache_dir)],
    capture_output=True,
    text=True,
    timeout=300,
    env=env,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_loads_from_the_cache(tmp_path, subprocess_env):
  cache = tmp_path / "jax_cache"
  env = subprocess_env(1)
  first = _run(cache, env)
  assert first["path"] == str(cache) and first["hits"] == 0
  assert any(cache.iterdir())  # the compiled program was written
  assert _run(cache, env)["hits"] >= 1  # and read back by a new process


def test_empty_dir_leaves_jax_alone_and_bad_dir_names_the_key(tmp_path):
  before = jax.config.jax_compilation_cache_dir
  assert (
    enable_compilation_cache({"dir": "", "min_compile_time_secs": 1.0, "max_size_bytes": -1})
    is None
  )
  assert jax.config.jax_compilation_cache_dir == before
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  with pytest.raises(ValueError, match="config.compilation_cache.dir"):
    enable_compilation_cache(
      {"dir": str(blocker / "cache"), "min_compile_time_secs": 1.0, "max_size_bytes": -1}
    )
