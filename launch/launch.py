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
error here). launch.json is written only where the target says its workdir is reachable from
here (``Target.records_here``: not a Kubernetes path, which is inside the pods).

The target is used only through ``launch.targets.base.Target``: any target, including one
defined outside this package, launches the same way.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from .job import Job, launch_record, resolve_config, write_launch_record
from .preflight import check_job_config
from .targets import target_settings
from .targets.base import Target, can_write


def launch(
  job: Job,
  target: Target,
  dry_run: bool = False,
  out: TextIO | None = None,
  source: str = "command line",
  stop: threading.Event | None = None,
) -> int:
  """Validates ``job`` on ``target``, then prints it (dry run) or records and runs it.

  ``stop``: setting it stops a job that runs in this process (used by sweeps).
  """
  out = out or sys.stdout
  config = resolve_config(job, source)
  target.validate(job)
  plan = target.describe(job)
  if dry_run:
    check_job_config(job, config, target)  # what the entry point refuses at once
    out.write(plan + "\n")
    return 0
  checked = target.preflight(job, config)
  record = launch_record(job, config, target.name, target_settings(target), target.processes)
  if checked is not None:
    record["preflight"] = checked
    out.write("".join(f"launch: pre-flight: {line}\n" for line in checked.get("summary", [])))
  if target.records_here(job):
    write_launch_record(job.workdir, record)
  else:
    out.write(f"launch: {job.workdir} is not reachable from here; launch.json not written\n")
  out.flush()
  return target.run(job, out, stop=stop)


__all__ = ["can_write", "launch"]
