"""Jobs that come back by themselves on SLURM, on a real one-node cluster (tests/slurm_cluster.py).

Every job is submitted with ``python -m launch run --target=slurm`` as a user would; the tests
check what SLURM reports (``scontrol show job``), what the batch script and the processes
logged, and what the trainer wrote (attempts.json, summary.json):

* a job whose training outlasts its time limit (``--time=1``: one minute, SLURM's smallest) gets
  SIGUSR1 from SLURM ``signal_grace_s`` before it, saves, requeues itself and completes in a
  later attempt, with the loss of every step as in a plain run of the same steps; on a cluster
  with SLURM's default ``JobRequeue=1`` and on one with ``JobRequeue=0``, where only the job's
  own ``--requeue`` lets it be requeued;
* a job preempted by one in a higher-priority partition (``PreemptMode=REQUEUE``) saves,
  waits, resumes and completes, with the same losses;
* a job killed at the same point of every attempt (as by the OOM killer) stops: the trainer
  refuses the attempt that would repeat the others (exit status 3), and the job is not
  requeued again.

Timing. The trainer's first steps take a few tenths of a second on a quiet core, far less than
SLURM's one-minute granularity, so the time-limit and preemption tests hold the training
(SIGSTOP to the trainer, which runs on this machine) from its third step until SLURM's signal
has come; the trainer then goes on (SIGCONT; SLURM sends SIGCONT itself before a preemption's
SIGTERM) and saves at its next step. SLURM sends the time-limit signal at its periodic (30 s)
time-limit check, up to 30 s before ``time - signal_grace_s``: a grace of 1 s leaves an attempt
at least 29 s to start training. The test cluster restarts a requeued job 6 s after the requeue
(``cred_expire=5``; SLURM's default is 120 s) and schedules every second.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import subprocess_env_for
from slurm_cluster import SlurmCluster, SlurmUnavailable, free_port, tiny_pretrain_args

REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIG = "configs/pretrain.py:tiny"
STEPS = 10
HOLD_AT_STEP = 3
# One process, no periodic checkpoint: a restart resumes from what the stop signal saved.
PRETRAIN_ARGS = [*tiny_pretrain_args(STEPS), "--config.save_checkpoints_steps=1000"]
ONE_TASK = [
  "--partition=cpu", "--nodes=1", "--gpus_per_node=0", "--tasks_per_node=1", "--cpus_per_task=1",
]  # fmt: skip
ATTEMPT_BANNER = re.compile(r"^launch: slurm job \d+ \(restart (\d+)\), process 0 of 1 ", re.M)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
  cluster = SlurmCluster(tmp_path_factory.mktemp("slurm_requeue_cluster"))
  try:
    cluster.start()
  except SlurmUnavailable as e:
    pytest.skip(str(e))
  yield cluster
  cluster.stop()


class PlainRun:
  """The same pre-training as the jobs', run by hand (no launcher, no restart), in the
  background from ``start`` (while a job's trainer is held, its core is free)."""

  def __init__(self, workdir: pathlib.Path):
    self.workdir, self.log_path, self.proc = workdir, workdir.parent / "plain_run.log", None

  def start(self) -> None:
    if self.proc is None:
      with open(self.log_path, "w") as log:
        self.proc = subprocess.Popen(
          [sys.executable, "-m", "bert_jax.pretrain", f"--config={CONFIG}",
           f"--workdir={self.workdir}", *PRETRAIN_ARGS],
          env=subprocess_env_for(1), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

  def summary(self) -> dict:
    self.start()
    assert self.proc.wait(timeout=600) == 0, self.log_path.read_text()
    return json.loads((self.workdir / "summary.json").read_text())


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
  run = PlainRun(tmp_path_factory.mktemp("plain") / "run")
  yield run
  if run.proc is not None:
    run.proc.kill()
    run.proc.wait()


def submit(cluster, workdir, *flags):
  """``python -m launch run ... --target=slurm``; the submitted job's id."""
  proc = subprocess.run(
    [
      sys.executable, "-m", "launch", "run", "--job=pretrain", f"--config={CONFIG}",
      f"--workdir={workdir}", "--target=slurm", f"--remote_dir={REPO}",
      f"--coordinator_port={free_port()}", f"--python={sys.executable}", *ONE_TASK, *flags,
      "--", *PRETRAIN_ARGS,
    ],
    env=cluster.env(subprocess_env_for(1)), capture_output=True, text=True, cwd=REPO,
    timeout=120,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return int(re.search(r"launch: submitted SLURM job (\d+);", proc.stdout).group(1))


def read(path: pathlib.Path) -> str:
  return path.read_text(errors="replace") if path.exists() else ""


def logs(workdir, job_id) -> str:
  """The batch script's log and the process's, for a failure message."""
  out, proc = workdir / "logs" / f"slurm-{job_id}.out", workdir / "logs" / "process_0.log"
  return f"--- {out.name}\n{read(out)}\n--- {proc.name}\n" + "\n".join(
    read(proc).splitlines()[-60:]
  )


def attempts_logged(workdir) -> list[tuple[int, str]]:
  """(restart count, its part of process_0.log) for every attempt so far."""
  text = read(workdir / "logs" / "process_0.log")
  starts = list(ATTEMPT_BANNER.finditer(text))
  ends = [m.start() for m in starts[1:]] + [len(text)]
  return [(int(m.group(1)), text[m.start() : end]) for m, end in zip(starts, ends)]


def trainer_pid(workdir) -> int | None:
  """The pre-training process of this workdir (on this machine: the cluster's only node)."""
  for proc in pathlib.Path("/proc").iterdir():
    try:
      argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
      continue
    if b"bert_jax.pretrain" in argv and f"--workdir={workdir}".encode() in argv:
      return int(proc.name)
  return None


def wait_until(condition, timeout_s, what, cluster, job_id, workdir):
  """Polls ``condition`` until it returns something true (that is returned); fails naming
  ``what`` when the job ends first or the time runs out."""
  deadline = time.monotonic() + timeout_s
  while True:
    found = condition()
    if found:
      return found
    info = cluster.job(job_id)
    assert info["JobState"] in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING"), (
      f"job ended before {what}: {info['JobState']} {info.get('Reason')}\n{logs(workdir, job_id)}"
    )
    assert time.monotonic() < deadline, f"no {what} after {timeout_s} s\n{logs(workdir, job_id)}"
    time.sleep(0.1)


def hold_training(cluster, job_id, workdir, plain_run) -> tuple[int, int]:
  """Stops (SIGSTOP) the first attempt that reaches step HOLD_AT_STEP, and starts the plain
  run meanwhile; (the attempt's restart count, its trainer's pid). An attempt whose stop
  signal comes before that is passed over."""

  def training():
    for restart, text in attempts_logged(workdir):
      running = "launch: process 0 exited" not in text
      if running and re.search(rf"\bstep {HOLD_AT_STEP}/{STEPS}\b", text):
        pid = trainer_pid(workdir)
        return pid and (restart, pid)
    return None

  restart, pid = wait_until(training, 300, f"step {HOLD_AT_STEP}", cluster, job_id, workdir)
  os.kill(pid, signal.SIGSTOP)
  plain_run.start()
  return restart, pid


def check_resumed_and_completed(workdir, job_id, info, plain_run, stopped_restart, max_restarts):
  """The job completed at step STEPS with the plain run's losses, after attempt
  ``stopped_restart`` saved on SIGTERM and the next one resumed from that step. (A later
  attempt may find nothing left to do: SLURM's next signal can come while the finished
  trainer is still exiting.)"""
  assert info["JobState"] == "COMPLETED", (info, logs(workdir, job_id))
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["status"] == "completed" and summary["step"] == STEPS
  attempts = attempts_logged(workdir)
  stopped = dict(attempts)[stopped_restart]
  saved = int(re.search(r"pretrain: preempted \(SIGTERM\): saved step (\d+); re-run to resume",
                        stopped).group(1))  # fmt: skip
  assert HOLD_AT_STEP <= saved < STEPS
  assert "launch: process 0 exited with status 143" in stopped
  resumed = stopped_restart + 1
  after = dict(attempts)[resumed]
  assert re.search(rf"resumed from \S+ at step {saved}\b", after), after
  assert f"attempt {resumed} of at most {max_restarts + 1} (restart {resumed})" in after
  assert int(info["Restarts"]) == len(attempts) - 1 >= resumed
  assert {"attempt": resumed, "resumed_from_step": saved, "steps_lost": 0} in summary["restarts"]
  records = json.loads((workdir / "attempts.json").read_text())["attempts"]
  assert [r["attempt"] for r in records] == [n for n, _ in attempts]
  assert records[stopped_restart]["ended"] == "preempted"
  assert records[-1]["ended"] == "completed" and records[-1]["last_step"] == STEPS
  # The loss of every step, the last one's included, as in the plain run.
  plain = plain_run.summary()["train_loss_history"]
  assert [step for step, _ in plain] == list(range(1, STEPS + 1))
  assert summary["train_loss_history"] == plain


@pytest.mark.parametrize("job_requeue", ["1", "0"])
def test_time_limited_job_saves_requeues_itself_and_completes(
  cluster, plain_run, tmp_path, job_requeue
):
  """--time=1 with signal_grace_s=1, on a cluster with SLURM's default JobRequeue=1 and on one
  with JobRequeue=0 (only the job's own --requeue lets its script's ``scontrol requeue``
  through). Restarts to spare: on a loaded machine an attempt may get its signal before it
  trains."""
  cluster.reconfigure(JobRequeue=job_requeue)
  shown = cluster.scontrol("show", "config").stdout
  assert re.search(rf"^JobRequeue\s*= {job_requeue}$", shown, re.M)
  workdir = tmp_path / "run"
  job_id = submit(cluster, workdir, "--time=1", "--signal_grace_s=1", "--max_restarts=5")
  assert cluster.job(job_id)["Requeue"] == "1"
  restart, pid = hold_training(cluster, job_id, workdir, plain_run)
  out = workdir / "logs" / f"slurm-{job_id}.out"
  signalled = "launch: SIGUSR1 (the time limit is near): SIGTERM to the job's processes"
  wait_until(lambda: read(out).count(signalled) > restart, 120, "SIGUSR1", cluster, job_id, workdir)
  os.kill(pid, signal.SIGCONT)
  info = cluster.wait(job_id, timeout_s=600)
  check_resumed_and_completed(workdir, job_id, info, plain_run, restart, max_restarts=5)
  batch = read(out)
  assert re.search(
    rf"launch: srun exited with status 143 after SIGUSR1 \(the time limit is near\): "
    rf"requeueing job {job_id} \(restart {restart + 1} of at most 5;",
    batch,
  ), batch
  assert info["TimeLimit"] == "00:01:00" and info["ExitCode"] == "0:0"


def test_preempted_job_saves_waits_and_resumes(cluster, plain_run, tmp_path):
  """A job in the ``cpu`` partition is preempted by one that needs the whole node in the
  ``high`` partition (PriorityTier 2; PreemptMode=REQUEUE): SLURM sends SIGTERM, requeues
  the job and starts it again once the preemptor has finished."""
  cluster.reconfigure(JobRequeue="1")
  workdir = tmp_path / "run"
  job_id = submit(cluster, workdir, "--time=00:10:00", "--max_restarts=3")
  restart, _ = hold_training(cluster, job_id, workdir, plain_run)
  preemptor = cluster.sbatch(
    "--partition=high", "--nodes=1", "--ntasks=4", "--cpus-per-task=1", "--time=1",
    f"--output={tmp_path}/preemptor.out", "--wrap", "date -u +%FT%TZ; sleep 3",
  )  # fmt: skip
  info = cluster.wait(job_id, timeout_s=600)
  check_resumed_and_completed(workdir, job_id, info, plain_run, restart, max_restarts=3)
  assert cluster.wait(preemptor, timeout_s=60)["JobState"] == "COMPLETED"
  batch = read(workdir / "logs" / f"slurm-{job_id}.out")
  assert f"JOB {job_id} ON {cluster.node} CANCELLED AT" in batch and "DUE TO PREEMPTION" in batch
  assert "launch: SIGTERM (preempted or cancelled): SIGTERM to the job's processes" in batch
  assert (
    "launch: srun exited with status 143 after SIGTERM (preempted or cancelled): not requeued: "
    "SLURM is ending the job (JobState=COMPLETING: " in batch
  ), batch
  # The job ran again only after the preemptor.
  preempted_at = read(tmp_path / "preemptor.out").split()[0]
  resumed_at = re.search(
    rf"launch: slurm job {job_id} \(restart {restart + 1}\), process 0 of 1 on \S+, (\S+)",
    read(workdir / "logs" / "process_0.log"),
  ).group(1)
  assert resumed_at > preempted_at


def test_job_killed_at_the_same_point_of_every_attempt_stops(cluster, tmp_path):
  """Every attempt is killed (SIGKILL, as by the OOM killer) at the same point, before it
  saves anything: the job is requeued max_restarts=2 times, then the trainer refuses the
  attempt that would train the same steps again (exit status 3, one line) and the job ends
  there. (An attempt is killed as soon as attempts.json records it, before its first step:
  compiling that would only make the test longer.)"""
  cluster.reconfigure(JobRequeue="1")
  workdir = tmp_path / "run"
  job_id = submit(cluster, workdir, "--time=00:10:00", "--max_restarts=2")
  for restart in (0, 1):

    def recorded(restart=restart):  # attempts.json is replaced whole, never half written
      records = json.loads(read(workdir / "attempts.json") or "{}").get("attempts", [])
      return any(r["attempt"] == restart for r in records) and trainer_pid(workdir)

    pid = wait_until(recorded, 300, f"attempt {restart}", cluster, job_id, workdir)
    os.kill(pid, signal.SIGKILL)
  info = cluster.wait(job_id, timeout_s=300)
  assert info["JobState"] == "FAILED" and info["ExitCode"] == "3:0", (info, logs(workdir, job_id))
  assert info["Restarts"] == "2"
  attempts = attempts_logged(workdir)
  assert [restart for restart, _ in attempts] == [0, 1, 2]
  for _, text in attempts[:2]:
    assert "launch: process 0 exited with status 137" in text
  last = attempts[2][1]
  assert re.search(
    r"^pretrain: no progress: attempts 0, 1 each resumed from step 0 and none saved a later "
    r"checkpoint .*; attempt 2 stops here",
    last,
    re.M,
  ), last
  assert "launch: process 0 exited with status 3" in last
  batch = read(workdir / "logs" / f"slurm-{job_id}.out")
  assert batch.count("launch: srun exited with status 137: requeueing job") == 2, batch
  assert "launch: process 0 exited with status 3: not requeued (1 an error" in batch
  records = json.loads((workdir / "attempts.json").read_text())["attempts"]
  # Attempt 1 marked attempt 0 as died; attempt 2 refused before recording anything.
  assert [(r["attempt"], r["resumed_from_step"]) for r in records] == [(0, 0), (1, 0)]
  assert records[0]["ended"] == "died"
  assert not (workdir / "summary.json").exists()
