"""Where a job runs: this machine, a Cloud TPU VM slice, a SLURM cluster or Kubernetes.

Every target is a frozen dataclass of its settings that implements :class:`base.Target`:
``validate(job)`` (a missing or bad setting -> LaunchError, before anything starts),
``describe(job) -> str`` (exactly what would run: commands, script or manifest; ``--dry_run``
prints it), ``run(job, out, stop) -> int`` (the exit status), and what the launcher, sweeps and
GLUE suites ask of it (its pre-flight, its processes, where launch.json can be written, whether
sweep runs go in parallel and results can be collected at once). A new target is one file
with such a class plus its line in ``TARGETS``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from ..job import LaunchError
from .base import Target
from .kubernetes import KubernetesTarget
from .local import LocalTarget
from .slurm import SlurmTarget
from .tpu import TpuTarget

TARGETS: dict[str, type[Target]] = {
  "local": LocalTarget,
  "tpu": TpuTarget,
  "slurm": SlurmTarget,
  "kubernetes": KubernetesTarget,
}


def target_fields(name: str) -> list[str]:
  return [f.name for f in dataclasses.fields(TARGETS[name])]


def setting_help(name: str) -> dict[str, str]:
  """Each setting's description, from the ``Attributes:`` section of the target's docstring."""
  helps: dict[str, str] = {}
  current = None
  doc = inspect.getdoc(TARGETS[name]) or ""
  in_attributes = False
  for line in doc.splitlines():
    if line.strip() == "Attributes:":
      in_attributes = True
      continue
    if not in_attributes or not line.strip():
      continue
    head, sep, text = line.strip().partition(": ")
    names = [n.strip() for n in head.split(",")]
    if (
      line.startswith("  ")
      and not line.startswith("    ")
      and sep
      and all(n.isidentifier() for n in names)
    ):
      for n in names:
        helps[n] = text
      current = names
    elif current:
      for n in current:
        helps[n] += " " + line.strip()
  return helps


def make_target(name: str, settings: Mapping[str, Any] | None = None) -> Target:
  """A target by name from its settings; a setting it does not have -> LaunchError."""
  if name not in TARGETS:
    raise LaunchError(f"unknown target {name!r}; choose one of {sorted(TARGETS)}")
  settings = dict(settings or {})
  unknown = sorted(set(settings) - set(target_fields(name)))
  if unknown:
    raise LaunchError(
      f"{name} target has no setting(s) {unknown}; its settings: {target_fields(name)}"
    )
  return TARGETS[name](**settings)


def target_settings(target: Target) -> dict[str, Any]:
  """A target's settings as a JSON-able dict (recorded in launch.json)."""
  return dataclasses.asdict(target)


__all__ = [
  "TARGETS",
  "KubernetesTarget",
  "LocalTarget",
  "SlurmTarget",
  "Target",
  "TpuTarget",
  "make_target",
  "setting_help",
  "target_fields",
  "target_settings",
]
