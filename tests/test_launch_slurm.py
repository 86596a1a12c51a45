"""The SLURM target: its sbatch script, and real jobs on a real one-node SLURM cluster.

The cluster (tests/slurm_cluster.py) is munged + slurmctld + slurmd started on localhost in a
temporary directory for this module, with a ``debug`` partition whose node has 4 GPUs (a GPU
GRES over device files: SLURM allocates them and sets ``CUDA_VISIBLE_DEVICES``; the jobs
themselves run JAX on the CPU) and a ``cpu`` partition for jobs that ask for no GPU. Every
job is submitted with ``python -m launch run --target=slurm`` exactly as a user would, and the
tests check what SLURM reports (``scontrol show job``) and what the jobs wrote. Where the
daemons are not installed (``.ci/run`` installs Debian's slurm-wlm and munge) the cluster
tests skip with the reason listed in tests/allowed_skips.txt; an installed cluster that does
not start is a failure.

The pre-training jobs run configs/pretrain.py:tiny as 2 processes x 1 CPU device, batch 8, 20
steps on synthetic data: each job's time is mostly compiling the step.
"""

import io
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time

import pytest
from conftest import subprocess_env_for
from launch_fakes import executable, records
from slurm_cluster import SlurmCluster, SlurmUnavailable, free_port, tiny_pretrain_args

from launch.job import Job, LaunchError
from launch.launch import launch
from launch.targets import SlurmTarget

REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIG = "configs/pretrain.py:tiny"
STEPS = 20
# Small enough for 2 CPU cores.
PRETRAIN_ARGS = tiny_pretrain_args(STEPS)
GPU_FLAGS = ["--partition=debug", "--nodes=1", "--gpus_per_node=2", "--cpus_per_task=1"]
BANNER = re.compile(
  r"^launch: slurm job (\d+) \(restart \d+\), process (\d+) of (\d+) on \S+"
  r"(?:, CUDA_VISIBLE_DEVICES=(\S*))?, \d{4}-\d\d-\d\dT",
  re.M,
)


# --- the script, run against stand-ins (no cluster) --------------------------------------------


def directives(script):
  return dict(
    line[len("#SBATCH --") :].split("=", 1)
    for line in script.splitlines()
    if line.startswith("#SBATCH --") and "=" in line
  )


def run_with_stand_ins(tmp_path, script, nodes, tasks_per_node, node_gpus=None):
  """Runs the script as SLURM would on ``nodes`` nodes with fake scontrol and srun: srun starts
  every task with SLURM_PROCID / SLURM_LOCALID and, when ``node_gpus`` is given, the job's GPUs
  on its node as SLURM lists them in CUDA_VISIBLE_DEVICES."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  executable(
    bin_dir / "scontrol",
    f"""#!/bin/bash
[ "$1 $2 $3" = "show hostnames $SLURM_JOB_NODELIST" ] || exit 3
for ((n = 0; n < {nodes}; n++)); do echo gpu-node0$((7 + n)); done
""",
  )
  gpus = f"export CUDA_VISIBLE_DEVICES={node_gpus};" if node_gpus else ""
  executable(
    bin_dir / "srun",
    f"""#!/bin/bash
while [[ "$1" == --* ]]; do shift; done   # srun's own options
for ((i = 0; i < SLURM_NTASKS; i++)); do
  ({gpus} SLURM_PROCID=$i SLURM_LOCALID=$((i % {tasks_per_node})) "$@") || exit $?
