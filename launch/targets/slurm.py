"""Run a job on a SLURM cluster: one sbatch script; one process per GPU, or N per CPU node.

The script asks for ``nodes`` x ``tasks_per_node`` tasks (by default one per GPU:
``tasks_per_node`` = ``gpus_per_node``) and starts them with ``srun``. Every task derives its
jax.distributed coordinates from SLURM's environment: ``JAX_COORDINATOR_ADDRESS`` = the first
host of ``$SLURM_JOB_NODELIST`` (``scontrol show hostnames``) and ``coordinator_port``,
``JAX_NUM_PROCESSES=$SLURM_NTASKS``, ``JAX_PROCESS_ID=$SLURM_PROCID``. With GPUs, task
``$SLURM_LOCALID`` keeps its own ``gpus_per_node / tasks_per_node`` of the GPUs SLURM gave the
job on its node (``CUDA_VISIBLE_DEVICES``, which lists the node's real GPU indices when the
cluster does not constrain devices with cgroups). ``gpus_per_node=0`` is a CPU-only partition:
no GPU is requested and no ``CUDA_VISIBLE_DEVICES`` set; ``tasks_per_node`` is then required.
``srun --kill-on-bad-exit=1`` stops every task when one fails.

Logs: the launcher creates ``<workdir>/logs`` before ``sbatch`` (sbatch opens the job's output
file before the script runs). The batch script's own output goes to
``<workdir>/logs/slurm-<job id>.out``, task i's to ``<workdir>/logs/process_<i>.log``; both
are opened in append mode, so a resubmission (or a requeue) adds to them, and each task
writes a first line naming the job id, restart count, host and time of its attempt. The script
is written to ``<workdir>/launch/sbatch.sh`` (the workdir must be on a file system the submit
host and the nodes share).

Restarts (``max_restarts`` > 0). The job is submitted with ``--requeue`` (so a cluster whose
``JobRequeue=0`` still requeues it) and ``--signal=B:USR1@<signal_grace_s>``: that long before
the time limit SLURM sends SIGUSR1 to the batch script (SLURM may send it up to a minute early).
The script then sends SIGTERM to the job's processes (``scancel --signal=TERM``: the job steps,
not the script), as it does when it gets SIGTERM itself (a preemption, a cancel); the training
loop saves a checkpoint and its entry point exits 143. Every task records its entry point's
exit status in ``<workdir>/launch/exit_status/process_<i>`` and its log (``srun
--kill-on-bad-exit`` ends a failing task's siblings with SIGTERM, so srun's own status cannot
tell a failure from a save), and the script decides: 0 is done; a task's 1, 2, 3 (the trainer
saw restarts make no progress) or 130 is a failure a restart cannot fix, and the job ends with
it; 143 or a death by another signal (a save, SIGKILL, the OOM killer) requeues the job
(``scontrol requeue``) while ``SLURM_RESTART_COUNT`` < ``max_restarts``, unless SLURM is ending
the job (no longer RUNNING): a cancel (``scancel``) stands, and SLURM requeues a preempted job
itself (``PreemptMode=REQUEUE``); an attempt whose restart count is above ``max_restarts`` ends
at once with one line. Each attempt resumes from the latest checkpoint;
the processes get ``BERT_JAX_ATTEMPT`` (``$SLURM_RESTART_COUNT``) and ``BERT_JAX_MAX_RESTARTS``.
SLURM starts a requeued job again no sooner than the cluster's ``cred_expire`` + 1 s later
(AuthInfo; default 120 s), at its scheduler's next pass. ``max_restarts=0`` submits with
``--no-requeue``.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
import threading
from typing import TextIO

from bert_jax.interrupts import ENV_ATTEMPT, ENV_MAX_RESTARTS

from ..job import (
  ENV_COORDINATOR,
  ENV_NUM_PROCESSES,
  ENV_PROCESS_ID,
  REPO_ROOT,
  Job,
  LaunchError,
)
from ..preflight import gpu_topology_name, preflight
from .base import Target

# The end of the batch script: how the attempt ended, and whether to requeue the job. A task's
# own status that a restart cannot fix ends the job with it (srun's is 143 whenever
# --kill-on-bad-exit stopped the other tasks); then 0 is done; after 143 (saved after SIGTERM)
# or a death by another signal but SIGINT, the script requeues the job while restarts are left,
# unless SLURM is ending it (a cancel stands; SLURM requeues a preempted job itself).
_DECIDE = """\
restartable() {{ [ "$1" -gt 128 ] && [ "$1" -le 192 ] && [ "$1" != 130 ]; }}
why="srun exited with status $status${{stopped:+ after $stopped}}"
for file in {exits}/process_*; do
  [ -e "$file" ] || continue  # none: the task was killed with its shell
  code="$(<"$file")"
  if [ "$code" != 0 ] && ! restartable "$code"; then
    status="$code" why="process ${{file##*_}} exited with status $code"
    break
  fi
