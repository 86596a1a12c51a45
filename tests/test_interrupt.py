"""Ctrl-C works from the first second: an entry point stopped by SIGINT at any moment (importing,
preparing its data, compiling, training) exits with status 130 promptly, one line saying so, and
a run that was training saves a checkpoint first (bert_jax.interrupts, bert_jax.cli)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO, subprocess_env_for

from bert_jax.interrupts import INTERRUPTED_EXIT, InterruptHandler


def _sigint_inside_a_gc_callback(*args):
  del args
  gc.callbacks.remove(_sigint_inside_a_gc_callback)
  signal.raise_signal(signal.SIGINT)  # its handler runs here, inside the callback


def _collect_and_spin(seconds: float = 5.0) -> None:
  gc.callbacks.append(_sigint_inside_a_gc_callback)
  try:
    gc.collect()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
      time.sleep(0.01)
  finally:
    if _sigint_inside_a_gc_callback in gc.callbacks:
      gc.callbacks.remove(_sigint_inside_a_gc_callback)


def test_python_drops_a_ctrl_c_raised_inside_a_gc_callback():
  """The failure itself (as XLA's _xla_gc_callback showed it): without the handler, the
  KeyboardInterrupt raised in a gc callback is printed as 'Exception ignored' and lost."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  seen = []
  hook, sys.unraisablehook = sys.unraisablehook, lambda u: seen.append(u.exc_type)
  try:
    _collect_and_spin(0.2)  # returns: nothing stopped it
  finally:
    sys.unraisablehook = hook
    signal.signal(signal.SIGINT, previous)
  assert seen == [KeyboardInterrupt]


def test_a_ctrl_c_dropped_by_a_callback_is_delivered_again():
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  handler = InterruptHandler("test")
  t0 = time.monotonic()
  try:
    with pytest.raises(KeyboardInterrupt), handler.installed():
      _collect_and_spin(5.0)
  finally:
    signal.signal(signal.SIGINT, previous)
  assert time.monotonic() - t0 < 4.0  # at once, not after the 5 s spin (a loaded host: slack)
  assert handler.count == 1  # delivered again, but one Ctrl-C
  assert signal.getsignal(signal.SIGINT) is previous  # restored


def test_a_training_loops_own_handler_reports_the_ctrl_c():
  from bert_jax.train.loop import PreemptionWatcher

  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  handler = InterruptHandler("test")
  try:
    with handler.installed(), PreemptionWatcher() as watcher:
      signal.raise_signal(signal.SIGINT)  # the loop's: save, then stop; no exception
      assert watcher.requested()
  finally:
    signal.signal(signal.SIGINT, previous)
  assert handler.count == 1


def test_a_ctrl_c_something_swallowed_stops_the_next_training_loop():
  from bert_jax.train.loop import PreemptionWatcher

  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  handler = InterruptHandler("test")
  try:
    with handler.installed():
      try:
        signal.raise_signal(signal.SIGINT)
      except BaseException:  # what some library code does
        pass
      with PreemptionWatcher() as watcher:
        assert watcher.requested()  # the loop saves after its first step and stops
      with PreemptionWatcher() as watcher, pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)  # another Ctrl-C: the second, at once
  finally:
    signal.signal(signal.SIGINT, previous)
  assert handler.count == 2


def _pretrain(workdir, corpus_dir, *extra):
  return [
    sys.executable,
    "-m",
    "bert_jax.pretrain",
    "--config=configs/pretrain.py:tiny",
    f"--workdir={workdir}",
    f"--config.default_corpus_dir={corpus_dir}",
    "--config.phase2.fraction=0",
    "--config.train_batch_size=8",
    "--config.eval_batch_size=8",
    "--config.max_eval_steps=1",
    "--config.logging.log_every_steps=1",
    *extra,
  ]


def _interrupt(cmd, marker: str | None, delay: float, timeout: float = 240):
  """Runs ``cmd``, sends SIGINT ``delay`` s after the start (``marker`` None) or after the first
  output line containing ``marker``; returns (status, output, seconds from SIGINT to exit)."""
  proc = subprocess.Popen(
    cmd,
    cwd=REPO,
    env=subprocess_env_for(1),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  lines, sent = [], []

  def fire():
    time.sleep(delay)
    sent.append(time.monotonic())
    proc.send_signal(signal.SIGINT)

  if marker is None:
    threading.Thread(target=fire, daemon=True).start()

  def read():
    for line in proc.stdout:
      lines.append(line)
      if marker is not None and not sent and marker in line:
        threading.Thread(target=fire, daemon=True).start()
        sent.append(None)

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  try:
    code = proc.wait(timeout=timeout)
  finally:
    proc.kill()
  reader.join(10)
  out = "".join(lines)
  assert sent and sent[-1] is not None, f"never sent: {marker!r} not seen\n{out[-3000:]}"
  return code, out, time.monotonic() - sent[-1]


@pytest.mark.parametrize("delay", [0.3, 1.0])
def test_ctrl_c_in_the_first_second_stops_the_entry_point(tmp_path, delay):
  code, out, took = _interrupt(_pretrain(tmp_path / "w", tmp_path / "c"), None, delay)
  # Still importing (Python's own handler: it ends by SIGINT, which a shell shows as 130) or
  # already in the entry point (one line, status 130).
  assert code in (INTERRUPTED_EXIT, -signal.SIGINT), out[-3000:]
  if code == INTERRUPTED_EXIT:
    assert out.rstrip().splitlines()[-1] == "pretrain: interrupted (Ctrl-C): stopped", out[-3000:]
  assert took < 30, out[-3000:]
  assert not (tmp_path / "w" / "checkpoints").exists()


@pytest.mark.slow
def test_ctrl_c_while_the_data_is_prepared_stops_at_once(tmp_path):
  code, out, took = _interrupt(
    _pretrain(tmp_path / "w", tmp_path / "c"), "generating shards", 0.2, timeout=300
  )
  assert code == INTERRUPTED_EXIT, out[-3000:]
  assert out.rstrip().splitlines()[-1] == "pretrain: interrupted (Ctrl-C): stopped", out[-3000:]
  assert took < 30, out[-3000:]
  assert "Done (" not in out and "step 1/" not in out


@pytest.mark.slow
@pytest.mark.parametrize("marker", ["Pre-training tiny", "step 1/"])
def test_ctrl_c_before_or_during_training_saves_and_exits_130(tmp_path, marker):
  """0.4 s after the run's first line (where XLA's gc callback swallowed it) and after the
  first step: the run stops (saving where it trained), status 130, well before its end."""
  cmd = _pretrain(
    tmp_path / "w", tmp_path / "c", "--config.num_train_steps=400", "--config.eval_every_steps=0"
  )
  code, out, took = _interrupt(cmd, marker, 0.4, timeout=400)
  assert code == INTERRUPTED_EXIT, out[-3000:]
  assert took < 120, out[-3000:]
  assert "Done (completed)" not in out and "step 400/400" not in out, out[-3000:]
  last = out.rstrip().splitlines()[-1]
  if "after the stop signal" in out:  # the loop took it: a checkpoint, then the line
    steps = [int(s) for s in os.listdir(tmp_path / "w" / "checkpoints") if s.isdigit()]
    assert steps and max(steps) < 400
    assert last.startswith("pretrain: interrupted (Ctrl-C): stopped after saving"), last
  else:
    assert last == "pretrain: interrupted (Ctrl-C): stopped", out[-3000:]
  if marker == "step 1/":
    assert "after the stop signal" in out, out[-3000:]
