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

An interrupt (Ctrl-C) stops a compile at once: the child takes the terminal's SIGINT with the
default action (it ends; it does not finish its compile first), and ``stop_children`` kills the
children still running (the planner calls it when interrupted; a compile then raises
``Stopped``, and no new child starts until ``resume_children``). While a child compiles it
writes the step it is on to a status file (``run_in_child``'s ``status``), which progress lines
can name.

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
import threading
from collections.abc import Callable
from typing import Any

import jax

from bert_jax.plan.report import CompileError, StepReport
from bert_jax.train import progress as progress_lib

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


class Stopped(Exception):
  """A compile was stopped by an interrupt (``stop_children``): its child was killed."""


_children: set[subprocess.Popen] = set()
_children_lock = threading.Lock()
_stopping = threading.Event()
STATUS_ENV = "BERT_JAX_COMPILE_STATUS"  # the child writes the step it is compiling here
PROGRESS_INTERVAL_SEC = progress_lib.INTERVAL_SEC  # seconds between progress lines


def stop_children() -> int:
  """Kills the compiling children (an interrupt) and refuses new ones until
  ``resume_children``; how many were running."""
  _stopping.set()
  with _children_lock:
    running = list(_children)
  for proc in running:
    with contextlib.suppress(OSError):
      proc.kill()
  return len(running)


def resume_children() -> None:
  """Children may start again (after ``stop_children``)."""
  _stopping.clear()


def read_status(path: str) -> str:
  """What a child's status file says it is compiling ("" when nothing yet)."""
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:
    return ""


def run_in_child(
  target: str,
  args: tuple,
  log_path: str = "",
  command: tuple[str, ...] | None = None,
  status: str = "",
) -> dict[str, Any]:
  """``compile_worker.TARGETS[target](*args)`` in a child process; its JSON-safe result.

  CompilerDied when the child dies: the message names the signal or exit status, the child's
  output file (``log_path``; a new temporary file when empty) and its last line. A ValueError
  raised in the child is raised here with its message (a CompileError as a CompileError, any
  other as a ValueError). Stopped when ``stop_children`` killed it (or was called before it
  started) or a SIGINT ended it. ``status``: a file the child writes the step it is compiling to (``read_status``).
  An exception here (KeyboardInterrupt) kills the child before it propagates."""
  if _stopping.is_set():
    raise Stopped("stopped before the compile started")
  env = _child_env()
  if status:
    env[STATUS_ENV] = status
  with tempfile.TemporaryDirectory(prefix="bert_jax_compile") as tmp:
    out = os.path.join(tmp, "result.json")
    proc = subprocess.Popen(
      [*(command or WORKER), out],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=env,
    )
    with _children_lock:
      _children.add(proc)
    if _stopping.is_set():  # stop_children ran between the check above and the start
      proc.kill()
    try:
      _, stderr_bytes = proc.communicate(pickle.dumps((target, args)))
    except BaseException:  # an interrupt: the child goes with us
      proc.kill()
      proc.wait()
      raise
    finally:
      with _children_lock:
        _children.discard(proc)
    if _stopping.is_set() or proc.returncode == -signal.SIGINT:  # Ctrl-C reached the child too
      raise Stopped("the compile was stopped")
    if proc.returncode == 0 and os.path.exists(out):
      with open(out) as f:
        result = json.load(f)
      if "raised" in result:
        error = CompileError if result["raised"] == "CompileError" else ValueError
        raise error(result["message"])
      return result
  code = proc.returncode
  how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
  stderr = stderr_bytes.decode(errors="replace")
  if log_path:
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    f = open(log_path, "w")
  else:
    f = tempfile.NamedTemporaryFile("w", prefix="bert_jax_compile_", suffix=".log", delete=False)
  with f:  # kept for a bug report
    f.write(stderr)
  tail = stderr.strip().splitlines()[-1:] or [""]
  raise CompilerDied(f"the compiler process died ({how}; its output: {f.name}) {tail[0][:300]}")


def compile_for_topology_isolated(
  config, topo, *, progress: Callable[[str], None] | None = None, **kwargs
) -> dict[str, Any]:
  """``compiler.compile_for_topology(config, topo, **kwargs)`` in a child process: the same
  result, its ``reports`` rebuilt from the steps (without the compiled executables).
  ``progress``: gets a line at least every ``progress.INTERVAL_SEC`` (30 s) while the child
  compiles, naming the step it is on (``train seq512 (2 of 3)``) and the time elapsed."""
  if progress is None:
    result = run_in_child("compile_for_topology", (config, topo, kwargs))
  else:
    with tempfile.TemporaryDirectory(prefix="bert_jax_status") as tmp:
      status = os.path.join(tmp, "status")

      def log(line: str) -> None:
        now = read_status(status)
        progress(f"{line}; at {now}" if now else line)

      beat = progress_lib.Heartbeat(
        f"compile for {topo.describe()}", interval_sec=PROGRESS_INTERVAL_SEC, log=log
      )
      with beat:
        result = run_in_child("compile_for_topology", (config, topo, kwargs), status=status)
  result["reports"] = [StepReport(**step) for step in result["steps"]]
  return result