done
rm -rf {exits}
[ "$status" != 0 ] || exit 0
if ! restartable "$status"; then
  echo "launch: $why: not requeued (1 an error, 2 bad input, 3 no progress over the last \
restarts, 130 Ctrl-C: a restart cannot help)"
  exit "$status"
fi
state="$(scontrol show job "$SLURM_JOB_ID" 2>&1 | grep -o 'JobState=[A-Z_]*' || true)"
if [ "$state" != JobState=RUNNING ]; then
  echo "launch: $why: not requeued: SLURM is ending the job (${{state:-JobState unknown}}: \
cancelled, preempted or past its time limit; SLURM requeues a preempted job itself)"
  exit "$status"
fi
if [ "$restart" -ge {n} ]; then
  echo "launch: $why: not requeued: max_restarts={n} restarts done"
  exit "$status"
fi
echo "launch: $why: requeueing job $SLURM_JOB_ID (restart $((restart + 1)) of at most {n}; it \
resumes from its latest checkpoint), $(date -u +%FT%TZ)"
scontrol requeue "$SLURM_JOB_ID" || true  # (its error, if any, is in the log)
exit "$status"
"""


def time_limit_s(time: str) -> int | None:
  """SLURM's ``--time`` in seconds (None: unlimited): minutes, minutes:seconds,
  hours:minutes:seconds, days-hours, days-hours:minutes or days-hours:minutes:seconds."""
  if time.strip().lower() in ("unlimited", "infinite", "-1"):
    return None
  days, dash, clock = time.partition("-") if "-" in time else ("0", "", time)
  parts = clock.split(":")
  if not (days.isdigit() and 1 <= len(parts) <= 3 and all(p.isdigit() for p in parts)):
    raise LaunchError(
      f"slurm target: time={time!r} is not a SLURM time limit (minutes, HH:MM:SS, D-HH:MM:SS, ...)"
    )
  numbers = [int(p) for p in parts]
  if dash:  # days-hours[:minutes[:seconds]]
    hours, minutes, seconds = (numbers + [0, 0])[:3]
  else:  # minutes[:seconds] or hours:minutes:seconds
    hours, minutes, seconds = ([0] + numbers + [0])[:3] if len(numbers) < 3 else numbers
  return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds


@dataclasses.dataclass(frozen=True)
class SlurmTarget(Target):
  """Settings of a SLURM launch; ``partition`` is required.

  Attributes:
    partition: the SLURM partition.
    nodes: nodes to allocate.
    gpus_per_node: GPUs per node; 0 for a CPU-only partition (no GPU requested; then
      tasks_per_node is required).
    tasks_per_node: processes per node; 0 means one per GPU (gpus_per_node). With GPUs it must
      divide gpus_per_node: each process gets gpus_per_node / tasks_per_node of them.
    cpus_per_task: CPU cores per process (input pipeline threads).
    time: the wall-clock limit, HH:MM:SS or D-HH:MM:SS.
    account, qos: passed to sbatch when set.
    job_name: the SLURM job name.
    remote_dir: the code's directory on the cluster (default: this checkout).
    setup: shell lines run before srun on the first node, e.g. "module load cuda; source
      .venv/bin/activate".
    coordinator_port: the jax.distributed coordinator's port on the first node.
    sbatch_args: further ``#SBATCH`` options, e.g. ("--exclusive", "--mem=0").
    gpu_type: the GPUs ("h100", "h200", "a100-80gb", "a100-40gb"): when set, the job is first
      compiled for nodes x gpus_per_node of them (the pre-flight, launch/preflight.py) and
      refused before anything is written or submitted if a step does not fit.
    skip_preflight: submit without that check.
    max_restarts: times the job is requeued after a preemption, its time limit drawing near or
      a process killed by a signal; it resumes from its latest checkpoint (0: never requeued).
    signal_grace_s: seconds before the time limit at which the job's processes are told to save
      and stop (SIGUSR1 to the batch script, SIGTERM to them): room for a checkpoint save.
  """

  partition: str = ""
  nodes: int = 1
  gpus_per_node: int = 8
  tasks_per_node: int = 0
  cpus_per_task: int = 8
  time: str = "24:00:00"
  account: str = ""
  qos: str = ""
  job_name: str = "bert_jax"
  remote_dir: str = str(REPO_ROOT)
  setup: str = ""
  coordinator_port: int = 12321
  sbatch_args: tuple[str, ...] = ()
  gpu_type: str = ""
  skip_preflight: bool = False
  max_restarts: int = 3
  signal_grace_s: int = 300

  name = "slurm"

  @property
  def processes_per_node(self) -> int:
    return self.tasks_per_node or self.gpus_per_node

  @property
  def num_processes(self) -> int:
    """The job's processes, nodes x tasks per node (recorded in launch.json)."""
    return self.nodes * self.processes_per_node

  @property
  def processes(self) -> int:
    return self.num_processes

  def topology_name(self) -> str | None:
    if not self.gpu_type:
      return None
    return gpu_topology_name(self.gpu_type, self.nodes, self.gpus_per_node)

  def sweep_run(self, index: int, first: bool, parallel: int = 1) -> SlurmTarget:
    """A distinct job name per run: ``<job_name>-<index>``."""
    del first, parallel
    return dataclasses.replace(self, job_name=f"{self.job_name}-{index}") if self.job_name else self

  def preflight(self, job: Job, config) -> dict | None:
    """Compiles the job for the allocation's GPUs (LaunchError when it does not fit); None when
    skipped or when no gpu_type is given."""
    if self.skip_preflight or not self.gpu_type or config is None:
      return None
    return preflight(job, config, gpu_topology_name(self.gpu_type, self.nodes, self.gpus_per_node))

  def validate(self, job: Job) -> None:
    if not self.partition:
      raise LaunchError("slurm target: missing required setting: partition (flag --partition)")
    if self.nodes < 1:
      raise LaunchError(f"slurm target: nodes must be >= 1, got {self.nodes}")
    if self.gpus_per_node < 0 or self.tasks_per_node < 0:
      raise LaunchError(
        f"slurm target: gpus_per_node ({self.gpus_per_node}) and tasks_per_node "
        f"({self.tasks_per_node}) must be >= 0"
      )
    if self.gpus_per_node == 0 and self.tasks_per_node == 0:
      raise LaunchError(
        "slurm target: gpus_per_node=0 (a CPU-only partition) needs tasks_per_node >= 1 "
        "(flag --tasks_per_node: processes per node)"
      )
    if self.gpus_per_node and self.gpus_per_node % self.processes_per_node:
      raise LaunchError(
        f"slurm target: tasks_per_node ({self.tasks_per_node}) must divide gpus_per_node "
        f"({self.gpus_per_node}): each process gets the same number of GPUs"
      )
    if self.gpu_type and not self.gpus_per_node:
      raise LaunchError(
        f"slurm target: gpu_type={self.gpu_type!r} needs gpus_per_node >= 1 (the pre-flight "
        "compiles for GPUs)"
      )
    if self.gpu_type:
      # bert_jax only when a GPU type is given (the launcher itself stays light).
      from bert_jax.parallel.topology import parse_topology  # noqa: PLC0415 (heavy)

      name = gpu_topology_name(self.gpu_type, self.nodes, self.gpus_per_node)
      try:
        topo = parse_topology(name)
      except ValueError as e:
        raise LaunchError(f"slurm target: --gpu_type={self.gpu_type!r}: {e}") from None
      if not topo.is_gpu:
        raise LaunchError(f"slurm target: --gpu_type={self.gpu_type!r} is not a GPU")
    if self.cpus_per_task < 1:
      raise LaunchError(f"slurm target: cpus_per_task must be >= 1, got {self.cpus_per_task}")
    if "://" in job.workdir:
      raise LaunchError(
        f"slurm target: workdir {job.workdir!r} must be a path on a shared file system"
      )
    limit_s = time_limit_s(self.time)
    if self.max_restarts < 0:
      raise LaunchError(f"slurm target: max_restarts must be >= 0, got {self.max_restarts}")
    if self.max_restarts and self.signal_grace_s < 1:
      raise LaunchError(f"slurm target: signal_grace_s must be >= 1, got {self.signal_grace_s}")
    if self.max_restarts and limit_s is not None and self.signal_grace_s >= limit_s:
      raise LaunchError(
        f"slurm target: signal_grace_s ({self.signal_grace_s}) must be shorter than the time "
        f"limit (time={self.time!r}: {limit_s} s): the job is told to save that long before it"
      )

  def log_dir(self, job: Job) -> str:
    return os.path.join(job.workdir, "logs")

  def script_path(self, job: Job) -> str:
    return os.path.join(job.workdir, "launch", "sbatch.sh")

  def exit_dir(self, job: Job) -> str:
    """Where each task of the running attempt records its entry point's exit status."""
    return os.path.join(job.workdir, "launch", "exit_status")

  def _task(self, job: Job) -> str:
    """What each task runs (under ``bash -c``): its log's first line, its GPUs, the job, and
    a last line and file with the entry point's exit status."""
    lines = [f'export {ENV_PROCESS_ID}="$SLURM_PROCID" PYTHONUNBUFFERED=1']
    gpu_note = ""
    if self.gpus_per_node:
      total, each = self.gpus_per_node, self.gpus_per_node // self.processes_per_node
      lines += [
        # The job's GPUs on this node as SLURM lists them (0..n-1 when it lists none).
        "gpus=(${CUDA_VISIBLE_DEVICES//,/ })",
        f'[ "${{#gpus[@]}}" -ge {total} ] || gpus=($(seq 0 {total - 1}))',
        f'export CUDA_VISIBLE_DEVICES="$(IFS=,; echo "${{gpus[*]:$((SLURM_LOCALID * {each})):'
        f'{each}}}")"',
      ]
      gpu_note = ", CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
    exits = shlex.quote(self.exit_dir(job))
    lines += [
      'echo "launch: slurm job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}), process '
      f'$SLURM_PROCID of $SLURM_NTASKS on $(hostname){gpu_note}, $(date -u +%FT%TZ)"',
      # SIGTERM (a save, a failing sibling) reaches the entry point; this shell waits for it.
      "trap : TERM",
      f"status=0; {job.shell_command()} || status=$?",
      f'echo "$status" > {exits}/process_"$SLURM_PROCID"',
      'echo "launch: process $SLURM_PROCID exited with status $status, $(date -u +%FT%TZ)"',
      'exit "$status"',
    ]
    return "\n".join(lines)

  def _directives(self, job: Job) -> list[str]:
    logs = self.log_dir(job)
    directives = [
      f"--job-name={self.job_name}",
      f"--partition={self.partition}",
      f"--nodes={self.nodes}",
      f"--ntasks-per-node={self.processes_per_node}",
    ]
    directives += [f"--gpus-per-node={self.gpus_per_node}"] if self.gpus_per_node else []
    directives += [
      f"--cpus-per-task={self.cpus_per_task}",
      f"--time={self.time}",
      f"--output={logs}/slurm-%j.out",
      "--open-mode=append",
    ]
    if self.max_restarts:
      directives += ["--requeue", f"--signal=B:USR1@{self.signal_grace_s}"]
    else:
      directives += ["--no-requeue"]
    directives += [f"--account={self.account}"] if self.account else []
    directives += [f"--qos={self.qos}"] if self.qos else []
    return directives + list(self.sbatch_args)

  def script(self, job: Job) -> str:
    """The sbatch script (text); writes nothing."""
    self.validate(job)
    if self.gpus_per_node == self.processes_per_node:
      layout = "one process per GPU"
    elif self.gpus_per_node:
      layout = f"{self.processes_per_node} processes per node, {self.gpus_per_node} GPUs per node"
    else:
      layout = f"{self.processes_per_node} processes per node, no GPUs"
    n, exits = self.max_restarts, shlex.quote(self.exit_dir(job))
    lines = (
      ["#!/bin/bash"]
      + [f"#SBATCH {d}" for d in self._directives(job)]
      + [
        f"# Written by `python -m launch`: {layout}, joined with jax.distributed.",
        "# The launcher creates the log directory before sbatch; logs are appended to.",
        "set -euo pipefail",
        'restart="${SLURM_RESTART_COUNT:-0}"',
        f'if [ "$restart" -gt {n} ]; then',
        f'  echo "launch: job $SLURM_JOB_ID was requeued {n} times already (max_restarts={n}); '
        'not starting restart $restart (submit again to resume from the latest checkpoint)"',
        "  exit 1",
        "fi",
        f'export {ENV_ATTEMPT}="$restart" {ENV_MAX_RESTARTS}={n}',
        "# SIGUSR1 (the time limit is near) or SIGTERM (preempted, cancelled): the job's",
        "# processes get SIGTERM, save a checkpoint and stop. SLURM's own SIGTERM reaches them",
        "# too, and while SLURM ends the job scancel keeps failing (retrying, it could reach the",
        "# next attempt): it is cut short then.",
        'stopped=""',
        "stop() {",
        '  stopped="$1"',
        '  echo "launch: $1: SIGTERM to the job\'s processes (they save and stop), $(date -u +%FT%TZ)"',
        '  timeout "$2" scancel --signal=TERM "$SLURM_JOB_ID" >/dev/null 2>&1 || true',
        "}",
        "trap 'stop \"SIGUSR1 (the time limit is near)\" 30' USR1",
        "trap 'stop \"SIGTERM (preempted or cancelled)\" 3' TERM",
        f"cd {shlex.quote(self.remote_dir)}",
      ]
    )
    lines += [self.setup] if self.setup else []
    lines += [
      "# The first host of the allocation runs process 0 and the coordinator (no `| head`:",
      "# under pipefail a closed pipe would fail the script).",
      'hosts=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
      f'export {ENV_COORDINATOR}="${{hosts[0]}}:{self.coordinator_port}"',
      f'export {ENV_NUM_PROCESSES}="$SLURM_NTASKS"',
      f"rm -rf {exits}; mkdir -p {exits}",
      # srun does not take --cpus-per-task from the allocation (SLURM >= 22.05): pass it on.
      f"srun --kill-on-bad-exit=1 --cpus-per-task={self.cpus_per_task} --open-mode=append "
      f"--output={shlex.quote(self.log_dir(job) + '/process_%t.log')} "
      f"bash -c {shlex.quote(self._task(job))} &",
      'step="$!"',
      "# A trapped signal interrupts `wait`: wait again until srun has ended.",
      'while kill -0 "$step" 2>/dev/null; do wait "$step" || true; done',
      'status=0; wait "$step" || status=$?',
      *_DECIDE.format(n=n, exits=exits).splitlines(),
      "",
    ]
    return "\n".join(lines)

  def describe(self, job: Job) -> str:
    return (
      f"# {self.script_path(job)}\n{self.script(job)}\n"
      f"mkdir -p {shlex.quote(self.log_dir(job))}\n"
      f"sbatch --parsable {shlex.quote(self.script_path(job))}"
    )

  def run(self, job: Job, out: TextIO | None = None, stop: threading.Event | None = None) -> int:
    """Writes the script, creates the log directory and submits; sbatch's exit status
    (``stop`` is not used: the job is SLURM's once submitted)."""
    del stop
    out = out or sys.stdout
    text, path, logs = self.script(job), self.script_path(job), self.log_dir(job)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.makedirs(logs, exist_ok=True)  # sbatch opens --output there before the script runs
    with open(path, "w") as f:
      f.write(text)
    out.write(f"launch: sbatch --parsable {path}\n")
    out.flush()
    try:
      proc = subprocess.run(
        ["sbatch", "--parsable", path], stdout=subprocess.PIPE, text=True, check=False
      )
    except FileNotFoundError as e:
      raise LaunchError(
        "slurm target: sbatch not found on PATH (launch from a SLURM submit host)"
      ) from e
    if proc.returncode:
      return proc.returncode
    job_id = proc.stdout.strip().split(";")[0]
    out.write(
      f"launch: submitted SLURM job {job_id}; logs: {logs}/slurm-{job_id}.out, "
      f"{logs}/process_<i>.log\n"
    )
    return 0
