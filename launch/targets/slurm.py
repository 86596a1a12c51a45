"""Run a job on a GPU cluster under SLURM: one sbatch script, one process per GPU.

The script asks for ``nodes`` x ``gpus_per_node`` tasks and starts them with ``srun``. Every
task derives its jax.distributed coordinates from SLURM's environment:
``JAX_COORDINATOR_ADDRESS`` = the first host of ``$SLURM_JOB_NODELIST`` (``scontrol show
hostnames``) and ``coordinator_port``, ``JAX_NUM_PROCESSES=$SLURM_NTASKS``,
``JAX_PROCESS_ID=$SLURM_PROCID``, and ``CUDA_VISIBLE_DEVICES=$SLURM_LOCALID`` (its own GPU).
``srun --kill-on-bad-exit=1`` stops every task when one fails. Logs go to
``<workdir>/logs/process_<i>.log``; the script itself is written to
``<workdir>/launch/sbatch.sh`` (the workdir must be on a file system the nodes share).
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
    gpus_per_node: GPUs per node = processes per node.
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

  def preflight(self, job: Job, config) -> dict | None:
    """Compiles the job for the allocation's GPUs (LaunchError when it does not fit); None when
    skipped or when no gpu_type is given."""
    if self.skip_preflight or not self.gpu_type or config is None:
      return None
    return preflight(job, config, gpu_topology_name(self.gpu_type, self.nodes, self.gpus_per_node))

  def validate(self, job: Job) -> None:
    if not self.partition:
      raise LaunchError("slurm target: missing required setting: partition (flag --partition)")
    if self.nodes < 1 or self.gpus_per_node < 1:
      raise LaunchError(
        f"slurm target: nodes ({self.nodes}) and gpus_per_node ({self.gpus_per_node}) must be >= 1"
      )
    if "://" in job.workdir:
      raise LaunchError(
        f"slurm target: workdir {job.workdir!r} must be a path on a shared file system"
      )

  def script_path(self, job: Job) -> str:
    return os.path.join(job.workdir, "launch", "sbatch.sh")

  def script(self, job: Job) -> str:
    """The sbatch script (text); writes nothing."""
    self.validate(job)
    logs = os.path.join(job.workdir, "logs")
    directives = [
      f"--job-name={self.job_name}",
      f"--partition={self.partition}",
      f"--nodes={self.nodes}",
      f"--ntasks-per-node={self.gpus_per_node}",
      f"--gpus-per-node={self.gpus_per_node}",
      f"--cpus-per-task={self.cpus_per_task}",
      f"--time={self.time}",
      f"--output={logs}/slurm-%j.out",
    ]
    directives += [f"--account={self.account}"] if self.account else []
    directives += [f"--qos={self.qos}"] if self.qos else []
    directives += list(self.sbatch_args)
    task = (
      f'export {ENV_PROCESS_ID}="$SLURM_PROCID" CUDA_VISIBLE_DEVICES="$SLURM_LOCALID"; '
      f"exec {job.shell_command()}"
    )
    lines = (
      ["#!/bin/bash"]
      + [f"#SBATCH {d}" for d in directives]
      + [
        "# Written by `python -m launch`: one process per GPU joined with jax.distributed.",
        "set -euo pipefail",
        f"cd {shlex.quote(self.remote_dir)}",
      ]
    )
    lines += [self.setup] if self.setup else []
    lines += [
      f"mkdir -p {shlex.quote(logs)}",
      "# The first host of the allocation runs process 0 and the coordinator (no `| head`:",
      "# under pipefail a closed pipe would fail the script).",
      'hosts=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
      f'export {ENV_COORDINATOR}="${{hosts[0]}}:{self.coordinator_port}"',
      f'export {ENV_NUM_PROCESSES}="$SLURM_NTASKS"',
      f"srun --kill-on-bad-exit=1 --output={shlex.quote(logs + '/process_%t.log')} "
      f"bash -c {shlex.quote(task)}",
      "",
    ]
    return "\n".join(lines)

  def describe(self, job: Job) -> str:
    return (
      f"# {self.script_path(job)}\n{self.script(job)}\nsbatch {shlex.quote(self.script_path(job))}"
    )

  def run(self, job: Job, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    text, path = self.script(job), self.script_path(job)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)
    out.write(f"launch: sbatch {path}\n")
    return subprocess.run(["sbatch", path], check=False).returncode
