"""Local launches: N processes joined with jax.distributed, logs, exit codes, kill-all.

These tests use a stand-in interpreter (seconds). Real two-process pre-training launched
through ``python -m launch`` (both processes in one jax.distributed job, the same losses as one
process, checkpoints, the launch record) is tested in test_pretrain.py.
"""

import json
import os
import pathlib
import stat
import subprocess
import sys
import time

from launch.job import Job
from launch.launch import launch
from launch.targets import LocalTarget

REPO = pathlib.Path(__file__).resolve().parent.parent


def fake_python(tmp_path, body):
  path = tmp_path / "fake_python"
  path.write_text(f"#!{sys.executable}\nimport json, os, sys, time\n{body}\n")
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return str(path)


def test_each_process_gets_its_coordinates_and_its_log(tmp_path):
  python = fake_python(
    tmp_path,
    """
keys = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "XLA_FLAGS")
print(json.dumps({k: os.environ.get(k) for k in keys}))
""",
  )
  job = Job("pretrain", "", str(tmp_path / "run"), python=python)
  target = LocalTarget(num_processes=3, cpu_devices_per_process=2, echo=False)
  assert target.run(job) == 0
  logs = [(tmp_path / "run" / "logs" / f"process_{i}.log").read_text() for i in range(3)]
  assert all(log.startswith("launch: attempt 0 of at most 4, started ") for log in logs)
  envs = [json.loads(log.splitlines()[1]) for log in logs]
  assert [e["JAX_PROCESS_ID"] for e in envs] == ["0", "1", "2"]
  assert {e["JAX_NUM_PROCESSES"] for e in envs} == {"3"}
  coordinators = {e["JAX_COORDINATOR_ADDRESS"] for e in envs}
  assert len(coordinators) == 1 and coordinators.pop().startswith("localhost:")
  assert all("--xla_force_host_platform_device_count=2" in e["XLA_FLAGS"] for e in envs)


def test_one_failing_process_stops_the_others_and_sets_the_status(tmp_path):
  python = fake_python(
    tmp_path,
    """
open(os.path.join(sys.argv[-1].split("=", 1)[1], "pid_%s" % os.environ["JAX_PROCESS_ID"]),
     "w").write(str(os.getpid()))
if os.environ["JAX_PROCESS_ID"] == "1":
  time.sleep(1)
  print("process 1 gives up", flush=True)
  sys.exit(3)
time.sleep(120)
open(os.path.join(sys.argv[-1].split("=", 1)[1], "slept_%s" % os.environ["JAX_PROCESS_ID"]),
     "w").close()
""",
  )
  workdir = tmp_path / "run"
  workdir.mkdir()
  job = Job("pretrain", "", str(workdir), python=python)
  status = LocalTarget(num_processes=3, kill_grace_s=2, echo=False).run(job)
  assert status == 3
  for i in (0, 2):  # the sleepers were stopped, not left to finish their sleep
    assert not (workdir / f"slept_{i}").exists()
    pid = int((workdir / f"pid_{i}").read_text())
    assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read()
  assert "process 1 gives up" in (workdir / "logs" / "process_1.log").read_text()


def test_sigterm_to_the_launcher_reaches_every_process(tmp_path):
  """Pre-emption of the launcher: each process gets SIGTERM (and can save), status 143."""
  python = fake_python(
    tmp_path,
    """
import signal
workdir = sys.argv[-1].split("=", 1)[1]
me = os.environ["JAX_PROCESS_ID"]
def on_term(signum, frame):
  open(os.path.join(workdir, "saved_" + me), "w").write("checkpoint")
  sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(workdir, "ready_" + me), "w").close()
time.sleep(120)
""",
  )
  workdir = tmp_path / "run"
  workdir.mkdir()
  launcher = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "launch",
      "run",
      f"--workdir={workdir}",
      f"--python={python}",
      "--target=local",
      "--num_processes=2",
      "--kill_grace_s=20",
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  deadline = time.monotonic() + 120
  while not all((workdir / f"ready_{i}").exists() for i in range(2)):
    assert time.monotonic() < deadline and launcher.poll() is None, launcher.stdout.read()
    time.sleep(0.2)
  launcher.terminate()
  assert launcher.wait(timeout=60) == 143
  assert all((workdir / f"saved_{i}").read_text() == "checkpoint" for i in range(2))


def test_launch_json_of_an_earlier_launch_is_kept(tmp_path):
  python = fake_python(tmp_path, "pass")
  workdir = tmp_path / "run"
  job = Job(
    "finetune", "configs/glue.py:rte", str(workdir), python=python, overrides=(("seed", 3),)
  )
  target = LocalTarget(echo=False)
  assert launch(job, target) == 0
  first = json.loads((workdir / "launch.json").read_text())
  time.sleep(1.1)  # launched_at has a resolution of seconds
  assert launch(job.replace(overrides=(("seed", 4),)), target) == 0
  assert json.loads((workdir / "launch.json").read_text())["config"]["seed"] == 4
  kept = [p for p in workdir.glob("launch.*.json")]
  assert len(kept) == 1 and json.loads(kept[0].read_text()) == first
  assert first["config"]["seed"] == 3 and first["overrides"] == {"seed": 3}
