"""Restarts on the local target: a job whose process is preempted (exit 143) or killed by a
signal runs again, whole, on a fresh coordinator port, up to --max_restarts times; nothing else
is restarted. Stand-in interpreters (seconds) show the launcher's rules; real pre-training shows
the contract end to end: a SIGKILLed process's job comes back by itself and trains the same
losses as an uninterrupted run, SIGTERM exits 143 after saving, a usage error is status 2 once,
and an attempt the earlier ones show cannot progress exits 3 before any work."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import REPO, subprocess_env_for
from launch_fakes import executable
from test_pretrain import losses_by_step

from launch.job import Job, format_value
from launch.targets import LocalTarget


def stand_in(tmp_path, actions: dict[tuple[int, int], str]):
  """A stand-in interpreter: each start appends its attempt, process and coordinator to
  ``starts.jsonl``, then does ``actions[(attempt, process)]``: ``kill`` (SIGKILL itself),
  ``exit N``, ``wait`` (until SIGTERM, then exit 143 as a saved preemption does) or, by
  default, exit 0."""
  starts = tmp_path / "starts.jsonl"
  script = f"""#!{sys.executable}
import json, os, signal, sys, time
attempt, me = int(os.environ["BERT_JAX_ATTEMPT"]), int(os.environ.get("JAX_PROCESS_ID", "0"))
with open({str(starts)!r}, "a") as f:
  f.write(json.dumps(dict(attempt=attempt, process=me,
    max_restarts=os.environ["BERT_JAX_MAX_RESTARTS"],
    coordinator=os.environ.get("JAX_COORDINATOR_ADDRESS"))) + "\\n")
print("attempt %d process %d running" % (attempt, me), flush=True)
action = {actions!r}.get((attempt, me), "exit 0")
if action == "kill":
  time.sleep(0.5)
  os.kill(os.getpid(), signal.SIGKILL)
if action == "wait":
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  open(os.path.join({str(tmp_path)!r}, "waiting_%d" % attempt), "w").close()
  time.sleep(60)
sys.exit(int(action.split()[1]) if action.startswith("exit") else 0)
"""
  python = executable(tmp_path / "stand_in_python", script)

  def read_starts():
    if not starts.exists():
      return []
    return [json.loads(line) for line in starts.read_text().splitlines()]

  return python, read_starts


def test_a_killed_process_restarts_the_whole_job_on_a_fresh_port(tmp_path):
  python, starts = stand_in(tmp_path, {(0, 1): "kill", (0, 0): "wait"})
  job = Job("pretrain", "", str(tmp_path / "run"), python=python)
  out = io.StringIO()
  target = LocalTarget(num_processes=2, kill_grace_s=5, echo=False)
  assert target.run(job, out) == 0
  got = starts()
  assert sorted((s["attempt"], s["process"]) for s in got) == [(0, 0), (0, 1), (1, 0), (1, 1)]
  assert {s["max_restarts"] for s in got} == {"3"}
  ports = {a: {s["coordinator"] for s in got if s["attempt"] == a} for a in (0, 1)}
  assert len(ports[0]) == len(ports[1]) == 1 and ports[0] != ports[1]
  lines = out.getvalue().splitlines()
  assert len(lines) == 1 and re.fullmatch(
    r"launch: process 1 died \(SIGKILL\) at \d\d:\d\d:\d\d; restart 1 of 3", lines[0]
  ), lines
  for i in range(2):  # each attempt appends to the same log, after a line naming it
    log = (tmp_path / "run" / "logs" / f"process_{i}.log").read_text().splitlines()
    assert log[0].startswith("launch: attempt 0 of at most 4, started ")
    assert log[1] == f"attempt 0 process {i} running"
    assert log[-2].startswith("launch: attempt 1 of at most 4 (restart 1), started ")
    assert log[-1] == f"attempt 1 process {i} running"


def test_a_preempted_job_runs_max_restarts_more_times_then_ends_with_its_status(tmp_path):
  python, starts = stand_in(tmp_path, {(a, 0): "exit 143" for a in range(5)})
  out = io.StringIO()
  job = Job("pretrain", "", str(tmp_path / "run"), python=python)
  assert LocalTarget(max_restarts=2, echo=False).run(job, out) == 143
  assert [s["attempt"] for s in starts()] == [0, 1, 2]
  text = out.getvalue()
  assert "; restart 1 of 2\n" in text and "; restart 2 of 2\n" in text
  assert "launch: process 0 exited with status 143; no restart left; stopping the others" in text


@pytest.mark.parametrize("status", [1, 2, 3, 130])
def test_errors_no_progress_and_ctrl_c_are_not_restarted(tmp_path, status):
  python, starts = stand_in(tmp_path, {(0, 1): f"exit {status}", (0, 0): "wait"})
  job = Job("pretrain", "", str(tmp_path / "run"), python=python)
  assert LocalTarget(num_processes=2, kill_grace_s=5, echo=False).run(job, io.StringIO()) == status
  assert sorted(s["attempt"] for s in starts()) == [0, 0]


def test_max_restarts_0_turns_restarts_off(tmp_path):
  python, starts = stand_in(tmp_path, {(0, 0): "kill"})
  job = Job("pretrain", "", str(tmp_path / "run"), python=python)
  assert LocalTarget(max_restarts=0, echo=False).run(job, io.StringIO()) == 128 + signal.SIGKILL
  assert [s["attempt"] for s in starts()] == [0]


def _wait_for(path, proc=None, timeout=60):
  deadline = time.monotonic() + timeout
  while not path.exists():
    assert time.monotonic() < deadline and (proc is None or proc.poll() is None)
    time.sleep(0.05)


def test_a_stopped_sweep_run_is_not_restarted(tmp_path):
  """The sweep's stop reaches the processes as SIGTERM; their 143 is not a preemption to undo."""
  python, starts = stand_in(tmp_path, {(0, 0): "wait"})
  job = Job("pretrain", "", str(tmp_path / "run"), python=python)
  stop, result = threading.Event(), []
  runner = threading.Thread(
    target=lambda: result.append(LocalTarget(echo=False).run(job, io.StringIO(), stop=stop))
  )
  runner.start()
  _wait_for(tmp_path / "waiting_0")
  stop.set()
  runner.join(60)
  assert result == [128 + signal.SIGTERM]
  assert [s["attempt"] for s in starts()] == [0]


