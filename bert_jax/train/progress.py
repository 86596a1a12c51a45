"""Progress of long work on the console: never silent for more than ``interval_sec``.

  with Progress("evaluating dev", total=len(batches), unit="batches") as progress:
    for batch in batches:
      ...
      progress.update()            # logs 'evaluating dev: 12/40 batches (30%), 0.8 batches/s,
                                   # eta 0m35s' at most every 30 s, and a closing line
  with Heartbeat("compiling train step seq128"):
    compiled = lowered.compile()   # 'compiling train step seq128: still running, 1m30s' every 30 s

``Progress`` is driven by the work's own calls; ``Heartbeat`` runs a daemon thread for work that
cannot report (a compile, a blocking call). Both log through absl (``log`` to change that) and
print nothing when the work ends within one interval, except ``Progress``'s closing line when
``total`` is given and at least one line was logged before it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from absl import logging

INTERVAL_SEC = 30.0


def format_duration(seconds: float) -> str:
  """'0m07s', '12m30s', '1h05m'."""
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class Progress:
  """Counts done units of a piece of work and logs a line at most every ``interval_sec``."""

  def __init__(
    self,
    what: str,
    total: int | None = None,
    unit: str = "batches",
    interval_sec: float = INTERVAL_SEC,
    log: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
  ):
    self.what, self.total, self.unit = what, total, unit
    self.interval_sec = interval_sec
    self.log = log if log is not None else logging.info
    self.clock = clock
    self.done = 0
    self.lines = 0
    self.t_start = self.t_last = clock()

  def line(self) -> str:
    elapsed = self.clock() - self.t_start
    rate = self.done / elapsed if elapsed > 0 else 0.0
    if self.total:
      text = (
        f"{self.what}: {self.done}/{self.total} {self.unit} ({100 * self.done / self.total:.0f}%)"
      )
    else:
      text = f"{self.what}: {self.done} {self.unit}"
    text += f", {rate:.2f} {self.unit}/s, elapsed {format_duration(elapsed)}"
    if self.total and rate > 0 and self.done < self.total:
      text += f", eta {format_duration((self.total - self.done) / rate)}"
    return text

  def update(self, n: int = 1) -> None:
    self.done += n
    now = self.clock()
    if now - self.t_last >= self.interval_sec:
      self.t_last = now
      self.lines += 1
      self.log(self.line())

  def close(self) -> None:
    """The closing line, where an earlier line said the work was under way."""
    if self.lines:
      self.log(self.line().split(", eta")[0] + " (done)")

  def __enter__(self) -> Progress:
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is None:
      self.close()


class Heartbeat:
  """Logs '<what>: still running, <elapsed>' every ``interval_sec`` until the block ends."""

  def __init__(
    self,
    what: str,
    interval_sec: float = INTERVAL_SEC,
    log: Callable[[str], None] | None = None,
  ):
    self.what = what
    self.interval_sec = interval_sec
    self.log = log if log is not None else logging.info
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self.beats = 0

  def _run(self, t_start: float) -> None:
    while not self._stop.wait(self.interval_sec):
      self.beats += 1
      self.log(f"{self.what}: still running, {format_duration(time.monotonic() - t_start)}")

  def __enter__(self) -> Heartbeat:
    self._thread = threading.Thread(
      target=self._run, args=(time.monotonic(),), name="bert_jax-heartbeat", daemon=True
    )
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
