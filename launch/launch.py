"""Launch one job on a target: check everything, record it, then run it (or print it).

    from launch.job import Job
    from launch.launch import launch
    from launch.targets import make_target

    job = Job("pretrain", "configs/pretrain.py:tiny", "/tmp/run",
              overrides=(("num_train_steps", 10),))
    status = launch(job, make_target("local", {"num_processes": 2}))

Order: the config is loaded and every override applied (unknown key -> LaunchError), the
target's settings are checked (a missing zone/project/partition/image, an accelerator type or
GPU no slice / pre-flight knows, a name or quantity the cluster would refuse -> LaunchError;
the same checks in a dry run), and only then (TPU target with an accelerator_type, SLURM or
Kubernetes with a gpu_type: the job compiled for it, refused when it does not fit:
launch/preflight.py) is ``launch.json`` (command, resolved config, git commit, target
settings, pre-flight result) written into the workdir and the job started. ``dry_run`` prints
exactly what would run and starts nothing, after checking the config as the entry point will
before any work (``preflight.check_job_config``: a config it would refuse is the same one-line
error here).
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from .job import Job, launch_record, resolve_config, write_launch_record
from .preflight import check_job_config
from .targets import target_settings


def num_processes(target) -> int:
  for field in ("num_processes", "num_hosts"):
    if hasattr(target, field):
      return getattr(target, field)
  if hasattr(target, "nodes"):
    return target.nodes * target.gpus_per_node
  return 0  # a TPU slice: known to the workers only


def can_write(workdir: str) -> bool:
  """Whether launch.json can be written from here (a local path or a gs:// bucket)."""
  return workdir.startswith("gs://") or "://" not in workdir


def launch(
  job: Job,
  target,
  dry_run: bool = False,
  out: TextIO | None = None,
  source: str = "command line",
  stop: threading.Event | None = None,
) -> int:
  """Validates ``job`` on ``target``, then prints it (dry run) or records and runs it.

  ``stop`` (local target): setting it stops the job's processes (used by sweeps).
  """
  out = out or sys.stdout
  config = resolve_config(job, source)
  target.validate(job)
  plan = target.describe(job)
  if dry_run:
    check_job_config(job, config, target)  # what the entry point refuses at once
    out.write(plan + "\n")
    return 0
  checked = target.preflight(job, config) if hasattr(target, "preflight") else None
  record = launch_record(job, config, target.name, target_settings(target), num_processes(target))
  if checked is not None:
    record["preflight"] = checked
    out.write("".join(f"launch: pre-flight: {line}\n" for line in checked.get("summary", [])))
  if can_write(job.workdir) and (target.name != "kubernetes" or job.workdir.startswith("gs://")):
    write_launch_record(job.workdir, record)
  else:
    out.write(f"launch: {job.workdir} is not reachable from here; launch.json not written\n")
  out.flush()
  if target.name == "local":
    return target.run(job, out, stop=stop)
  return target.run(job, out)


__all__ = ["can_write", "launch", "num_processes"]