done
""",
  )
  script_path = tmp_path / "sbatch.sh"
  script_path.write_text(script)
  env = {
    **os.environ,
    "PATH": f"{bin_dir}:{os.environ['PATH']}",
    "SLURM_JOB_NODELIST": "gpu-node[07-08]",
    "SLURM_NTASKS": str(nodes * tasks_per_node),
    "SLURM_JOB_ID": "77",
  }
  env.pop("CUDA_VISIBLE_DEVICES", None)
  subprocess.run(["bash", str(script_path)], env=env, check=True, capture_output=True)


def test_slurm_script_gives_every_task_its_coordinates(tmp_path, fake_python):
  python, record_dir = fake_python
  workdir = tmp_path / "run"
  job = Job("pretrain", CONFIG, str(workdir), python=python)
  target = SlurmTarget(
    partition="gpu", nodes=2, gpus_per_node=4, account="acct", time="02:00:00", remote_dir=str(REPO)
  )
  out = io.StringIO()
  assert launch(job, target, dry_run=True, out=out) == 0
  printed = out.getvalue().strip().splitlines()
  assert printed[-2:] == [
    f"mkdir -p {workdir}/logs",
    f"sbatch --parsable {workdir}/launch/sbatch.sh",
  ]
  assert not workdir.exists()  # a dry run writes nothing
  script = target.script(job)
  d = directives(script)
  assert d["partition"] == "gpu" and d["nodes"] == "2"
  assert d["ntasks-per-node"] == "4" and d["gpus-per-node"] == "4"
  assert d["account"] == "acct" and d["time"] == "02:00:00"
  assert d["output"] == f"{workdir}/logs/slurm-%j.out" and d["open-mode"] == "append"
  # Restarts (max_restarts=3 by default): requeued even where JobRequeue=0; SIGUSR1 to the
  # batch script 300 s before the time limit.
  assert "#SBATCH --requeue" in script.splitlines() and d["signal"] == "B:USR1@300"
  never = SlurmTarget(partition="gpu", max_restarts=0, remote_dir=str(REPO)).script(job)
  assert "#SBATCH --no-requeue" in never.splitlines() and "#SBATCH --signal" not in never

  # SLURM lists no GPUs: task i of a node takes GPU i.
  run_with_stand_ins(tmp_path, script, nodes=2, tasks_per_node=4)
  recs = records(record_dir)
  assert [r["JAX_PROCESS_ID"] for r in recs] == [str(i) for i in range(8)]
  assert {r["JAX_NUM_PROCESSES"] for r in recs} == {"8"}
  assert {r["JAX_COORDINATOR_ADDRESS"] for r in recs} == {"gpu-node07:12321"}
  assert [r["CUDA_VISIBLE_DEVICES"] for r in recs] == ["0", "1", "2", "3"] * 2
  assert recs[0]["argv"][:2] == ["-m", "bert_jax.pretrain"]


def test_slurm_tasks_take_their_share_of_the_gpus_slurm_lists(tmp_path, fake_python):
  """On a node shared with other jobs SLURM lists the job's real GPU indices (here 4-7): task
  LOCALID takes its slice of that list, never GPU LOCALID (another job's)."""
  python, record_dir = fake_python
  job = Job("pretrain", CONFIG, str(tmp_path / "run"), python=python)
  one_each = SlurmTarget(partition="gpu", nodes=2, gpus_per_node=4, remote_dir=str(REPO))
  run_with_stand_ins(tmp_path, one_each.script(job), 2, 4, node_gpus="4,5,6,7")
  assert [r["CUDA_VISIBLE_DEVICES"] for r in records(record_dir)] == ["4", "5", "6", "7"] * 2
  for p in record_dir.glob("*"):
    p.unlink()
  (tmp_path / "bin").rename(tmp_path / "bin_1")
  two_each = SlurmTarget(
    partition="gpu", nodes=2, gpus_per_node=4, tasks_per_node=2, remote_dir=str(REPO)
  )
  script = two_each.script(job)
  assert directives(script)["ntasks-per-node"] == "2" and two_each.num_processes == 4
  run_with_stand_ins(tmp_path, script, 2, 2, node_gpus="4,5,6,7")
  assert [r["CUDA_VISIBLE_DEVICES"] for r in records(record_dir)] == ["4,5", "6,7"] * 2


def test_cpu_only_layout_asks_for_no_gpu(tmp_path, fake_python):
  python, record_dir = fake_python
  job = Job("pretrain", CONFIG, str(tmp_path / "run"), python=python)
  target = SlurmTarget(
    partition="cpu", nodes=2, gpus_per_node=0, tasks_per_node=3, cpus_per_task=2,
    remote_dir=str(REPO),
  )  # fmt: skip
  script = target.script(job)
  d = directives(script)
  sbatch_lines = [line for line in script.splitlines() if line.startswith("#SBATCH")]
  assert not [line for line in sbatch_lines if "gpu" in line] and "CUDA_VISIBLE" not in script
  assert d["ntasks-per-node"] == "3" and d["cpus-per-task"] == "2"
  assert target.num_processes == 6
  run_with_stand_ins(tmp_path, script, nodes=2, tasks_per_node=3)
  recs = records(record_dir)
  assert [r["JAX_PROCESS_ID"] for r in recs] == [str(i) for i in range(6)]
  assert {r["JAX_NUM_PROCESSES"] for r in recs} == {"6"}
  assert {r["CUDA_VISIBLE_DEVICES"] for r in recs} == {None}


def run_attempt_with_stand_ins(tmp_path, target, statuses, restart, state="RUNNING"):
  """Runs ``target``'s script as attempt ``restart`` of SLURM job 77 whose task i's entry point
  exits with ``statuses[i]``, against stand-ins: srun runs the tasks one after the other, each
  into its log, and exits with the highest status, as SLURM's does; scontrol shows the job in
  ``state`` and records a requeue. (exit status, the script's output, whether it requeued the job, each task's
  BERT_JAX_* environment)."""
  bin_dir, seen, logs = tmp_path / "bin", tmp_path / "seen", tmp_path / "run" / "logs"
  bin_dir.mkdir()
  seen.mkdir()
  executable(
    bin_dir / "scontrol",
    f"""#!/bin/bash
case "$1 $2" in
  "show hostnames") echo node07 ;;
  "show job") echo "JobId=77 JobName=bert_jax UserId=u(1) JobState={state} Reason=None" ;;
  "requeue 77") touch {seen}/requeued ;;
  *) exit 3 ;;
esac
""",
  )
  executable(
    bin_dir / "srun",
    f"""#!/bin/bash
while [[ "$1" == --* ]]; do shift; done
rc=0
for ((i = 0; i < SLURM_NTASKS; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$i "$@" >> {logs}/process_$i.log 2>&1
  s=$?; ((s > rc)) && rc=$s
done
exit $rc
""",
  )
  python = executable(
    tmp_path / "python",
    f"""#!/bin/bash
echo "$BERT_JAX_ATTEMPT $BERT_JAX_MAX_RESTARTS" > {seen}/env_$SLURM_PROCID
statuses=({" ".join(map(str, statuses))})
exit ${{statuses[$SLURM_PROCID]}}
""",
  )
  job = Job("pretrain", CONFIG, str(tmp_path / "run"), python=python)
  script_path = tmp_path / "sbatch.sh"
  script_path.write_text(target.script(job))
  logs.mkdir(parents=True)
  env = {
    **os.environ,
    "PATH": f"{bin_dir}:{os.environ['PATH']}",
    "SLURM_JOB_NODELIST": "node07",
    "SLURM_NTASKS": str(len(statuses)),
    "SLURM_JOB_ID": "77",
    "SLURM_RESTART_COUNT": str(restart),
  }
  proc = subprocess.run(["bash", str(script_path)], env=env, capture_output=True, text=True)
  envs = [p.read_text().split() for p in sorted(seen.glob("env_*"))]
  return proc.returncode, proc.stdout, (seen / "requeued").exists(), envs


@pytest.mark.parametrize(
  "statuses,restart,max_restarts,status,requeued,line",
  [
    ((0, 0), 0, 3, 0, False, None),
    (
      (143, 143), 0, 3, 143, True,
      "launch: srun exited with status 143: requeueing job 77 (restart 1 of at most 3; it "
      "resumes from its latest checkpoint), ",
    ),
    ((137, 0), 2, 3, 137, True, "launch: srun exited with status 137: requeueing job 77 "),
    (
      (143, 143), 3, 3, 143, False,
      "launch: srun exited with status 143: not requeued: max_restarts=3 restarts done",
    ),
    (
      (143, 1), 0, 3, 1, False,
      "launch: process 1 exited with status 1: not requeued (1 an error, 2 bad input, 3 no "
      "progress over the last restarts, 130 Ctrl-C: a restart cannot help)",
    ),
    ((3, 143), 1, 3, 3, False, "launch: process 0 exited with status 3: not requeued (1 an"),
    ((130,), 0, 3, 130, False, "launch: process 0 exited with status 130: not requeued (1 an"),
    (
      (143,), 0, 0, 143, False,
      "launch: srun exited with status 143: not requeued: max_restarts=0 restarts done",
    ),
  ],
)  # fmt: skip
def test_an_attempt_is_requeued_only_after_a_save_or_a_kill(
  tmp_path, statuses, restart, max_restarts, status, requeued, line
):
  """A task's 1, 2, 3 or 130 ends the job whatever srun's status (its siblings, stopped by
  --kill-on-bad-exit, end 143); 143 or a death by a signal requeues it while restarts are left.
  Every task learns its attempt and the restarts allowed (BERT_JAX_ATTEMPT, _MAX_RESTARTS)."""
  target = SlurmTarget(
    partition="cpu", gpus_per_node=0, tasks_per_node=len(statuses), max_restarts=max_restarts,
    remote_dir=str(REPO),
  )  # fmt: skip
  got, out, was_requeued, envs = run_attempt_with_stand_ins(tmp_path, target, statuses, restart)
  assert (got, was_requeued) == (status, requeued), out
  assert envs == [[str(restart), str(max_restarts)]] * len(statuses)
  assert out.splitlines() == ([] if line is None else [out.splitlines()[0]])
  assert line is None or out.startswith(line)
  log = (tmp_path / "run" / "logs" / "process_0.log").read_text()
  assert f"launch: process 0 exited with status {statuses[0]}, " in log
  assert not (tmp_path / "run" / "launch" / "exit_status").exists()


def test_a_job_slurm_is_ending_is_not_requeued_by_its_script(tmp_path):
  """scancel: SIGTERM to the script and the tasks, which save and exit 143 while SLURM
  shows the job COMPLETING; the cancel stands (SLURM requeues a preempted job itself)."""
  target = SlurmTarget(partition="cpu", gpus_per_node=0, tasks_per_node=1, remote_dir=str(REPO))
  got, out, requeued, _ = run_attempt_with_stand_ins(tmp_path, target, (143,), 0, "COMPLETING")
  assert (got, requeued) == (143, False)
  assert out.splitlines() == [
    "launch: srun exited with status 143: not requeued: SLURM is ending the job "
    "(JobState=COMPLETING: cancelled, preempted or past its time limit; SLURM requeues a "
    "preempted job itself)"
  ]


def test_an_attempt_past_max_restarts_does_not_start(tmp_path):
  """SLURM itself requeues a preempted job (PreemptMode=REQUEUE) whatever max_restarts says:
  the attempt after the last one allowed stops at once."""
  target = SlurmTarget(partition="cpu", gpus_per_node=0, tasks_per_node=1, remote_dir=str(REPO))
  got, out, requeued, envs = run_attempt_with_stand_ins(tmp_path, target, (0,), restart=4)
  assert (got, requeued, envs) == (1, False, [])
  assert out.splitlines() == [
    "launch: job 77 was requeued 3 times already (max_restarts=3); not starting restart 4 "
    "(submit again to resume from the latest checkpoint)"
  ]


@pytest.mark.parametrize(
  "settings,message",
  [
    (
      dict(gpus_per_node=0),
      "slurm target: gpus_per_node=0 (a CPU-only partition) needs tasks_per_node >= 1 "
      "(flag --tasks_per_node: processes per node)",
    ),
    (
      dict(gpus_per_node=8, tasks_per_node=3),
      "slurm target: tasks_per_node (3) must divide gpus_per_node (8): each process gets the "
      "same number of GPUs",
    ),
    (
      dict(gpus_per_node=-1),
      "slurm target: gpus_per_node (-1) and tasks_per_node (0) must be >= 0",
    ),
    (dict(nodes=0), "slurm target: nodes must be >= 1, got 0"),
    (dict(max_restarts=-1), "slurm target: max_restarts must be >= 0, got -1"),
    (dict(signal_grace_s=0), "slurm target: signal_grace_s must be >= 1, got 0"),
    (
      dict(time="00:05:00"),
      "slurm target: signal_grace_s (300) must be shorter than the time limit (time='00:05:00': "
      "300 s): the job is told to save that long before it",
    ),
    (
      dict(time="1:2:3:4"),
      "slurm target: time='1:2:3:4' is not a SLURM time limit (minutes, HH:MM:SS, D-HH:MM:SS, ...)",
    ),
    (dict(cpus_per_task=0), "slurm target: cpus_per_task must be >= 1, got 0"),
    (
      dict(gpus_per_node=0, tasks_per_node=2, gpu_type="h100"),
      "slurm target: gpu_type='h100' needs gpus_per_node >= 1 (the pre-flight compiles for GPUs)",
    ),
    (
      dict(gpus_per_node=8, gpu_type="h100x"),
      "slurm target: --gpu_type='h100x': unknown GPU topology 'h100x:8'; known: <gpu>:<gpus per "
      "host> or <gpu>:<hosts>x<gpus per host>, <gpu> one of a100-40gb, a100-80gb, h100, h200, "
      "gpus per host 1/2/4/8 (e.g. h100:8, h100:2x8, a100-80gb:4x8)",
    ),
  ],
)
def test_bad_layouts_are_one_line_errors(tmp_path, settings, message):
  with pytest.raises(LaunchError) as e:
    SlurmTarget(partition="p", **settings).validate(Job("pretrain", CONFIG, str(tmp_path)))
  assert str(e.value) == message


def test_cli_cpu_only_layout_error(tmp_path):
  proc = subprocess.run(
    [sys.executable, "-m", "launch", "run", f"--config={CONFIG}", f"--workdir={tmp_path}/w",
     "--target=slurm", "--partition=cpu", "--gpus_per_node=0"],
    capture_output=True, text=True, cwd=REPO,
  )  # fmt: skip
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1] == (
    "launch: error: slurm target: gpus_per_node=0 (a CPU-only partition) needs "
    "tasks_per_node >= 1 (flag --tasks_per_node: processes per node)"
  )
  assert not (tmp_path / "w").exists()


