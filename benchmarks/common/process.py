"""One child process, the one way every benchmark starts one.

  done = run([sys.executable, "-m", "bert_jax.pretrain", ...], log="/tmp/x.log", cwd=REPO)
  done.returncode, done.seconds, done.peak_rss_mb
  done = run([sys.executable, "-m", "benchmarks.speed.data", "--generate_child", spec])
  json.loads(done.stdout.splitlines()[-1])          # without a log: stdout is kept

The child gets this process's environment plus ``env``, with the repository's root first on
PYTHONPATH (``-m bert_jax...`` and ``-m benchmarks...`` work from any directory). With ``log``
its stdout and stderr go to that file (``append`` or overwritten); without, both are kept
(``stdout``, ``stderr``). ``on_line(line, proc)`` gets each line of the output (stdout and
stderr together) as it comes, e.g. to kill the child at a step. ``core`` pins the child to one
CPU core. ``check``: a non-zero status raises ``ChildFailed`` naming the command and its log
(or the end of its stderr). ``timeout_s``: the child is killed after that many seconds and
``subprocess.TimeoutExpired`` is raised.

The launcher's ``launch.targets.local.run_processes`` runs a job's processes for a user (logs,
signals passed on, one failing stops the others); the benchmarks need what it does not do: a
child's stdout kept apart from its log lines, its peak memory, a core to run on, a time limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from benchmarks.common import REPO


class ChildFailed(RuntimeError):
  pass


@dataclasses.dataclass(frozen=True)
class Finished:
  returncode: int
  seconds: float  # wall clock, start to exit
  peak_rss_mb: float  # the child's peak resident memory (nan: not known)
  stdout: str = ""  # without a log: stdout; with on_line: stdout and stderr together
  stderr: str = ""  # without a log or on_line


def run(
  argv: Sequence[str],
  *,
  log: str | os.PathLike | None = None,
  append: bool = False,
  env: Mapping[str, str] | None = None,
  cwd: str | os.PathLike | None = None,
  core: int | None = None,
  timeout_s: float | None = None,
  on_line: Callable[[str, subprocess.Popen], None] | None = None,
  check: bool = True,
) -> Finished:
  argv = [str(a) for a in argv]
  environ = {**os.environ, **(env or {})}
  environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO), *([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else [])]
  )
  pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
  with contextlib.ExitStack() as stack:
    logf = stack.enter_context(open(log, "a" if append else "w")) if log is not None else None
    if on_line is not None:
      out, err = subprocess.PIPE, subprocess.STDOUT
    elif logf is not None:
      out, err = logf, subprocess.STDOUT
    else:
      out = stack.enter_context(tempfile.TemporaryFile("w+"))
      err = stack.enter_context(tempfile.TemporaryFile("w+"))
    start = time.perf_counter()
    proc = subprocess.Popen(
      argv, cwd=cwd, env=environ, stdout=out, stderr=err, stdin=subprocess.DEVNULL, text=True,
      preexec_fn=pin,
    )  # fmt: skip
    expired = threading.Event()

    def kill():
      expired.set()
      with contextlib.suppress(ProcessLookupError):
        proc.kill()

    timer = threading.Timer(timeout_s, kill) if timeout_s is not None else None
    if timer is not None:
      timer.start()
    stdout = stderr = ""
    try:
      if on_line is not None:
        lines = []
        for line in proc.stdout:
          lines.append(line)
          if logf is not None:
            logf.write(line)
          on_line(line, proc)
        stdout = "".join(lines)
      try:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        peak_rss_mb = usage.ru_maxrss / 1024
      except ChildProcessError:  # already reaped: on_line's code polled it from another thread
        proc.wait()
        peak_rss_mb = float("nan")
    finally:
      if timer is not None:
        timer.cancel()
      if proc.returncode is None:
        proc.kill()
        proc.wait()
    seconds = time.perf_counter() - start
    if logf is None and on_line is None:
      out.seek(0)
      err.seek(0)
      stdout, stderr = out.read(), err.read()
  if expired.is_set():
    raise subprocess.TimeoutExpired(argv, timeout_s, stdout, stderr)
  if check and proc.returncode != 0:
    where = f"see {log}" if log is not None else (stderr or stdout)[-4000:]
    raise ChildFailed(f"{' '.join(argv)} failed (status {proc.returncode}); {where}")
  return Finished(proc.returncode, seconds, peak_rss_mb, stdout, stderr)
