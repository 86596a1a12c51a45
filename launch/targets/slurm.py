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
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
from typing import TextIO

from ..job import (
  ENV_COORDINATOR,
  ENV_NUM_PROCESSES,
  ENV_PROCESS_ID,
  REPO_ROOT,
  Job,
  LaunchError,
)
from ..preflight import gpu_topology_name, preflight


@dataclasses.dataclass(frozen=True)
class SlurmTarget:
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

  name = "slurm"

  @property
  def processes_per_node(self) -> int:
    return self.tasks_per_node or self.gpus_per_node

  @property
  def num_processes(self) -> int:
    """The job's processes, nodes x tasks per node (recorded in launch.json)."""
    return self.nodes * self.processes_per_node

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

  def log_dir(self, job: Job) -> str:
    return os.path.join(job.workdir, "logs")

  def script_path(self, job: Job) -> str:
    return os.path.join(job.workdir, "launch", "sbatch.sh")

  def _task(self, job: Job) -> str:
    """What each task runs (under ``bash -c``): its log's first line, its GPUs, the job."""
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
    lines += [
      'echo "launch: slurm job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}), process '
      f'$SLURM_PROCID of $SLURM_NTASKS on $(hostname){gpu_note}, $(date -u +%FT%TZ)"',
      f"exec {job.shell_command()}",
    ]
    return "\n".join(lines)

  def script(self, job: Job) -> str:
    """The sbatch script (text); writes nothing."""
    self.validate(job)
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
    directives += [f"--account={self.account}"] if self.account else []
    directives += [f"--qos={self.qos}"] if self.qos else []
    directives += list(self.sbatch_args)
    if self.gpus_per_node == self.processes_per_node:
      layout = "one process per GPU"
    elif self.gpus_per_node:
      layout = f"{self.processes_per_node} processes per node, {self.gpus_per_node} GPUs per node"
    else:
      layout = f"{self.processes_per_node} processes per node, no GPUs"
    lines = (
      ["#!/bin/bash"]
      + [f"#SBATCH {d}" for d in directives]
      + [
        f"# Written by `python -m launch`: {layout}, joined with jax.distributed.",
        "# The launcher creates the log directory before sbatch; logs are appended to.",
        "set -euo pipefail",
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
      # srun does not take --cpus-per-task from the allocation (SLURM >= 22.05): pass it on.
      f"srun --kill-on-bad-exit=1 --cpus-per-task={self.cpus_per_task} --open-mode=append "
      f"--output={shlex.quote(logs + '/process_%t.log')} bash -c {shlex.quote(self._task(job))}",
      "",
    ]
    return "\n".join(lines)

  def describe(self, job: Job) -> str:
    return (
      f"# {self.script_path(job)}\n{self.script(job)}\n"
      f"mkdir -p {shlex.quote(self.log_dir(job))}\n"
      f"sbatch --parsable {shlex.quote(self.script_path(job))}"
    )

  def run(self, job: Job, out: TextIO | None = None) -> int:
    """Writes the script, creates the log directory and submits; sbatch's exit status."""
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