def test_ctrl_c_to_the_launcher_is_not_restarted(tmp_path):
  python, starts = stand_in(tmp_path, {(0, 0): "wait", (0, 1): "wait"})
  launcher = subprocess.Popen(
    [sys.executable, "-m", "launch", "run", f"--workdir={tmp_path / 'run'}", f"--python={python}"]
    + ["--num_processes=2", "--max_restarts=5"],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  _wait_for(tmp_path / "waiting_0", launcher)
  while len(starts()) < 2:
    time.sleep(0.05)
  launcher.send_signal(signal.SIGINT)
  output = launcher.communicate(timeout=60)[0]
  assert launcher.returncode == 130, output
  assert "launch: SIGINT; stopping every process" in output and "restart" not in output
  assert sorted(s["attempt"] for s in starts()) == [0, 0]


# --- the real entry point ---------------------------------------------------------------------

STEPS = 8


def _tiny_settings(tmp_path) -> dict:
  """Synthetic batches for a one-layer BERT (no tokenizer to load); a synchronous save after
  every step keeps a run going long enough after its first checkpoint to be killed in the
  middle."""
  model = tmp_path / "bert_config.json"
  model.write_text(
    json.dumps(
      dict(
        vocab_size=30522,  # BERT's, as synthetic batches without a vocab_file have
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
      )
    )
  )
  return {
    "synthetic_data": True,
    "bert_config_file": str(model),
    "num_train_steps": STEPS,
    "phase2.fraction": 0.0,
    "train_batch_size": 8,
    "eval_batch_size": 8,
    "max_seq_length": 32,
    "max_predictions_per_seq": 4,
    "num_warmup_steps": 1,
    "save_checkpoints_steps": 1,
    "checkpoint.async_save": False,
    "checkpoint.keep_checkpoint_max": 20,
    "eval_every_steps": 0,
    "max_eval_steps": 1,
    "logging.log_every_steps": 1,
  }


def _args(settings: dict) -> list[str]:
  return [f"--config.{k}={format_value(v)}" for k, v in settings.items()]


def _pid_of(workdir, process_id: int, attempt: int) -> int | None:
  """The pid of the entry point process ``process_id`` of ``attempt`` training in ``workdir``."""
  want = {f"JAX_PROCESS_ID={process_id}".encode(), f"BERT_JAX_ATTEMPT={attempt}".encode()}
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
      environ = set(open(f"/proc/{pid}/environ", "rb").read().split(b"\0"))
    except OSError:
      continue
    if f"--workdir={workdir}".encode() in cmdline and want <= environ:
      return int(pid)
  return None


def _checkpoints(workdir) -> list[int]:
  path = workdir / "checkpoints"
  return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit()) if path.is_dir() else []


