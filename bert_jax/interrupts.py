"""Ctrl-C works from the first second an entry point runs: exit status 130, one line.

  handler = InterruptHandler("pretrain")
  with handler.installed():           # bert_jax.cli.run, around the whole entry point
    main(argv)                        # KeyboardInterrupt where there is nothing to save
  if handler.count:                   # a training loop took the Ctrl-C, saved and stopped
    ...                               # "pretrain: interrupted (Ctrl-C) ..."; exit 130

Outside a training loop the first Ctrl-C (SIGINT) raises KeyboardInterrupt, as Python's own
handler does, and the entry point ends with status 130 (``INTERRUPTED_EXIT``, as a shell reports
a process ended by SIGINT). Python drops an exception raised while a callback runs, printing
"Exception ignored in: <function _xla_gc_callback ...> KeyboardInterrupt", and the run went on
as if no key was pressed. ``installed`` therefore also hooks ``sys.unraisablehook``: a dropped
KeyboardInterrupt is delivered again (``_thread.interrupt_main``) once the callback has
returned, so no Ctrl-C is lost. A second Ctrl-C while the first is still unwinding (a slow
clean-up) exits at once.

Inside a training loop ``bert_jax.train.loop.PreemptionWatcher`` handles SIGINT itself (save,
then stop; a second Ctrl-C stops without saving) and tells this handler (``record``), so that
the entry point still ends with status 130 after the checkpoint is saved. A Ctrl-C that came
before the loop but whose KeyboardInterrupt something caught and dropped (``requested``) is
honoured by the loop as soon as it starts.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

INTERRUPTED_EXIT = 130  # as a shell reports a process ended by SIGINT (128 + 2)
REDELIVER_SEC = 0.01  # a dropped KeyboardInterrupt is raised again this soon


class InterruptHandler:
  """The SIGINT handler of an entry point (see the module docstring). ``count``: the Ctrl-Cs
  received, the ones a training loop took included."""

  def __init__(self, prog: str):
    self.prog = prog
    self.count = 0
    self._redeliver = False
    self._previous_hook = None

  def __call__(self, signum, frame) -> None:
    del frame
    if self._redeliver:  # an interrupt a callback dropped, delivered again: not a new Ctrl-C
      self._redeliver = False
      raise KeyboardInterrupt
    self.record(signum)
    if self.count > 1:
      print(f"{self.prog}: interrupted again (Ctrl-C): exiting at once", file=sys.stderr)
      sys.stderr.flush()
      os._exit(INTERRUPTED_EXIT)
    raise KeyboardInterrupt

  @property
  def requested(self) -> bool:
    """Whether a Ctrl-C came: a training loop starting after one that was swallowed (an
    ``except BaseException`` somewhere) stops after its first step, saving."""
    return self.count > 0

  def record(self, signum: int) -> None:
    """Counts a Ctrl-C (also one a training loop's own handler took)."""
    if signum == signal.SIGINT:
      self.count += 1

  def _unraisable(self, unraisable) -> None:
    if isinstance(unraisable.exc_value, KeyboardInterrupt) or (
      unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt)
    ):
      self._redeliver = signal.getsignal(signal.SIGINT) is self
      # From another thread: the main thread runs the SIGINT handler again once this hook and
      # the callback have returned (called here, it would run inside the hook).
      timer = threading.Timer(REDELIVER_SEC, _thread.interrupt_main)
      timer.daemon = True
      timer.start()
      return
    (self._previous_hook or sys.__unraisablehook__)(unraisable)

  @contextlib.contextmanager
  def installed(self) -> Iterator[InterruptHandler]:
    """This handler for SIGINT and the unraisable hook, restored afterwards. Only in the main
    thread (signal handlers can be set there alone); elsewhere nothing changes. A process that
    started with SIGINT ignored (a job started in the background) keeps ignoring it."""
    if threading.current_thread() is not threading.main_thread() or (
      signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    ):
      yield self
      return
    previous = signal.signal(signal.SIGINT, self)
    self._previous_hook = sys.unraisablehook
    sys.unraisablehook = self._unraisable
    try:
      yield self
    finally:
      sys.unraisablehook = self._previous_hook
      signal.signal(signal.SIGINT, previous)


def stop_at_once_on_ctrl_c(prog: str) -> None:
  """Until ``InterruptHandler.installed`` takes over: a Ctrl-C ends the process at once with
  one line and status 130. An entry point calls it first, under ``if __name__ == "__main__"``,
  before its heavy imports (JAX, TensorFlow): a KeyboardInterrupt raised inside them can be
  caught or dropped (a gc callback), and there is nothing to save yet. Only in the main thread;
  a process started with SIGINT ignored keeps ignoring it."""

  def stop(signum, frame) -> None:
    del signum, frame
    os.write(2, f"{prog}: interrupted (Ctrl-C): stopped\n".encode())
    os._exit(INTERRUPTED_EXIT)

  if threading.current_thread() is threading.main_thread() and (
    signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
  ):
    signal.signal(signal.SIGINT, stop)