# --- a real cluster ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
  cluster = SlurmCluster(tmp_path_factory.mktemp("slurm_cluster"))
  try:
    cluster.start()
  except SlurmUnavailable as e:
    pytest.skip(str(e))
  yield cluster
  cluster.stop()


def submit(cluster, workdir, target_flags, args=PRETRAIN_ARGS, python=sys.executable, extra=()):
  """``python -m launch run ... --target=slurm``; the submitted job's id."""
  proc = subprocess.run(
    [
      sys.executable, "-m", "launch", "run", "--job=pretrain", f"--config={CONFIG}",
      f"--workdir={workdir}", "--target=slurm", f"--remote_dir={REPO}", "--time=00:20:00",
      f"--coordinator_port={free_port()}",
      *([f"--python={python}"] if python else []), *target_flags, *extra, "--", *args,
    ],
    env=cluster.env(subprocess_env_for(1)),  # each process: 1 CPU device
    capture_output=True, text=True, cwd=REPO, timeout=120,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stdout + proc.stderr
  found = re.search(r"launch: submitted SLURM job (\d+); logs: (\S+)/slurm-\1\.out", proc.stdout)
  assert found, proc.stdout
  assert found.group(2) == f"{workdir}/logs"
  return int(found.group(1))


def banners(log):
  return [m.groups() for m in BANNER.finditer(log.read_text())]


def tail(path, n=40):
  return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


def job_logs(workdir, job_id):
  logs = workdir / "logs"
  return "\n".join(
    f"--- {p.name}\n{tail(p)}"
    for p in [logs / f"slurm-{job_id}.out", *sorted(logs.glob("process_*.log"))]
  )


def test_two_task_pretraining_on_a_new_workdir_completes(cluster, tmp_path):
  """The reported failure: on a workdir that does not exist yet, sbatch opened
  <workdir>/logs/slurm-<id>.out before the script could create logs/, and the job died with
  no log. Also: a job sharing the node holds GPU 0, and each task must get one of this job's
  own GPUs, as SLURM lists them."""
  blocker = cluster.sbatch(
    "--partition=debug", "--gpus-per-node=1", "--cpus-per-task=1", "--time=00:20:00",
    f"--output={tmp_path}/blocker.out", "--wrap", 'echo "GPUS=$CUDA_VISIBLE_DEVICES"; sleep 600',
  )  # fmt: skip
  deadline = time.monotonic() + 60
  while "GPUS=" not in tail(tmp_path / "blocker.out"):
    assert time.monotonic() < deadline, cluster.job(blocker)
    time.sleep(0.5)
  blocker_gpus = set(tail(tmp_path / "blocker.out").split("GPUS=")[1].split()[0].split(","))
  workdir = tmp_path / "new" / "run"
  # The interpreter comes from the setup lines, as on a cluster: the venv's activate script.
  venv = pathlib.Path(sys.prefix)
  python = None if (venv / "bin" / "activate").exists() else sys.executable
  setup = [f"--setup=source {shlex.quote(str(venv / 'bin' / 'activate'))}"] if not python else []
  try:
    job_id = submit(cluster, workdir, GPU_FLAGS, python=python, extra=setup)
    info = cluster.wait(job_id, timeout_s=900)
  finally:
    cluster.scancel(blocker)
  assert info["JobState"] == "COMPLETED", (info, job_logs(workdir, job_id))
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["status"] == "completed" and summary["step"] == STEPS
  assert summary["num_processes"] == 2 and summary["num_devices"] == 2
  logs = workdir / "logs"
  assert (logs / f"slurm-{job_id}.out").exists()
  gpus = []
  for i in range(2):
    log = logs / f"process_{i}.log"
    [(job, process, count, gpu)] = banners(log)
    assert (job, process, count) == (str(job_id), str(i), "2")
    gpus.append(gpu)
    assert f"jax.distributed: process {i} of 2" in log.read_text()
  assert len(set(gpus)) == 2 and not set(gpus) & blocker_gpus, (gpus, blocker_gpus)
  assert "Done (completed) at step 20" in (logs / "process_0.log").read_text()
  record = json.loads((workdir / "launch.json").read_text())
  assert record["num_processes"] == 2 and record["target"] == "slurm"


def test_a_failing_task_stops_the_others_and_fails_the_job(cluster, tmp_path):
  """Task 1 exits with status 3 while task 0 runs pre-training (waiting for task 1 in
  jax.distributed): srun --kill-on-bad-exit stops task 0 and the job ends FAILED, long before
  jax.distributed's own 5-minute timeout would."""
  wrapper = executable(
    tmp_path / "python",
    f"""#!/bin/bash
if [ "$SLURM_PROCID" = 1 ]; then sleep 5; echo "process 1 fails on purpose"; exit 3; fi
exec {shlex.quote(sys.executable)} "$@"
""",
  )
  workdir = tmp_path / "run"
  start = time.monotonic()
  job_id = submit(cluster, workdir, GPU_FLAGS, python=wrapper)
  info = cluster.wait(job_id, timeout_s=240)
  elapsed = time.monotonic() - start
  assert info["JobState"] == "FAILED", (info, job_logs(workdir, job_id))
  assert elapsed < 240
  out = (workdir / "logs" / f"slurm-{job_id}.out").read_text()
  assert re.search(r"task 1: Exited with exit code 3", out), out
  assert "process 1 fails on purpose" in (workdir / "logs" / "process_1.log").read_text()
  log0 = (workdir / "logs" / "process_0.log").read_text()
  assert banners(workdir / "logs" / "process_0.log") and "Done (" not in log0
  assert not (workdir / "summary.json").exists()


def test_cpu_partition_job_cancelled_mid_run_resumes_and_keeps_the_first_logs(cluster, tmp_path):
  """CPU-only layout (gpus_per_node=0, tasks_per_node=2) on the cpu partition. The first job is
  cancelled (scancel: SIGTERM to every task, which saves a checkpoint) during training; the
  same command submitted again resumes from that checkpoint and completes, and every log of
  the first job is still there."""
  workdir = tmp_path / "run"
  flags = [
    "--partition=cpu", "--nodes=1", "--gpus_per_node=0", "--tasks_per_node=2",
    "--cpus_per_task=1",
  ]  # fmt: skip
  # A synchronous save after every step keeps the run going for a while after its first step.
  slow = [
    *PRETRAIN_ARGS,
    "--config.save_checkpoints_steps=1",
    "--config.checkpoint.async_save=false",
  ]
  first = submit(cluster, workdir, flags, args=slow)
  deadline = time.monotonic() + 600
  while not (workdir / "checkpoints" / "2").is_dir():
    info = cluster.job(first)
    assert info["JobState"] in ("PENDING", "RUNNING"), (info, job_logs(workdir, first))
    assert time.monotonic() < deadline, job_logs(workdir, first)
    time.sleep(0.5)
  cluster.scancel(first)
  info = cluster.wait(first, timeout_s=120)
  assert info["JobState"] == "CANCELLED", info
  assert "gres/gpu" not in info.get("TRES", "") and "gpu" not in info.get("TresPerNode", "")
  log0 = (workdir / "logs" / "process_0.log").read_text()
  assert "Done (preempted)" in log0, job_logs(workdir, first)
  saved = int(re.search(r"Done \(preempted\) at step (\d+)", log0).group(1))
  assert 2 <= saved < STEPS
  first_logs = {p.name: p.read_text() for p in (workdir / "logs").iterdir()}

  second = submit(cluster, workdir, flags, args=slow)
  info = cluster.wait(second, timeout_s=600)
  assert info["JobState"] == "COMPLETED", (info, job_logs(workdir, second))
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["status"] == "completed" and summary["step"] == STEPS
  assert summary["init"] == "resumed" and summary["num_processes"] == 2
  logs = workdir / "logs"
  for i in range(2):
    log = logs / f"process_{i}.log"
    text = log.read_text()
    assert text.startswith(first_logs[log.name])  # the first job's lines, kept whole
    assert [(b[0], b[1], b[3]) for b in banners(log)] == [
      (str(first), str(i), None),
      (str(second), str(i), None),
    ]  # no CUDA_VISIBLE_DEVICES: a CPU-only job
  assert re.search(rf"resumed from \S+ at step {saved}\b", (logs / "process_0.log").read_text())
  assert (logs / f"slurm-{first}.out").read_text() == first_logs[f"slurm-{first}.out"]
  assert (logs / f"slurm-{second}.out").exists()
  assert sorted(p.name for p in workdir.glob("launch*.json")) != ["launch.json"]
