"""Run a job on this machine: one process, or N processes joined with ``jax.distributed``.

With ``num_processes > 1`` the target picks a free port, puts the coordinator on localhost and
gives process i the environment ``JAX_COORDINATOR_ADDRESS=localhost:<port>``,
``JAX_NUM_PROCESSES=N``, ``JAX_PROCESS_ID=i`` (what ``bert_jax.parallel`` reads). Each process
logs to ``<workdir>/logs/process_<i>.log`` (process 0 is echoed to the console too). The first
process to fail takes the others down (SIGTERM to its process group, SIGKILL after a grace
period) and its exit status is the launch's.

Restarts. When a process is preempted (exit status 143: it saved a checkpoint after SIGTERM) or
dies by a signal other than SIGINT (SIGKILL, the OOM killer), the whole group is stopped and
started again, up to ``max_restarts`` times, on a fresh coordinator port; the entry point
resumes from the latest checkpoint. Every process gets ``BERT_JAX_ATTEMPT`` (0, then k for the
k-th restart) and ``BERT_JAX_MAX_RESTARTS``; each attempt appends to the same log files, after
a first line naming it, and the console gets one line per restart. Nothing is restarted after a
status of 0, 1, 2, 3 (the trainer found the restarts make no progress) or 130 (Ctrl-C), nor
when the launcher itself is stopped (SIGTERM, Ctrl-C, or a sweep's ``stop``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from bert_jax.interrupts import ENV_ATTEMPT, ENV_MAX_RESTARTS, restartable

from ..job import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID, Job, LaunchError
from .base import Target


def free_port() -> int:
  with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
  """One local process: its command, the environment variables it adds, and its log file."""

  process_id: int
  argv: list[str]
  env: dict[str, str]
  log_path: str


@dataclasses.dataclass(frozen=True)
class LocalTarget(Target):
  """Settings of a local launch.

  Attributes:
    num_processes: processes joined with jax.distributed (1: a plain single process).
    cpu_devices_per_process: > 0 gives each process that many CPU devices (XLA_FLAGS).
    gpus_per_process: > 0 gives process i GPUs [i*g, (i+1)*g) via CUDA_VISIBLE_DEVICES.
    coordinator_port: the jax.distributed coordinator's port (0: a free port on localhost).
    process_log_dir: where process logs go; empty means ``<workdir>/logs``.
    kill_grace_s: seconds between SIGTERM and SIGKILL when one process failed.
    echo: stream process 0's output to this console as well as its log.
    max_restarts: times the whole job is started again after a process was preempted (exit
      143) or killed by a signal; it resumes from its latest checkpoint (0: never).
  """

  num_processes: int = 1
  cpu_devices_per_process: int = 0
  gpus_per_process: int = 0
  coordinator_port: int = 0
  process_log_dir: str = ""
  kill_grace_s: float = 30.0
  echo: bool = True
  max_restarts: int = 3

  name = "local"

  @property
  def processes(self) -> int:
    return self.num_processes

  @property
  def on_this_machine(self) -> bool:
    return True

  @property
  def results_on_return(self) -> bool:
    """The processes run here and ``run`` waits for them; the workdir is a local path."""
    return True

  @property
  def parallel_runs(self) -> bool:
    return True

  def sweep_run(self, index: int, first: bool, parallel: int = 1) -> LocalTarget:
    """This target; with runs in parallel, no process echoed to the console (their lines
    would interleave; each still has its log)."""
    del index, first
    return dataclasses.replace(self, echo=False) if parallel != 1 and self.echo else self

  def validate(self, job: Job) -> None:
    if self.num_processes < 1:
      raise LaunchError(f"local target: num_processes must be >= 1, got {self.num_processes}")
    if self.max_restarts < 0:
      raise LaunchError(f"local target: max_restarts must be >= 0, got {self.max_restarts}")
    if "://" in job.workdir:
      raise LaunchError(f"local target: workdir {job.workdir!r} must be a local path")

  def plan(self, job: Job, attempt: int = 0) -> list[ProcessSpec]:
    """The processes of ``attempt`` (0, then k for the k-th restart), with their environments
    (a fresh coordinator port each time unless ``coordinator_port`` is set); starts nothing."""
    self.validate(job)
    log_dir = self.process_log_dir or os.path.join(job.workdir, "logs")
    port = self.coordinator_port or free_port()
    specs = []
    for i in range(self.num_processes):
      env = {ENV_ATTEMPT: str(attempt), ENV_MAX_RESTARTS: str(self.max_restarts)}
      if self.num_processes > 1:
        env.update(
          {
            ENV_COORDINATOR: f"localhost:{port}",
            ENV_NUM_PROCESSES: str(self.num_processes),
            ENV_PROCESS_ID: str(i),
          }
        )
      if self.cpu_devices_per_process:
        flags = [
          f
          for f in os.environ.get("XLA_FLAGS", "").split()
          if not f.startswith("--xla_force_host_platform_device_count")
        ]
        flags.append(f"--xla_force_host_platform_device_count={self.cpu_devices_per_process}")
        env["XLA_FLAGS"] = " ".join(flags)
      if self.gpus_per_process:
        g = self.gpus_per_process
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in range(i * g, (i + 1) * g))
      specs.append(ProcessSpec(i, job.argv(), env, os.path.join(log_dir, f"process_{i}.log")))
    return specs

  def describe(self, job: Job) -> str:
    lines = []
    for spec in self.plan(job):
      env = " ".join(f"{k}={v}" for k, v in sorted(spec.env.items()))
      lines.append(f"{env + ' ' if env else ''}{' '.join(spec.argv)}  > {spec.log_path}")
    return "\n".join(lines)

  def run(self, job: Job, out: TextIO | None = None, stop: threading.Event | None = None) -> int:
    """Starts the processes and waits, restarting them as the module docstring says; returns 0
    or the status of the process whose failure ended the launch."""
    self.validate(job)
    return run_processes(
      functools.partial(self.plan, job),
      self.kill_grace_s,
      self.echo,
      out or sys.stdout,
      stop=stop,
      max_restarts=self.max_restarts,
    )


def _pump(stream, log: TextIO, echo: TextIO | None, prefix: str) -> None:
  for line in iter(stream.readline, ""):
    log.write(line)
    log.flush()
    if echo is not None:
      echo.write(prefix + line)
      echo.flush()
  stream.close()


def _exit_status(returncode: int) -> int:
  return 128 - returncode if returncode < 0 else returncode  # killed by signal s -> 128 + s


def _how(returncode: int) -> str:
  """How a process ended, for a console line: ``died (SIGKILL)``, ``exited with status 1``."""
  if returncode >= 0:
    return f"exited with status {returncode}"
  try:
    return f"died ({signal.Signals(-returncode).name})"
  except ValueError:
    return f"died (signal {-returncode})"


def _stop(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
  """SIGTERM every live process group (a preemption save can run), then SIGKILL."""
  for p in procs:
    if p.poll() is None:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
  deadline = time.monotonic() + grace_s
  for p in procs:
    with contextlib.suppress(subprocess.TimeoutExpired):
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
    if p.poll() is None:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
      p.wait()


@dataclasses.dataclass(frozen=True)
class _Ended:
  """How an attempt ended: every process with status 0 (``process`` None), or the failure of
  ``process`` (its ``subprocess`` returncode: -s after death by signal s)."""

  process: int | None = None
  returncode: int = 0

  @property
  def status(self) -> int:
    return _exit_status(self.returncode)


def run_processes(
  plan: Callable[[int], Sequence[ProcessSpec]],
  kill_grace_s: float = 30.0,
  echo: bool = True,
  out: TextIO = sys.stdout,
  poll_s: float = 0.1,
  stop: threading.Event | None = None,
  max_restarts: int = 0,
) -> int:
  """Runs the processes of one job together: all succeed, or all stop when one fails; a job
  whose process was preempted or killed by a signal runs again (``plan(k)``: the processes of
  the k-th restart), up to ``max_restarts`` times.

  SIGTERM or Ctrl-C to the launcher (when this runs in the main thread), or ``stop`` being set
  (a sweep being stopped), is passed on: every process gets SIGTERM (a pre-emption checkpoint
  can be saved), SIGKILL after ``kill_grace_s``; the status is then 128 + the signal, and
  nothing is restarted.
  """
  stop = stop or threading.Event()
  received: list[int] = []
  previous = {}
  if threading.current_thread() is threading.main_thread():

    def on_signal(signum, frame):
      del frame
      received.append(signum)
      stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
      previous[sig] = signal.signal(sig, on_signal)
  try:
    attempt = 0
    while True:
      specs = plan(attempt)
      ended = _run_attempt(specs, attempt, max_restarts, kill_grace_s, echo, out, poll_s, stop)
      if stop.is_set():  # the launcher was stopped: its processes were told to save and stop
        signum = received[0] if received else signal.SIGTERM
        out.write(f"launch: {signal.Signals(signum).name}; stopping every process\n")
        return 128 + signum
      if ended.process is None or not _restarts(ended, attempt, max_restarts):
        return ended.status
      attempt += 1
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def _restarts(ended: _Ended, attempt: int, max_restarts: int) -> bool:
  return restartable(ended.returncode) and attempt < max_restarts


def _run_attempt(
  specs: Sequence[ProcessSpec],
  attempt: int,
  max_restarts: int,
  kill_grace_s: float,
  echo: bool,
  out: TextIO,
  poll_s: float,
  stop: threading.Event,
) -> _Ended:
  """Starts one attempt's processes, each log first getting a line naming the attempt, and
  waits until they all succeed, one fails (the console is told what happens next) or ``stop``
  is set; then stops every process still running."""
  procs, threads, logs = [], [], []
  header = (
    f"launch: attempt {attempt} of at most {max_restarts + 1}"
    + (f" (restart {attempt})" if attempt else "")
    + f", started {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
  )
  try:
    for spec in specs:
      os.makedirs(os.path.dirname(spec.log_path) or ".", exist_ok=True)
      log = open(spec.log_path, "a", buffering=1)
      logs.append(log)
      log.write(header)
      proc = subprocess.Popen(
        spec.argv,
        env={**os.environ, **spec.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
      )
      procs.append(proc)
      prefix = f"[{spec.process_id}] " if len(specs) > 1 else ""
      t = threading.Thread(
        target=_pump,
        daemon=True,
        args=(proc.stdout, log, out if echo and spec.process_id == 0 else None, prefix),
      )
      t.start()
      threads.append(t)
    while not stop.is_set():
      codes = [p.poll() for p in procs]
      failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
      if failed:  # a signal's death explains the others' failures that came with it
        i, code = next(((i, c) for i, c in failed if restartable(c)), failed[0])
        ended = _Ended(i, code)
        if _restarts(ended, attempt, max_restarts):
          out.write(
            f"launch: process {i} {_how(code)} at {time.strftime('%H:%M:%S')}; "
            f"restart {attempt + 1} of {max_restarts}\n"
          )
          out.flush()
          return ended
        why = "; no restart left" if restartable(code) and max_restarts else ""
        out.write(
          f"launch: process {i} {_how(code)}{why}; stopping the others (log: {specs[i].log_path})\n"
        )
        _print_tail(specs[i].log_path, out)
        return ended
      if all(c == 0 for c in codes):
        return _Ended()
      time.sleep(poll_s)
    return _Ended()
  finally:
    _stop(procs, kill_grace_s)
    for t in threads:
      t.join(timeout=5)
    for log in logs:
      log.close()


def _print_tail(path: str, out: TextIO, n: int = 20) -> None:
  time.sleep(0.2)  # let the pump thread write the last lines
  with contextlib.suppress(OSError), open(path) as f:
    tail = f.readlines()[-n:]
  if tail:
    out.write("".join(f"  | {line}" for line in tail))
