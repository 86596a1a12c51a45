"""Ctrl-C works from the first second an entry point runs: exit status 130, one line; a
training run stopped by SIGTERM saves, then exits 143; the exit statuses launchers act on.

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

Preemption. A training loop that stops on SIGTERM (its own, or another process's of the same
job) saves a checkpoint and tells this handler the step (``record_stop``); the entry point then
prints "<prog>: preempted (SIGTERM): saved step N; re-run to resume" on stderr and exits with
``PREEMPTED_EXIT`` (143, as a shell reports a process ended by SIGTERM), so that a scheduler
does not count the run as completed. SIGTERM outside a training loop ends the process (signal
15, the same 143 to a shell). Launchers restart a job that ended ``restartable``: preempted, or
killed by a signal other than SIGINT; never after 0 (completed), 1 (an error), 2 (bad input),
3 (``NO_PROGRESS_EXIT``: the trainer refused an attempt that cannot help,
``bert_jax.train.attempts``) or 130 (Ctrl-C). They tell each process which attempt it is in
``ENV_ATTEMPT`` (0, then k for the k-th restart) and ``ENV_MAX_RESTARTS``.
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
PREEMPTED_EXIT = 143  # as a shell reports a process ended by SIGTERM (128 + 15): saved, resumable
NO_PROGRESS_EXIT = 3  # restarts stopped saving progress: restarting again cannot help
ENV_ATTEMPT = "BERT_JAX_ATTEMPT"  # set by launchers: 0, then k for the k-th restart
ENV_MAX_RESTARTS = "BERT_JAX_MAX_RESTARTS"  # set by launchers: the restarts they allow
REDELIVER_SEC = 0.01  # a dropped KeyboardInterrupt is raised again this soon


class NoProgressError(RuntimeError):
  """Earlier attempts of this launch made no progress: the entry point exits
  ``NO_PROGRESS_EXIT`` with this message on one line."""


def restartable(status: int) -> bool:
  """Whether a launcher restarts a process that ended with ``status``: a shell's exit status
  (128 + s after death by signal s) or ``subprocess``'s returncode (-s). True for 143 (saved
  after SIGTERM) and death by any signal but SIGINT (SIGKILL, a lost node); False for 0, 1, 2,
  3 and 130 (Ctrl-C) and any other exit status."""
  signum = -status if status < 0 else status - 128 if status > 128 else 0
  return signum in signal.valid_signals() and signum != signal.SIGINT


class InterruptHandler:
  """The SIGINT handler of an entry point (see the module docstring). ``count``: the Ctrl-Cs
  received, the ones a training loop took included."""

  def __init__(self, prog: str):
    self.prog = prog
    self.count = 0
    self.stopped_at: int | None = None  # the step a training loop saved when a signal stopped it
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

  def record_stop(self, step: int) -> None:
    """A training loop stopped on SIGTERM or Ctrl-C (of this process or another of the job)
    after saving ``step``: the entry point exits 143 (130 when a Ctrl-C came)."""
    self.stopped_at = step

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
