"""Run a job on every worker of a Cloud TPU VM slice (a pod slice or a single host).

The plan, each step one ``gcloud`` command (printed verbatim by ``--dry_run``):

1. optionally create the slice as a queued resource and wait until it is ACTIVE;
2. ship the code: ``ship="scp"`` tars this working tree (uncommitted changes included) and copies
   it to every worker; ``ship="git"`` clones ``repo_url`` at this checkout's commit instead;
3. install it on every worker (``install``, run in ``remote_dir``);
4. start the same command on every worker (``--worker=all``). Each worker reads its process id
   and the coordinator (worker 0's address) from the TPU metadata server and exports
   ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` before the job
   starts, so the job needs no cluster auto-detection. The workdir must be a gs:// bucket
   path that every worker can write.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
import time
from typing import TextIO

from ..job import (
  ENV_COORDINATOR,
  ENV_NUM_PROCESSES,
  ENV_PROCESS_ID,
  REPO_ROOT,
  Job,
  LaunchError,
  git_state,
)
from ..preflight import preflight

METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes"
SHIP_METHODS = ("scp", "git", "none")


@dataclasses.dataclass(frozen=True)
class TpuTarget:
  """Settings of a TPU VM launch; tpu_name, zone and project are required.

  Attributes:
    tpu_name: the TPU VM (and queued resource) name.
    zone, project: where it lives.
    accelerator_type: e.g. "v4-32" or "v5litepod-16"; required with ``create``.
    runtime_version: the TPU VM image for ``create``.
    create: create the slice as a queued resource first (and wait until it is ACTIVE).
    spot: create it as a spot slice.
    ship: "scp" (tar of this working tree), "git" (clone ``repo_url`` at this commit) or
      "none" (the code is already installed in remote_dir, e.g. by an earlier run of a sweep).
    repo_url: the repository to clone with ``ship="git"``.
    remote_dir: where the code goes on each worker.
    install: the install command run in remote_dir on each worker.
    coordinator_port: the jax.distributed coordinator's port on worker 0.
    log_file: each worker's log (tee'd; the same path on every worker).
    skip_preflight: launch without first compiling the job for accelerator_type (the
      pre-flight, launch/preflight.py, refuses a job whose step does not fit in HBM).
  """

  tpu_name: str = ""
  zone: str = ""
  project: str = ""
  accelerator_type: str = ""
  runtime_version: str = "tpu-ubuntu2204-base"
  create: bool = False
  spot: bool = False
  ship: str = "scp"
  repo_url: str = ""
  remote_dir: str = "$HOME/bert_jax"
  install: str = "python3 -m pip install -q -U 'jax[tpu]' -e ."
  coordinator_port: int = 8476
  log_file: str = "$HOME/bert_jax_job.log"
  skip_preflight: bool = False

  name = "tpu"

  def preflight(self, job: Job, config) -> dict | None:
    """Compiles the job for ``accelerator_type`` before anything is created (LaunchError when
    it does not fit); None when skipped or when no accelerator type is given."""
    if self.skip_preflight or not self.accelerator_type or config is None:
      return None
    return preflight(job, config, self.accelerator_type)

  def validate(self, job: Job) -> None:
    missing = [k for k in ("tpu_name", "zone", "project") if not getattr(self, k)]
    if self.create and not self.accelerator_type:
      missing.append("accelerator_type (needed with create)")
    if self.ship == "git" and not self.repo_url:
      missing.append("repo_url (needed with ship=git)")
    if missing:
      raise LaunchError(
        f"tpu target: missing required setting(s): {', '.join(missing)} "
        f"(flags --{' --'.join(m.split()[0] for m in missing)})"
      )
    if self.ship not in SHIP_METHODS:
      raise LaunchError(f"tpu target: ship must be one of {SHIP_METHODS}, got {self.ship!r}")
    if not job.workdir.startswith("gs://"):
      raise LaunchError(
        f"tpu target: workdir {job.workdir!r} must be a gs:// path that every worker can write"
      )

  def _gcloud(self, *args: str) -> list[str]:
    return ["gcloud", "compute", "tpus", *args, f"--zone={self.zone}", f"--project={self.project}"]

  def _ssh_all(self, command: str) -> list[str]:
    return self._gcloud("tpu-vm", "ssh", self.tpu_name, "--worker=all", f"--command={command}")

  def worker_command(self, job: Job) -> str:
    """The shell command every worker runs: set the jax.distributed coordinates, run the job."""
    meta = f"curl -sf -H 'Metadata-Flavor: Google' {METADATA_URL}"
    return "; ".join(
      [
        "set -euo pipefail",
        f"cd {self.remote_dir}",
        f"endpoints=$({meta}/worker-network-endpoints)",
        f"export {ENV_PROCESS_ID}=$({meta}/agent-worker-number)",
        f"export {ENV_NUM_PROCESSES}=$(echo \"$endpoints\" | tr ',' '\\n' | grep -c .)",
        f'export {ENV_COORDINATOR}=$(echo "$endpoints" | cut -d, -f1 | cut -d: -f3)'
        f":{self.coordinator_port}",
        f"{job.shell_command()} 2>&1 | tee -a {self.log_file}",
      ]
    )

  def commands(self, job: Job) -> list[list[str]]:
    """Every command the launch runs, in order; runs nothing."""
    self.validate(job)
    cmds = []
    if self.create:
      create = self._gcloud(
        "queued-resources",
        "create",
        self.tpu_name,
        f"--node-id={self.tpu_name}",
        f"--accelerator-type={self.accelerator_type}",
        f"--runtime-version={self.runtime_version}",
      )
      cmds.append(create + (["--spot"] if self.spot else []))
    if self.ship == "none":
      cmds.append(self._ssh_all(self.worker_command(job)))
      return cmds
    if self.ship == "scp":
      archive = f"/tmp/bert_jax_code_{self.tpu_name}.tar.gz"
      cmds.append(
        [
          "tar",
          "-czf",
          archive,
          "--exclude=.venv",
          "--exclude=.git",
          "--exclude=__pycache__",
          "--exclude=*.egg-info",
          "-C",
          str(REPO_ROOT),
          ".",
        ]
      )
      cmds.append(self._gcloud("tpu-vm", "scp", archive, f"{self.tpu_name}:/tmp/", "--worker=all"))
      unpack = (
        f"mkdir -p {self.remote_dir} && tar -xzf /tmp/{archive.rsplit('/', 1)[1]} "
        f"-C {self.remote_dir}"
      )
    else:
      commit = git_state()["commit"] or "HEAD"
      unpack = (
        f"(test -d {self.remote_dir}/.git || git clone -q {self.repo_url} "
        f"{self.remote_dir}) && git -C {self.remote_dir} fetch -q origin && "
        f"git -C {self.remote_dir} checkout -q {commit}"
      )
    cmds.append(self._ssh_all(f"{unpack} && cd {self.remote_dir} && {self.install}"))
    cmds.append(self._ssh_all(self.worker_command(job)))
    return cmds

  def describe(self, job: Job) -> str:
    lines = []
    for cmd in self.commands(job):
      lines.append(shlex.join(cmd))
      if cmd[3:5] == ["queued-resources", "create"]:
        lines.append(f"# then wait until `{shlex.join(self._describe_state())}` prints ACTIVE")
    return "\n".join(lines)

  def _describe_state(self) -> list[str]:
    return self._gcloud(
      "queued-resources", "describe", self.tpu_name, "--format=value(state.state)"
    )

  def run(self, job: Job, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    for cmd in self.commands(job):
      out.write(f"launch: {shlex.join(cmd)}\n")
      out.flush()
      status = subprocess.run(cmd, check=False).returncode
      if status:
        out.write(f"launch: command failed with status {status}\n")
        return status
      if cmd[3:5] == ["queued-resources", "create"]:
        status = self._wait_active(out)
        if status:
          return status
    return 0

  def _wait_active(self, out: TextIO, poll_s: float = 30.0) -> int:
    while True:
      proc = subprocess.run(self._describe_state(), capture_output=True, text=True, check=False)
      state = proc.stdout.strip()
      if proc.returncode or state in ("FAILED", "SUSPENDED"):
        out.write(f"launch: queued resource {self.tpu_name} is {state or proc.stderr.strip()}\n")
        return proc.returncode or 1
      if state == "ACTIVE":
        return 0
      out.write(f"launch: queued resource {self.tpu_name} is {state}; waiting\n")
      out.flush()
      time.sleep(poll_s)