def test_a_process_killed_mid_run_comes_back_and_trains_the_same_losses(tmp_path):
  """Two processes, one SIGKILLed once a checkpoint exists: the launch restarts the job by
  itself, it resumes and completes, with the losses of an uninterrupted run of the same steps
  (one process with two devices: the same global batches, run alongside); summary.json names
  the restart."""
  settings = _tiny_settings(tmp_path)
  workdir, reference_dir = tmp_path / "run", tmp_path / "uninterrupted"
  reference = _pretrain(
    reference_dir,
    *_args({**settings, "save_checkpoints_steps": STEPS, "checkpoint.async_save": True}),
    output=tmp_path / "uninterrupted.log",
    devices=2,
  )
  launcher = subprocess.Popen(
    [sys.executable, "-m", "launch", "run", "--job=pretrain", f"--workdir={workdir}"]
    + [f"--config={REPO}/configs/pretrain.py:tiny", "--num_processes=2"]
    + ["--cpu_devices_per_process=1", "--max_restarts=2", "--kill_grace_s=5", "--echo=false"]
    + ["--", *_args(settings)],
    cwd=REPO,
    env=subprocess_env_for(1),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  try:
    deadline = time.monotonic() + 300
    while not _checkpoints(workdir):
      assert time.monotonic() < deadline and launcher.poll() is None, launcher.stdout.read()
      time.sleep(0.05)
    saved = _checkpoints(workdir)[-1]
    pid = _pid_of(workdir, 1, attempt=0)
    assert pid is not None and saved < STEPS, launcher.stdout.read()
    os.kill(pid, signal.SIGKILL)
    output = launcher.communicate(timeout=600)[0]
    reference.wait(timeout=600)
  finally:
    launcher.kill()
    reference.kill()
  assert reference.returncode == 0, (tmp_path / "uninterrupted.log").read_text()[-3000:]
  assert launcher.returncode == 0, output[-3000:]
  assert re.search(r"^launch: process 1 died \(SIGKILL\) at \S+; restart 1 of 2$", output, re.M)
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["status"] == "completed" and summary["step"] == STEPS
  (restart,) = summary["restarts"]
  assert restart["attempt"] == 1 and saved <= restart["resumed_from_step"] < STEPS
  assert restart["steps_lost"] >= 0
  records = json.loads((workdir / "attempts.json").read_text())["attempts"]
  # Attempt 0's process 0 failed when its peer died (or was killed too, recording nothing).
  assert [r["attempt"] for r in records] == [0, 1] and records[0]["ended"] != "completed"
  assert records[1]["ended"] == "completed"
  log0 = (workdir / "logs" / "process_0.log").read_text()
  assert "attempt 1 of at most 3 (restart 1)" in log0, log0[-3000:]
  expected, got = losses_by_step(str(reference_dir)), losses_by_step(str(workdir))
  assert sorted(got) == sorted(expected) == list(range(1, STEPS + 1))
  np.testing.assert_allclose([got[s] for s in got], [expected[s] for s in got], rtol=0, atol=1e-5)
  assert json.loads((reference_dir / "summary.json").read_text())["restarts"] == []


def _pretrain(workdir, *args, output, devices=1, env=None):
  """The entry point started, its output and errors going to the file ``output``."""
  with open(output, "w") as out:
    return subprocess.Popen(
      [sys.executable, "-m", "bert_jax.pretrain", f"--config={REPO}/configs/pretrain.py:tiny"]
      + [f"--workdir={workdir}", *args],
      cwd=REPO,
      env={**subprocess_env_for(devices), **(env or {})},
      stdout=out,
      stderr=subprocess.STDOUT,
    )


def test_a_usage_error_is_one_attempt_with_status_2(tmp_path):
  workdir = tmp_path / "run"
  job = Job(
    "pretrain",
    f"{REPO}/configs/pretrain.py:tiny",
    str(workdir),
    extra_args=("--no_such_flag=1",),
    python=sys.executable,
  )
  out = io.StringIO()
  assert LocalTarget(echo=False).run(job, out) == 2
  log = (workdir / "logs" / "process_0.log").read_text()
  assert log.count("launch: attempt ") == 1 and "no_such_flag" in log, log[-3000:]
  assert "; restart " not in out.getvalue()


def test_an_attempt_after_attempts_without_progress_exits_3_before_any_work(tmp_path):
  """attempts.json shows attempts 0, 1 and 2 each resumed from step 4, the latest checkpoint:
  attempt 3 (of at most 4) refuses at once, naming the step and the attempts."""
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "4").mkdir(parents=True)
  records = [
    dict(attempt=a, resumed_from_step=4, last_step=last, ended="died")
    for a, last in enumerate([9, 4, 6])
  ]
  (workdir / "attempts.json").write_text(json.dumps({"attempts": records}))
  before = {p: p.stat().st_mtime_ns for p in workdir.rglob("*")}
  env = {"BERT_JAX_ATTEMPT": "3", "BERT_JAX_MAX_RESTARTS": "3"}
  proc = _pretrain(workdir, *_args(_tiny_settings(tmp_path)), output=tmp_path / "out", env=env)
  proc.wait(timeout=300)
  stderr = (tmp_path / "out").read_text()
  assert proc.returncode == 3, stderr[-3000:]
  last = stderr.strip().splitlines()[-1]
  assert last.startswith("pretrain: no progress: attempts 0, 1, 2 each resumed from step 4 "), last
  assert "reached steps 9, 4, 6" in last and "Traceback" not in stderr
  assert "Mesh" not in stderr  # nothing was set up
  assert {p: p.stat().st_mtime_ns for p in workdir.rglob("*")} == before
