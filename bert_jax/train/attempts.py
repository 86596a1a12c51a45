"""The attempts of one launch: which restart this is, how far each got, and when to stop.

A launcher that restarts a job after a preemption or a lost process (``launch/targets``) gives
every process ``BERT_JAX_ATTEMPT`` (0, then k for the k-th restart) and
``BERT_JAX_MAX_RESTARTS`` (N). The trainer keeps the record of the attempts:

  attempts = Attempts.from_environ(workdir)          # a plain run when BERT_JAX_ATTEMPT is unset
  attempts.refuse_without_progress(resume_step)      # NoProgressError, before any work
  attempts.start(resume_step, writer=process 0)      # logs "attempt k of at most N+1 (restart k)"
  attempts.reached(step)                             # at each progress line
  attempts.end("completed")                          # or "preempted", "interrupted", "failed: ..."
  summary["restarts"] = attempts.restarts()

``<workdir>/attempts.json`` (process 0 writes it, replacing it atomically) holds
``{"attempts": [record, ...]}``, one record per attempt in the order they started:
``attempt``, ``max_restarts``, ``started`` (UTC, ISO 8601), ``resumed_from_step`` (the latest
checkpoint's step when the attempt started; 0 for none), ``last_step`` (the last step reached
by a progress line, written at most every ``WRITE_INTERVAL_SEC``; at the end the step the
attempt stopped at), ``ended`` (null while it runs; how it ended; ``"died"`` when the next
attempt found it without an end: killed by a signal, its node lost) and ``ended_at``. The
attempts of one launch are the records back from the last one whose attempt numbers fall
(a new launch starts at attempt 0 again; the records of earlier launches stay).

``restarts()`` lists, for each restart of this launch, ``{attempt, resumed_from_step,
steps_lost}``: the steps the attempt before reached beyond the checkpoint this one resumed from
(trained again). A restart cannot help when the last N attempts all resumed from the step this
one would resume from: none of them saved a later checkpoint (they died before their next save,
or at the same place each time). ``refuse_without_progress`` then raises NoProgressError (the
entry point exits 3 with one line) before any work.

A plain run (``BERT_JAX_ATTEMPT`` unset: run by hand or by a launcher that does not restart)
reads and writes no attempts.json, logs no attempt line, and its summary's ``restarts`` is [].
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Mapping

from absl import logging
from etils import epath

from bert_jax.checkpoint import read_json, write_json
from bert_jax.interrupts import ENV_ATTEMPT, ENV_MAX_RESTARTS, NoProgressError

ATTEMPTS_FILE = "attempts.json"
WRITE_INTERVAL_SEC = 5.0  # progress is written at most this often (an object store is slow)


def _now() -> str:
  return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _count(environ: Mapping[str, str], name: str, default: int | None) -> int | None:
  value = environ.get(name, "").strip()
  if not value:
    return default
  try:
    number = int(value)
  except ValueError:
    number = -1
  if number < 0:
    raise ValueError(f"{name}={value!r}: expected a whole number >= 0 (set by the launcher)")
  return number


def read_records(path: str) -> list[dict]:
  """The attempt records in ``path`` ([] when there is none); ValueError naming the file when
  it is not an attempts file."""
  if not epath.Path(path).exists():
    return []
  data = read_json(path)
  records = data.get("attempts") if isinstance(data, dict) else None
  if not isinstance(records, list) or not all(
    isinstance(r, dict) and isinstance(r.get("attempt"), int) for r in records
  ):
    raise ValueError(
      f'{path}: not an attempts file (expected {{"attempts": [{{"attempt": 0, ...}}, ...]}}); '
      "move it away to start a new record"
    )
  return records


@dataclasses.dataclass
class Attempts:
  """This attempt of a launch and the records of the attempts before it (module docstring).

  ``attempt`` None: a plain run; every method then does nothing."""

  workdir: str
  attempt: int | None = None
  max_restarts: int = 0
  records: list[dict] = dataclasses.field(default_factory=list)  # this attempt's included
  writer: bool = False  # process 0: the one that writes attempts.json
  current: dict | None = None  # this attempt's record, once started
  written_at: float = 0.0

  @classmethod
  def from_environ(cls, workdir: str, environ: Mapping[str, str] = os.environ) -> Attempts:
    """The attempt the launcher's environment names, with the workdir's records; a plain run
    without ``BERT_JAX_ATTEMPT``. A malformed variable or file is a one-line ValueError."""
    attempt = _count(environ, ENV_ATTEMPT, None)
    if attempt is None:
      return cls(workdir)
    max_restarts = _count(environ, ENV_MAX_RESTARTS, 0)
    return cls(workdir, attempt, max_restarts, read_records(cls.path_in(workdir)))

  @staticmethod
  def path_in(workdir: str) -> str:
    return os.path.join(workdir, ATTEMPTS_FILE)

  @property
  def path(self) -> str:
    return self.path_in(self.workdir)

  def earlier(self) -> list[dict]:
    """The records of this launch's attempts before this one, oldest first: back from the
    last record while the attempt numbers fall below this one's. (A record of this attempt
    itself, which process 0 may have written already, is passed over.)"""
    out: list[dict] = []
    below = self.attempt
    for record in reversed(self.records):
      if record is self.current or (not out and record["attempt"] == self.attempt):
        continue
      if record["attempt"] >= below:
        break
      out.append(record)
      below = record["attempt"]
    return out[::-1]

  def refuse_without_progress(self, resume_step: int) -> None:
    """NoProgressError when the last ``max_restarts`` attempts of this launch (at least one)
    all resumed from ``resume_step``, the step this attempt would resume from."""
    if self.attempt is None or self.max_restarts < 1:
      return
    recent = self.earlier()[-self.max_restarts :]
    if len(recent) < self.max_restarts or any(
      r.get("resumed_from_step") != resume_step for r in recent
    ):
      return
    numbers = ", ".join(str(r["attempt"]) for r in recent)
    reached = ", ".join(str(r.get("last_step")) for r in recent)
    raise NoProgressError(
      f"no progress: attempts {numbers} each resumed from step {resume_step} and none saved a "
      f"later checkpoint (they reached steps {reached}); attempt {self.attempt} stops here "
      f"instead of training again ({ENV_MAX_RESTARTS}={self.max_restarts}; {self.path})"
    )

  def start(self, resume_step: int, writer: bool) -> None:
    """Records this attempt (``writer``: process 0 writes the file), marks earlier attempts
    that left no end as ``"died"``, and logs the attempt and the steps the last one lost."""
    if self.attempt is None:
      return
    self.writer = writer
    earlier = self.earlier()
    if self.attempt > 0:
      logging.info(
        "attempt %d of at most %d (restart %d)",
        self.attempt,
        self.max_restarts + 1,
        self.attempt,
      )
      if earlier:
        logging.info(
          "Attempt %d reached step %s; resuming from step %d (%d steps to train again)",
          earlier[-1]["attempt"],
          earlier[-1].get("last_step"),
          resume_step,
          self._lost(earlier[-1], resume_step),
        )
    for record in earlier:
      if record.get("ended") is None:
        record["ended"] = "died"
    self.current = dict(
      attempt=self.attempt,
      max_restarts=self.max_restarts,
      started=_now(),
      resumed_from_step=resume_step,
      last_step=resume_step,
      ended=None,
      ended_at=None,
    )
    self.records.append(self.current)
    self._write()

  def reached(self, step: int) -> None:
    """The run reached ``step`` (a progress line): written at most every
    ``WRITE_INTERVAL_SEC``."""
    if self.current is None or step <= self.current["last_step"]:
      return
    self.current["last_step"] = step
    if time.monotonic() - self.written_at >= WRITE_INTERVAL_SEC:
      self._write()

  def end(self, how: str, step: int | None = None) -> None:
    """How this attempt ended (and the step it stopped at, when known)."""
    if self.current is None:
      return
    if step is not None:
      self.current["last_step"] = max(step, self.current["last_step"])
    self.current["ended"] = how
    self.current["ended_at"] = _now()
    self._write()

  def restarts(self) -> list[dict]:
    """``{attempt, resumed_from_step, steps_lost}`` for each restart of this launch up to this
    attempt (summary.json's ``restarts``)."""
    if self.current is None:
      return []
    chain = [*self.earlier(), self.current]
    return [
      dict(
        attempt=record["attempt"],
        resumed_from_step=record.get("resumed_from_step"),
        steps_lost=self._lost(before, record.get("resumed_from_step")),
      )
      for before, record in zip(chain, chain[1:])
    ]

  @staticmethod
  def _lost(before: dict, resumed_from: int | None) -> int:
    last = before.get("last_step")
    if not isinstance(last, int) or not isinstance(resumed_from, int):
      return 0
    return max(0, last - resumed_from)

  def _write(self) -> None:
    self.written_at = time.monotonic()
    if self.writer:
      write_json(self.path, {"attempts": self.records})
