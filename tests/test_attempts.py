"""The record of a launch's attempts (bert_jax.train.attempts) against hand-written
attempts.json files: which records belong to this launch, the restarts and steps lost that
summary.json gets, and when an attempt is refused for lack of progress."""

from __future__ import annotations

import json

import pytest

from bert_jax.interrupts import NO_PROGRESS_EXIT, PREEMPTED_EXIT, NoProgressError, restartable
from bert_jax.train.attempts import Attempts


def write(workdir, *records):
  workdir.mkdir(exist_ok=True)
  (workdir / "attempts.json").write_text(json.dumps({"attempts": list(records)}))


def rec(attempt, resumed, last, ended="died"):
  return dict(attempt=attempt, resumed_from_step=resumed, last_step=last, ended=ended)


def env(attempt, max_restarts=3):
  return {"BERT_JAX_ATTEMPT": str(attempt), "BERT_JAX_MAX_RESTARTS": str(max_restarts)}


def test_a_plain_run_reads_and_writes_nothing(tmp_path):
  write(tmp_path, rec(0, 4, 4), rec(1, 4, 4), rec(2, 4, 4), rec(3, 4, 4))
  before = (tmp_path / "attempts.json").read_text()
  attempts = Attempts.from_environ(str(tmp_path), {})
  attempts.refuse_without_progress(4)
  attempts.start(4, writer=True)
  attempts.reached(10)
  attempts.end("completed", 10)
  assert attempts.restarts() == []
  assert (tmp_path / "attempts.json").read_text() == before


def test_restarts_and_steps_lost_of_this_launch_only(tmp_path):
  # An earlier launch (attempts 0-2), then this one: attempt 0 from scratch reached step 7
  # (checkpoint 5), attempt 1 from 5 reached 12 and saved 10; this is attempt 2, from 10.
  write(
    tmp_path,
    rec(0, 0, 3, "preempted"),
    rec(1, 3, 8),
    rec(2, 5, 5, "failed: ValueError"),
    rec(0, 0, 7),
    rec(1, 5, 12, None),
  )
  attempts = Attempts.from_environ(str(tmp_path), env(2))
  attempts.start(10, writer=True)
  attempts.end("completed", 20)
  assert attempts.restarts() == [
    dict(attempt=1, resumed_from_step=5, steps_lost=2),
    dict(attempt=2, resumed_from_step=10, steps_lost=2),
  ]
  records = json.loads((tmp_path / "attempts.json").read_text())["attempts"]
  assert [(r["attempt"], r["ended"]) for r in records] == [
    (0, "preempted"),
    (1, "died"),
    (2, "failed: ValueError"),
    (0, "died"),
    (1, "died"),  # it left no end: killed
    (2, "completed"),
  ]
  assert records[-1]["resumed_from_step"] == 10 and records[-1]["last_step"] == 20


def test_progress_is_written_as_the_run_goes_by_process_0_only(tmp_path):
  write(tmp_path, rec(0, 0, 3))
  other = Attempts.from_environ(str(tmp_path), env(1))
  first = Attempts.from_environ(str(tmp_path), env(1))
  first.start(3, writer=True)
  other.start(3, writer=False)  # reads after process 0 wrote this attempt: the same view
  assert (
    other.restarts() == first.restarts() == [dict(attempt=1, resumed_from_step=3, steps_lost=0)]
  )
  first.written_at = 0.0  # as if the last write was long ago
  first.reached(5)
  other.reached(9)
  records = json.loads((tmp_path / "attempts.json").read_text())["attempts"]
  assert [r["last_step"] for r in records] == [3, 5] and records[1]["ended"] is None


@pytest.mark.parametrize(
  "records, attempt, refused",
  [
    ([rec(0, 4, 9), rec(1, 4, 4), rec(2, 4, 6)], 3, True),  # 3 attempts from step 4
    ([rec(0, 0, 9), rec(1, 4, 4), rec(2, 4, 6)], 3, False),  # the first saved step 4
    ([rec(0, 4, 9), rec(1, 4, 4)], 2, False),  # only 2 of 3
    ([rec(0, 4, 4), rec(1, 4, 4), rec(2, 4, 4)], 0, False),  # an earlier launch's
    ([rec(0, 4, 4), rec(1, 4, 4), rec(2, 4, 4), rec(3, 4, 4)], 5, True),  # requeued past N
  ],
)
def test_no_progress_is_n_attempts_resumed_from_the_step_this_one_would(
  tmp_path, records, attempt, refused
):
  write(tmp_path, *records)
  attempts = Attempts.from_environ(str(tmp_path), env(attempt))
  if not refused:
    attempts.refuse_without_progress(4)
    attempts.refuse_without_progress(5)
    return
  with pytest.raises(NoProgressError, match=r"^no progress: attempts [\d, ]+ each resumed from"):
    attempts.refuse_without_progress(4)
  attempts.refuse_without_progress(5)  # a later checkpoint: progress


def test_restarts_off_never_refuses(tmp_path):
  write(tmp_path, rec(0, 4, 4), rec(1, 4, 4))
  Attempts.from_environ(str(tmp_path), env(2, max_restarts=0)).refuse_without_progress(4)


@pytest.mark.parametrize(
  "environ, message",
  [
    ({"BERT_JAX_ATTEMPT": "one"}, "BERT_JAX_ATTEMPT='one': expected a whole number >= 0"),
    ({"BERT_JAX_ATTEMPT": "1", "BERT_JAX_MAX_RESTARTS": "-2"}, "BERT_JAX_MAX_RESTARTS='-2'"),
  ],
)
def test_a_malformed_environment_is_a_one_line_error(tmp_path, environ, message):
  with pytest.raises(ValueError, match=message):
    Attempts.from_environ(str(tmp_path), environ)


def test_a_file_that_is_not_an_attempts_file_is_named(tmp_path):
  (tmp_path / "attempts.json").write_text(json.dumps([{"attempt": 0}]))
  with pytest.raises(ValueError, match="attempts.json: not an attempts file"):
    Attempts.from_environ(str(tmp_path), env(1))


@pytest.mark.parametrize(
  "status, restarted",
  [(0, False), (1, False), (2, False), (NO_PROGRESS_EXIT, False), (130, False), (-2, False)]
  + [(PREEMPTED_EXIT, True), (-9, True), (137, True), (-15, True), (-11, True), (255, False)],
)
def test_which_statuses_a_launcher_restarts(status, restarted):
  assert restartable(status) is restarted
