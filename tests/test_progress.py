"""Long work is never silent: Progress and Heartbeat log at the documented interval."""

from __future__ import annotations

import time

from bert_jax.train.progress import Heartbeat, Progress, format_duration


class FakeClock:
  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


def test_progress_logs_every_interval_with_eta_and_a_closing_line():
  clock, lines = FakeClock(), []
  with Progress("evaluating dev", total=10, interval_sec=30, log=lines.append, clock=clock) as p:
    for _ in range(10):
      clock.now += 10.0  # 10 s a batch: a line every third batch
      p.update()
  assert lines == [
    "evaluating dev: 3/10 batches (30%), 0.10 batches/s, elapsed 0m30s, eta 1m10s",
    "evaluating dev: 6/10 batches (60%), 0.10 batches/s, elapsed 1m00s, eta 0m40s",
    "evaluating dev: 9/10 batches (90%), 0.10 batches/s, elapsed 1m30s, eta 0m10s",
    "evaluating dev: 10/10 batches (100%), 0.10 batches/s, elapsed 1m40s (done)",
  ]


def test_progress_quiet_when_work_is_short():
  clock, lines = FakeClock(), []
  with Progress("predicting", total=5, log=lines.append, clock=clock) as p:
    for _ in range(5):
      clock.now += 1.0
      p.update()
  assert lines == []


def test_heartbeat_beats_while_the_block_runs():
  lines: list[str] = []
  with Heartbeat("compiling", interval_sec=0.05, log=lines.append) as beat:
    time.sleep(0.3)
  assert beat.beats >= 2 and all(line.startswith("compiling: still running, ") for line in lines)
  n = len(lines)
  time.sleep(0.15)
  assert len(lines) == n  # stopped with the block


def test_format_duration():
  assert [format_duration(s) for s in (7, 750, 3900)] == ["0m07s", "12m30s", "1h05m"]
