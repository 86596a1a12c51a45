"""The TPU target's watch (launch/targets/tpu_watch.py) against a stand-in ``gcloud``.

The stand-in plays a queued resource from a plan file: its states after each create, one per
``describe``; the exit status of each ``create``; and the slice's workers, a directory each (the
worker's $HOME), made by a create and wiped by a delete, which also kills what runs there, as a
deleted VM does. Its ``tpu-vm ssh --worker=all`` runs the launcher's real command with bash on
every worker, with a fake metadata server (``curl``) and ``git``; so the job really starts in the
background (``nohup setsid``), outlives the ssh, and writes the exit status the watch reads. The
job is a fake interpreter that records its attempt and jax.distributed environment and then,
per attempt, exits with a given status or runs until it is killed. Every call is logged with
its time. Poll intervals are 0.05 s, so each test takes seconds.
"""

import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from launch_fakes import executable

from launch.job import Job, LaunchError
from launch.targets import TpuTarget

REPO = pathlib.Path(__file__).resolve().parent.parent
POLL_S = 0.05

GCLOUD = r"""#!{python}
import json, os, shutil, signal, subprocess, sys, time

cloud = os.environ["FAKE_CLOUD"]
plan = json.load(open(os.path.join(cloud, "plan.json")))
state_path = os.path.join(cloud, "state.json")
state = json.load(open(state_path)) if os.path.exists(state_path) else {
  "generation": 0, "exists": False, "describes": 0, "creates": 0}
args = sys.argv[1:]
with open(os.path.join(cloud, "calls.jsonl"), "a") as f:
  f.write(json.dumps({"args": args, "time": time.monotonic()}) + "\n")
workers = os.path.join(cloud, "workers")


def save():
  with open(state_path, "w") as f:
    json.dump(state, f)


def kill_workers():
  for w in range(plan["workers"]):
    pid_file = os.path.join(workers, f"w{w}", "bert_jax", ".bert_jax_job.pid")
    if os.path.exists(pid_file):
      try:
        os.killpg(int(open(pid_file).read()), signal.SIGKILL)
      except (ProcessLookupError, ValueError):
        pass
  shutil.rmtree(workers, ignore_errors=True)


group, verb = args[2], args[3]
if group == "queued-resources" and verb == "create":
  tries = plan.get("create", [])
  status = tries[state["creates"]] if state["creates"] < len(tries) else 0
  state["creates"] += 1
  if status or state["exists"]:
    save()
    sys.exit(status or print("ERROR: already exists", file=sys.stderr) or 1)
  state.update(generation=state["generation"] + 1, exists=True, describes=0)
  for w in range(plan["workers"]):
    os.makedirs(os.path.join(workers, f"w{w}"))
elif group == "queued-resources" and verb == "describe":
  if not state["exists"]:
    sys.exit(print("ERROR: NOT_FOUND", file=sys.stderr) or 1)
  states = plan["states"][state["generation"] - 1]
  print(states[min(state["describes"], len(states) - 1)])
  state["describes"] += 1
elif group == "queued-resources" and verb == "delete":
  kill_workers()
  state["exists"] = False
elif group == "tpu-vm" and verb == "ssh":
  if not state["exists"]:
    sys.exit(print("ERROR: connection refused", file=sys.stderr) or 255)
  command = next(a for a in args if a.startswith("--command="))[len("--command="):]
  worst = 0
  for w in range(plan["workers"]):
    env = {**os.environ, "HOME": os.path.join(workers, f"w{w}"), "FAKE_WORKER": str(w),
           "PATH": os.environ["FAKE_WORKER_PATH"]}
    proc = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    worst = max(worst, proc.returncode)
  save()
  sys.exit(worst)
save()
"""

CURL = r"""#!/bin/bash
url="${@: -1}"
case "$url" in
  */agent-worker-number) echo -n "$FAKE_WORKER" ;;
  */worker-network-endpoints) echo -n "w0:x:10.0.0.7,w1:x:10.0.0.8" ;;
  *) exit 22 ;;
esac
"""

GIT = r"""#!/bin/bash
# git clone -q URL DIR makes DIR/.git; fetch and checkout succeed
if [ "$1" = clone ]; then mkdir -p "${@: -1}/.git"; fi
"""

JOB = r"""#!{python}
import json, os, sys, time
attempt = os.environ["BERT_JAX_ATTEMPT"]
keys = ("BERT_JAX_ATTEMPT", "BERT_JAX_MAX_RESTARTS", "JAX_PROCESS_ID", "JAX_NUM_PROCESSES",
        "JAX_COORDINATOR_ADDRESS")
cloud = os.environ["FAKE_CLOUD"]
with open(os.path.join(cloud, "records", f"a{attempt}_w{os.environ['FAKE_WORKER']}.json"), "w") as f:
  json.dump({"argv": sys.argv[1:], **{k: os.environ.get(k) for k in keys}}, f)
plan = json.load(open(os.path.join(cloud, "plan.json")))
then = plan["job"][attempt]
if then == "hang":
  time.sleep(600)
sys.exit(then)
"""


