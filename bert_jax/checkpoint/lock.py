"""One run per workdir: a lock held for the life of a run, ``<workdir>/.lock``.

  with WorkdirLock(workdir, purpose="pretrain") as lock:
    ...  # the run; the loop calls lock.check() before each save

The lock file holds JSON ``{"host", "pid", "start_time", "run_id", "purpose"}``. Two modes:

* ``flock`` (local disks and network file systems with POSIX locks, the default for paths
  without a ``scheme://``): the file is opened with ``O_CREAT`` and locked with
  ``fcntl.flock(LOCK_EX | LOCK_NB)`` for the life of the run. A second run on the workdir
  cannot take the lock and is refused with ``WorkdirLockedError`` naming the holder's host and
  pid. The kernel releases a flock when its process ends, however it ends (kill -9 included),
  so a lock file left by a run that died is stale by construction: the next run takes it over
  and logs whose it was. The file is removed on exit (also after an exception).
* ``run_id`` (object stores such as ``gs://`` and ``s3://``, which have no locks): nothing
  can refuse a second run, so the lock file is a claim. A run writes its run id at start (and
  logs the previous claim it replaces); ``check()`` re-reads the file and raises
  ``WorkdirTakenOverError`` if the run id changed, i.e. another run started on the workdir
  since. The training loop calls ``check()`` before each save, so the earlier of two runs stops
  at its next save, loudly, instead of both writing checkpoints and summaries into one place.
  ``check()`` does the same test in ``flock`` mode (the file removed or replaced by hand).

Multi-process runs: only process 0 takes the lock and checks it (``process_index``, default
``jax.process_index()``); the other processes' lock is a no-op. An error on process 0 ends
that process, and the multi-process runtime (or the launcher) ends the others.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import uuid
from typing import Any

import jax
from absl import logging
from etils import epath

LOCK_FILE = ".lock"
MODES = ("auto", "flock", "run_id")


class WorkdirLockError(RuntimeError):
  """The workdir is, or has become, another run's."""


class WorkdirLockedError(WorkdirLockError):
  """Another live run holds the workdir's lock."""


class WorkdirTakenOverError(WorkdirLockError):
  """Another run claimed the workdir while this one was running."""


def _is_object_store(workdir: str) -> bool:
  scheme, sep, _ = str(workdir).partition("://")
  return bool(sep) and scheme != "file"


def _describe(info: dict[str, Any] | None) -> str:
  if not info:
    return "an unknown run (lock file unreadable)"
  return (
    f"{info.get('purpose', 'a run')} on host {info.get('host', '?')}, pid {info.get('pid', '?')}"
    f", started {info.get('start_time', '?')}, run id {info.get('run_id', '?')}"
  )


def _parse(text: str) -> dict[str, Any] | None:
  try:
    info = json.loads(text)
  except json.JSONDecodeError:
    return None
  return info if isinstance(info, dict) else None


class WorkdirLock:
  """The lock of one run on ``workdir`` (see the module docstring); a context manager."""

  def __init__(
    self,
    workdir: str,
    purpose: str = "run",
    process_index: int | None = None,
    mode: str = "auto",
  ):
    if mode not in MODES:
      raise ValueError(f"lock mode {mode!r}: choose one of {MODES}")
    self.workdir = str(workdir)
    self.purpose = purpose
    self._process_index = process_index
    if mode == "auto":
      mode = "run_id" if _is_object_store(self.workdir) else "flock"
    self.mode = mode
    self.path = os.path.join(self.workdir, LOCK_FILE)
    self.run_id = uuid.uuid4().hex
    self.info: dict[str, Any] = {}
    self.previous: dict[str, Any] | None = None  # the stale or replaced holder, if any
    self._fd: int | None = None
    self._active = False

  def __enter__(self) -> WorkdirLock:
    self.acquire()
    return self

  def __exit__(self, *exc) -> None:
    self.release()

  def acquire(self) -> None:
    index = jax.process_index() if self._process_index is None else self._process_index
    if index != 0:
      return
    self.info = {
      "host": socket.gethostname(),
      "pid": os.getpid(),
      "start_time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
      "run_id": self.run_id,
      "purpose": self.purpose,
    }
    if self.mode == "flock":
      self._acquire_flock()
    else:
      self._acquire_run_id()
    self._active = True

  def _make_workdir(self) -> None:
    if os.path.exists(self.workdir) and not os.path.isdir(self.workdir):
      raise NotADirectoryError(f"workdir {self.workdir} is a file, not a directory")
    os.makedirs(self.workdir, exist_ok=True)

  def _acquire_flock(self) -> None:
    self._make_workdir()
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
          raise
        holder = self._read()
        raise WorkdirLockedError(
          f"workdir {self.workdir} is in use by {_describe(holder)} (lock file {self.path});"
          " wait for that run to end or use another workdir"
        ) from None
      # The holder may have released (removed the file) between our open and flock: then we
      # hold a lock on a removed file; start again on the current one.
      try:
        current = os.stat(self.path).st_ino == os.fstat(fd).st_ino
      except FileNotFoundError:
        current = False
      if current:
        break
      os.close(fd)
    text = b""
    while chunk := os.read(fd, 65536):
      text += chunk
    if text:
      self.previous = _parse(text.decode("utf-8", "replace"))
      logging.warning(
        "Taking over the stale lock of %s: that run has ended (its lock was released); %s",
        _describe(self.previous),
        self.path,
      )
    data = json.dumps(self.info).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)
    self._fd = fd

  def _acquire_run_id(self) -> None:
    path = epath.Path(self.workdir)
    path.mkdir(parents=True, exist_ok=True)
    self.previous = self._read()
    if self.previous is not None:
      logging.warning(
        "Workdir %s was claimed by %s; this run (%s) replaces the claim: that run, if it is "
        "still going, stops with an error at its next save (object stores have no locks)",
        self.workdir,
        _describe(self.previous),
        self.run_id,
      )
    (path / LOCK_FILE).write_text(json.dumps(self.info))

  def _read(self) -> dict[str, Any] | None:
    try:
      return _parse(epath.Path(self.path).read_text())
    except (FileNotFoundError, IsADirectoryError):
      return None

  def check(self) -> None:
    """Raises ``WorkdirTakenOverError`` if the workdir is no longer this run's (before saves)."""
    if not self._active:
      return
    current = self._read()
    if current is None or current.get("run_id") != self.run_id:
      raise WorkdirTakenOverError(
        f"workdir {self.workdir} is no longer this run's ({self.purpose}, run id {self.run_id}):"
        f" {self.path} now names "
        + (_describe(current) if current is not None else "no run (it was removed)")
        + "; stopping before writing over that run's checkpoints"
      )

  def release(self) -> None:
    """Removes the lock file if it is still this run's, and releases the lock."""
    if not self._active:
      return
    self._active = False
    try:
      current = self._read()
      if current is not None and current.get("run_id") == self.run_id:
        epath.Path(self.path).unlink(missing_ok=True)
    finally:
      if self._fd is not None:
        os.close(self._fd)  # drops the flock
        self._fd = None
