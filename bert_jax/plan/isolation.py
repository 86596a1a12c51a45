"""Compiles in a child process: a crash of the XLA compiler becomes an error naming the signal
and where the compiler's output was kept, not the end of this process.

  result = compile_for_topology_isolated(config, topo)   # compile_for_topology's result
  result = run_in_child("compile_cached", (config, topo, phase, cache_dir), log_path)

libtpu 0.0.42.1 segfaults (a stack overflow in its convolution emitter) on some BERT-base
steps with remat and LAMB; compiled in-process, that ended ``bert_jax.compile``, a plan or a
launch's pre-flight with exit status 139 and libtpu's stack. The child is
``python -m bert_jax.plan.compile_worker`` (the arguments pickled on its stdin, the JSON result
in a file); an input error it raises (``ValueError``: a mesh that does not match the chip count,
a step that does not compile) comes back as the same error here. Costs a Python start-up (a few
seconds) per compile, against minutes of compiling.

The child compiles with this process's compiler settings (``compiler_settings``: jax's
optimisation options, whether set by environment or ``jax.config.update``, and the XLA / libtpu
flags in the environment), so an isolated compile gives the numbers an in-process one would; the
planner's cache key includes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from typing import Any

import jax

from bert_jax.plan.report import CompileError, StepReport

WORKER = (sys.executable, "-m", "bert_jax.plan.compile_worker")


# jax options that change what the compiler makes of a program (and so its memory and cost)
COMPILER_OPTIONS = (
  "jax_exec_time_optimization_effort",
  "jax_memory_fitting_effort",
  "jax_optimization_level",
  "jax_memory_fitting_level",
)
COMPILER_FLAGS = ("LIBTPU_INIT_ARGS", "XLA_FLAGS")  # environment variables the compilers read


def compiler_settings() -> dict[str, str]:
  """{setting: value} of the options and flags above as this process has them."""
  out = {k: str(jax.config.values[k]) for k in COMPILER_OPTIONS if k in jax.config.values}
  out.update({k: os.environ[k] for k in COMPILER_FLAGS if k in os.environ})
  return out


@contextlib.contextmanager
def compiler_options(**values):
  """The jax options ``values`` (names from ``COMPILER_OPTIONS``) for the block, in this process
  and in the child processes it starts (``_child_env``); the previous values after it."""
  unknown = sorted(set(values) - set(COMPILER_OPTIONS))
  if unknown:
    raise ValueError(f"not a compiler option: {unknown}; known: {list(COMPILER_OPTIONS)}")
  before = {k: jax.config.values[k] for k in values}
  try:
    for k, v in values.items():
      jax.config.update(k, v)
    yield
  finally:
    for k, v in before.items():
      jax.config.update(k, v)


def _child_env() -> dict[str, str]:
  """This process's environment with its jax options as JAX_* variables (jax reads each option's
  default from its upper-cased name), so the child compiles as this process would."""
  env = dict(os.environ)
  env.update({k.upper(): v for k, v in compiler_settings().items() if k in COMPILER_OPTIONS})
  return env


class CompilerDied(CompileError):
  """The child process compiling a step died (a signal, or an exit without a result)."""


def run_in_child(
  target: str, args: tuple, log_path: str = "", command: tuple[str, ...] | None = None
) -> dict[str, Any]:
  """``compile_worker.TARGETS[target](*args)`` in a child process; its JSON-safe result.

  CompilerDied when the child dies: the message names the signal or exit status, the child's
  output file (``log_path``; a new temporary file when empty) and its last line. A ValueError
  raised in the child is raised here with its message (a CompileError as a CompileError, any
  other as a ValueError)."""
  with tempfile.TemporaryDirectory(prefix="bert_jax_compile") as tmp:
    out = os.path.join(tmp, "result.json")
    proc = subprocess.run(
      [*(command or WORKER), out],
      input=pickle.dumps((target, args)),
      env=_child_env(),
      capture_output=True,
      check=False,
    )
    if proc.returncode == 0 and os.path.exists(out):
      with open(out) as f:
        result = json.load(f)
      if "raised" in result:
        error = CompileError if result["raised"] == "CompileError" else ValueError
        raise error(result["message"])
      return result
  code = proc.returncode
  how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
  stderr = proc.stderr.decode(errors="replace")
  if log_path:
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    f = open(log_path, "w")
  else:
    f = tempfile.NamedTemporaryFile("w", prefix="bert_jax_compile_", suffix=".log", delete=False)
  with f:  # kept for a bug report
    f.write(stderr)
  tail = stderr.strip().splitlines()[-1:] or [""]
  raise CompilerDied(f"the compiler process died ({how}; its output: {f.name}) {tail[0][:300]}")


def compile_for_topology_isolated(config, topo, **kwargs) -> dict[str, Any]:
  """``compiler.compile_for_topology(config, topo, **kwargs)`` in a child process: the same
  result, its ``reports`` rebuilt from the steps (without the compiled executables)."""
  result = run_in_child("compile_for_topology", (config, topo, kwargs))
  result["reports"] = [StepReport(**step) for step in result["steps"]]
  return result