@pytest.fixture
def cloud(tmp_path, monkeypatch):
  """(write the plan, the calls so far, the job records, the environment to run the launcher
  in). The workers' jobs still running at the end are killed."""
  root = tmp_path / "cloud"
  (root / "records").mkdir(parents=True)
  bin_dir = tmp_path / "bin"
  worker_bin = tmp_path / "worker_bin"
  bin_dir.mkdir()
  worker_bin.mkdir()
  executable(bin_dir / "gcloud", GCLOUD.replace("{python}", sys.executable))
  executable(worker_bin / "curl", CURL)
  executable(worker_bin / "git", GIT)
  job_python = executable(tmp_path / "fake_python", JOB.replace("{python}", sys.executable))
  env = {
    "FAKE_CLOUD": str(root),
    "FAKE_WORKER_PATH": f"{worker_bin}:{os.environ['PATH']}",
    "PATH": f"{bin_dir}:{os.environ['PATH']}",
  }
  for k, v in env.items():
    monkeypatch.setenv(k, v)

  def write_plan(**plan):
    (root / "plan.json").write_text(json.dumps({"workers": 2, **plan}))

  def calls():
    lines = (
      (root / "calls.jsonl").read_text().splitlines() if (root / "calls.jsonl").exists() else []
    )
    return [json.loads(line) for line in lines]

  def records():
    return {p.stem: json.loads(p.read_text()) for p in (root / "records").glob("*.json")}

  yield write_plan, calls, records, job_python, root
  for pid_file in root.glob("workers/*/bert_jax/.bert_jax_job.pid"):
    try:
      os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    except (ProcessLookupError, ValueError):
      pass


def target(**changes):
  settings = dict(
    tpu_name="pod",
    zone="us-central2-b",
    project="proj-1",
    create=True,
    accelerator_type="v4-16",  # 2 hosts
    ship="git",
    repo_url="https://example.com/bert_jax.git",
    install="echo set up >> setup.log",
    watch_poll_s=POLL_S,
  )
  return TpuTarget(**{**settings, **changes})


def job(python):
  return Job("pretrain", "configs/pretrain.py:tiny", "gs://bucket/run", python=python)


def command(args):
  """An ssh call's remote command ("" for other calls)."""
  return next((a for a in args if a.startswith("--command=")), "")


def actions(calls):
  """The calls that change something (not the looks): create, delete, setup, start."""
  out = []
  for c in calls:
    args = c["args"]
    if args[3] in ("create", "delete"):
      out.append(args[3])
    elif "git clone" in command(args):
      out.append("setup")
    elif "nohup setsid" in command(args):
      out.append("start")
  return out


def run(tgt, python):
  out = io.StringIO()
  status = tgt.run(job(python), out=out)
  return status, out.getvalue()


def test_a_preempted_slice_is_recreated_and_the_job_resumed(cloud):
  write_plan, calls, records, python, root = cloud
  write_plan(
    # the first slice is provisioned, runs the job a while, then is preempted
    states=[["PROVISIONING", "ACTIVE", "ACTIVE", "ACTIVE", "SUSPENDED"], ["ACTIVE"]],
    job={"0": "hang", "1": 0},
  )
  status, out = run(target(), python)
  assert status == 0, out
  assert actions(calls()) == ["create", "setup", "start", "delete", "create", "setup", "start"]
  assert "queued resource pod is SUSPENDED: restart 1 of 3 on a re-created slice" in out
  assert out.rstrip().endswith("launch: the job completed on every worker of pod (attempt 1)")
  recs = records()
  assert sorted(recs) == ["a0_w0", "a0_w1", "a1_w0", "a1_w1"]
  for name, rec in recs.items():
    assert rec["BERT_JAX_ATTEMPT"] == name[1] and rec["BERT_JAX_MAX_RESTARTS"] == "3"
    assert rec["JAX_PROCESS_ID"] == name[-1] and rec["JAX_NUM_PROCESSES"] == "2"
    assert rec["JAX_COORDINATOR_ADDRESS"] == "10.0.0.7:8476"
    assert "--workdir=gs://bucket/run" in rec["argv"]
  # the re-created workers were set up afresh (the delete wiped the old ones)
  for w in (0, 1):
    assert (root / f"workers/w{w}/bert_jax/setup.log").read_text() == "set up\n"
    assert (root / f"workers/w{w}/bert_jax/.bert_jax_job.status").read_text() == "0\n"


def test_a_completed_job_is_not_restarted(cloud):
  write_plan, calls, records, python, _ = cloud
  write_plan(states=[["ACTIVE"]], job={"0": 0})
  status, out = run(target(), python)
  assert status == 0, out
  assert actions(calls()) == ["create", "setup", "start"]
  assert sorted(records()) == ["a0_w0", "a0_w1"]
  # it stopped looking once every worker's status was 0
  assert "bert_jax_job:" in command(calls()[-1]["args"])


