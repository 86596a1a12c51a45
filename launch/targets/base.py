"""What every target is to the launcher: the interface ``launch``, ``preflight``, ``sweep`` and
``glue`` use, so that none of them asks which target it holds.

A target is a frozen dataclass of its settings (the dataclass fields are its flags and what
launch.json records under ``target_settings``) that subclasses :class:`Target`. A new target is
one file defining such a class plus one line in ``launch/targets/__init__.py``'s ``TARGETS``.

An abstract base class rather than a ``typing.Protocol``: a class that misses a required member
cannot be instantiated (``make_target`` fails at once with the names, not a launch half-way
through), the members most remote targets share have one default here instead of a copy in each
target, and ``issubclass`` / ``inspect.isabstract`` check the whole interface, where a
runtime-checkable Protocol only looks for the names.
"""

from __future__ import annotations

import abc
import threading
from typing import Any, ClassVar, TextIO

from ..job import Job


def can_write(workdir: str) -> bool:
  """Whether a file can be written into ``workdir`` from here (a local path or a gs:// bucket)."""
  return workdir.startswith("gs://") or "://" not in workdir


class Target(abc.ABC):
  """Where a job runs.

  Required (abstract): ``name``, :meth:`validate`, :meth:`describe`, :meth:`run`,
  :attr:`processes`. The other members have the defaults of a target that hands the job to
  machines elsewhere and returns: no pre-flight, no topology, launch.json written where the
  workdir is writable from here, sweep runs one after another and alike, results collected by a
  later invocation.
  """

  name: ClassVar[str]
  """The target's name: ``--target=<name>``, launch.json's ``target`` and messages."""

  @abc.abstractmethod
  def validate(self, job: Job) -> None:
    """LaunchError (one line, naming the setting) when a setting is missing or wrong for
    ``job``; before anything is printed, created or run, in a dry run as in a launch."""

  @abc.abstractmethod
  def describe(self, job: Job) -> str:
    """Exactly what :meth:`run` would do (commands, script or manifest); ``--dry_run`` prints
    it. Starts nothing."""

  @abc.abstractmethod
  def run(self, job: Job, out: TextIO | None = None, stop: threading.Event | None = None) -> int:
    """Starts the job (its progress lines to ``out``, stdout when None); the exit status: the
    job's own where :attr:`results_on_return`, else that of handing it over (submitting,
    applying). ``stop`` being set (a sweep stopped) stops a job that runs in this process;
    targets that only hand the job over ignore it."""

  @property
  @abc.abstractmethod
  def processes(self) -> int:
    """How many processes the job runs (launch.json's ``num_processes``); 0 where only the
    workers know (a TPU slice's hosts)."""

  def preflight(self, job: Job, config) -> dict[str, Any] | None:
    """Compiles ``job`` (its resolved ``config``) for the chips it will run on before anything
    is created (LaunchError when it does not fit); the record for launch.json, or None when the
    target has no pre-flight or it is skipped."""
    del job, config
    return None

  def topology_name(self) -> str | None:
    """The topology the chips of the job are named by (a TPU accelerator type, or a GPU
    topology such as "h100:2x8"), which the config is checked against in a dry run; None where
    the target does not say."""
    return None

  @property
  def on_this_machine(self) -> bool:
    """Whether the job runs on this machine: its devices are this host's (a dry run checks the
    attention kernel on them) and its interpreter is this one."""
    return False

  def records_here(self, job: Job) -> bool:
    """Whether the launcher can write launch.json into ``job``'s workdir from here (else it
    says so and writes nothing)."""
    return can_write(job.workdir)

  @property
  def results_on_return(self) -> bool:
    """Whether the job has ended when :meth:`run` returns and its workdir is readable here, so
    that a sweep or GLUE suite collects results at once (else the runs are submitted and the
    same command, run again later, collects them)."""
    return False

  @property
  def parallel_runs(self) -> bool:
    """Whether a sweep may run several of its runs at a time (``--parallel``): each
    :meth:`run` waits for its job in this process. Else the runs go one after another."""
    return False

  def sweep_run(self, index: int, first: bool, parallel: int = 1) -> Target:
    """The target for run ``index`` of a sweep (``first``: the first run this invocation
    starts, which creates what the runs share; ``parallel``: runs at a time), e.g. a distinct
    job name; this target where every run is alike."""
    del index, first, parallel
    return self


__all__ = ["Target", "can_write"]
