"""Progress of long work on the console: never silent for more than ``interval_sec``.

  with Progress("evaluating dev", total=len(batches), unit="batches") as progress:
    for batch in batches:
      ...
      progress.update()            # logs 'evaluating dev: 12/40 batches (30%), 0.8 batches/s,
                                   # eta 0m35s' at most every 30 s, and a closing line
  with Heartbeat("compiling train step seq128"):
    compiled = lowered.compile()   # 'compiling train step seq128: still running, 1m30s' every 30 s

``Progress`` is driven by the work's own calls; used as a context manager it also logs its line
(with "unit k+1 still running") when one unit takes longer than the interval, e.g. the first
batch of an evaluation, which compiles the step (intervals under ``MIN_BEAT_SEC`` are left to
the calls alone). ``Heartbeat`` runs a daemon thread for work that cannot report (a compile, a
blocking call). Both log through absl (``log`` to change that) and print nothing when the work
ends within one interval, except ``Progress``'s closing line when ``total`` is given and at
least one line was logged before it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from absl import logging

INTERVAL_SEC = 30.0
MIN_BEAT_SEC = 1.0  # Progress's own thread only for intervals at least this long


def format_duration(seconds: float) -> str:
  """'0m07s', '12m30s', '1h05m'."""
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _singular(unit: str) -> str:
  """'batch' for 'batches', 'row' for 'rows'."""
  if unit.endswith(("ches", "shes", "sses", "xes")):
    return unit[:-2]
  return unit[:-1] if unit.endswith("s") else unit


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
    self._beat_last = time.monotonic()  # the real time of the last line or update
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

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
    self._beat_last = time.monotonic()
    now = self.clock()
    if now - self.t_last >= self.interval_sec:
      self.t_last = now
      self.lines += 1
      self.log(self.line())

  def _beat(self) -> None:
    """A line when nothing was logged or done for ``interval_sec``: one unit is slow."""
    while not self._stop.wait(self.interval_sec):
      if time.monotonic() - self._beat_last >= self.interval_sec:
        self._beat_last = time.monotonic()
        self.t_last = self.clock()
        self.lines += 1
        self.log(f"{self.line()}; {_singular(self.unit)} {self.done + 1} still running")

  def close(self) -> None:
    """The closing line, where an earlier line said the work was under way."""
    if self.lines:
      self.log(self.line().split(", eta")[0] + " (done)")

  def __enter__(self) -> Progress:
    if self.interval_sec >= MIN_BEAT_SEC:
      self._thread = threading.Thread(target=self._beat, name="bert_jax-progress", daemon=True)
      self._thread.start()
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
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