@pytest.mark.parametrize(
  "job_plan,expected,starts",
  [
    ({"0": 143, "1": 0}, 0, 2),  # saved after SIGTERM: again on the same slice
    ({"0": 137, "1": 143, "2": 143, "3": 143}, 143, 4),  # 3 restarts, then its status
    ({"0": 2}, 2, 1),  # bad input: never restarted
    ({"0": 3}, 3, 1),  # the trainer's refusal of a restart without progress
  ],
)
def test_a_job_that_ended_is_restarted_only_after_a_preemption(cloud, job_plan, expected, starts):
  write_plan, calls, records, python, _ = cloud
  write_plan(states=[["ACTIVE"]], job=job_plan)
  status, out = run(target(), python)
  assert status == expected, out
  assert actions(calls()) == ["create"] + ["setup", "start"] * starts
  assert {r["BERT_JAX_ATTEMPT"] for r in records().values()} == {str(a) for a in range(starts)}
  if expected == 2:
    assert "the job ended with status 2 (attempt 0); not restarted" in out


def test_a_failed_create_is_tried_again_with_a_growing_wait(cloud):
  write_plan, calls, _, python, _ = cloud
  write_plan(states=[["ACTIVE"]], create=[1, 1, 0], job={"0": 0})
  status, out = run(target(), python)
  assert status == 0, out
  creates = [c["time"] for c in calls() if c["args"][3] == "create"]
  assert len(creates) == 3
  assert creates[1] - creates[0] >= POLL_S and creates[2] - creates[1] >= 2 * POLL_S
  assert (
    "trying again in 0.05 s (try 2 of 5)" in out and "trying again in 0.1 s (try 3 of 5)" in out
  )


def test_a_recreate_that_keeps_failing_is_reported(cloud):
  write_plan, calls, records, python, _ = cloud
  write_plan(states=[["ACTIVE", "PREEMPTED"]], create=[0, 1, 1, 1, 1, 1], job={"0": "hang"})
  status, out = run(target(), python)
  assert status == 1
  assert actions(calls()) == ["create", "setup", "start", "delete"] + ["create"] * 5
  assert out.rstrip().endswith("launch: could not create queued resource pod in 5 tries; giving up")
  assert sorted(records()) == ["a0_w0", "a0_w1"]  # nothing started after the preemption


def test_restarts_stop_at_max_restarts(cloud):
  write_plan, calls, _, python, _ = cloud
  write_plan(states=[["ACTIVE", "SUSPENDED"]] * 3, job={"0": "hang", "1": "hang"})
  status, out = run(target(max_restarts=1), python)
  assert status == 143
  assert actions(calls()) == ["create", "setup", "start", "delete", "create", "setup", "start"]
  assert "queued resource pod is SUSPENDED; the 1 restart(s) allowed are used" in out


def test_ctrl_c_stops_watching_and_leaves_the_job_running(cloud):
  write_plan, calls, records, python, root = cloud
  write_plan(states=[["ACTIVE"]], job={"0": "hang"})
  driver = (
    "import sys\n"
    "from launch.job import Job\n"
    "from launch.targets import TpuTarget\n"
    f"target = TpuTarget(**{target().__dict__!r})\n"
    f"sys.exit(target.run(Job('pretrain', 'configs/pretrain.py:tiny', 'gs://bucket/run', "
    f"python={python!r})))\n"
  )
  proc = subprocess.Popen(
    [sys.executable, "-c", driver],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  deadline = time.monotonic() + 120
  while len(records()) < 2 or not [c for c in calls() if "bert_jax_job:" in command(c["args"])]:
    assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
    time.sleep(0.05)
  proc.send_signal(signal.SIGINT)
  stdout, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 130, stderr
  assert stdout.splitlines()[-1] == (
    "launch: stopped watching pod (Ctrl-C); the job and the queued resource are left as they are"
  )
  assert "Traceback" not in stderr
  assert "delete" not in actions(calls())
  for w in (0, 1):  # the job still runs on every worker
    pid = int((root / f"workers/w{w}/bert_jax/.bert_jax_job.pid").read_text())
    os.kill(pid, 0)
    assert not (root / f"workers/w{w}/bert_jax/.bert_jax_job.status").exists()


def test_a_slice_the_launch_did_not_create_is_not_watched():
  """Only a slice the launch creates can be re-created: without --create (or with
  max_restarts=0) the job runs attached to the launch, told that no restart will come."""
  for tgt in (target(create=False), target(max_restarts=0)):
    start = command(tgt.commands(job("python3"))[-1])
    assert "nohup" not in start and "| tee -a $HOME/bert_jax_job.log" in start
    assert "export BERT_JAX_ATTEMPT=0 BERT_JAX_MAX_RESTARTS=0" in start
  start = command(target(max_restarts=7).commands(job("python3"))[-1])
  assert "export BERT_JAX_ATTEMPT=0 BERT_JAX_MAX_RESTARTS=7" in start and "nohup setsid" in start


@pytest.mark.parametrize(
  "settings,message",
  [({"max_restarts": -1}, "max_restarts must be >= 0"), ({"watch_poll_s": 0}, "watch_poll_s must")],
)
def test_watch_settings_are_checked(settings, message):
  with pytest.raises(LaunchError, match=message):
    target(**settings).validate(job("python3"))
