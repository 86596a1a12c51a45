"""Hyper-parameter sweeps: a Python file returns config overrides; the tool runs each of them.

A sweep file defines ``get_sweep(arg) -> list[dict]``, each dict one run's overrides (dotted
config keys -> values), built with the helpers here::

    from launch import sweep

    def get_sweep(arg):
      return sweep.product(
          sweep.axis("learning_rate", [5e-5, 4e-5, 3e-5, 2e-5]),
          sweep.axis("train_batch_size", [16, 32]),
          sweep.axis("num_train_epochs", [2, 3, 4]),
          sweep.axis("seed", range(int(arg or 3))))

Every run gets ``<root>/<name>``, its name made of its overrides (``learning_rate=5e-05,seed=0``).
Before anything starts, the base config is loaded and every run's overrides applied to it: a key
that does not exist (or a value of the wrong type) is a LaunchError naming the sweep file and
the key. A run whose workdir already holds ``metrics.json`` is complete and skipped, so running
a sweep again only runs what is missing or failed. Local runs go one after another or
``parallel`` at a time (``Target.parallel_runs``); remote targets get one job per run. The
results are collected into ``results.csv`` / ``results.md`` (see ``launch.results``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.util
import itertools
import json
import os
import pathlib
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TextIO

from .job import REPO_ROOT, Job, LaunchError, add_import_root, resolve_config
from .launch import launch
from .targets.base import Target

Overrides = dict[str, Any]


def axis(key: str, values: Iterable[Any]) -> list[Overrides]:
  """One axis: ``[{key: v} for v in values]``."""
  values = list(values)
  if not values:
    raise LaunchError(f"sweep axis {key!r} has no values")
  return [{key: v} for v in values]


def fixed(**overrides: Any) -> list[Overrides]:
  """A single point (set keys in every run when combined with ``product``)."""
  return [dict(overrides)]


def product(*sweeps: Sequence[Overrides]) -> list[Overrides]:
  """Every combination of the given sweeps (the last one varies fastest)."""
  out = []
  for combo in itertools.product(*sweeps):
    merged: Overrides = {}
    for point in combo:
      clash = set(merged) & set(point)
      if clash:
        raise LaunchError(f"sweep product sets key(s) {sorted(clash)} twice")
      merged.update(point)
    out.append(merged)
  return out


def zipped(*sweeps: Sequence[Overrides]) -> list[Overrides]:
  """Sweeps of equal length, taken point by point (``zip``)."""
  lengths = {len(s) for s in sweeps}
  if len(lengths) > 1:
    raise LaunchError(f"sweep zip needs sweeps of equal length, got lengths {sorted(lengths)}")
  return product_rows(zip(*sweeps))


def product_rows(rows: Iterable[Sequence[Overrides]]) -> list[Overrides]:
  out = []
  for row in rows:
    out += product(*[[p] for p in row])
  return out


def chain(*sweeps: Sequence[Overrides]) -> list[Overrides]:
  """One sweep after the other."""
  return [dict(p) for s in sweeps for p in s]


def load_sweep(spec: str) -> list[Overrides]:
  """Runs ``get_sweep(arg)`` of a sweep file ``path.py[:arg]``."""
  path, _, arg = spec.partition(":")
  if not pathlib.Path(path).is_file():
    raise LaunchError(f"sweep file {path!r} does not exist")
  add_import_root(pathlib.Path(path))
  if str(REPO_ROOT) not in sys.path:  # sweep files in a checkout import ``launch.sweep``
    sys.path.insert(0, str(REPO_ROOT))
  module_spec = importlib.util.spec_from_file_location(
    f"_launch_sweep_{pathlib.Path(path).stem}", path
  )
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
    points = module.get_sweep(arg)
  except LaunchError as e:
    raise LaunchError(f"{path}: {e}") from e
  except Exception as e:
    raise LaunchError(f"{path}: get_sweep({arg!r}) failed: {type(e).__name__}: {e}") from e
  if not isinstance(points, (list, tuple)) or not all(isinstance(p, Mapping) for p in points):
    raise LaunchError(f"{path}: get_sweep must return a list of dicts of overrides")
  return [dict(p) for p in points]


def _value_text(value: Any) -> str:
  text = repr(value) if isinstance(value, float) else str(value)
  return re.sub(r"[^A-Za-z0-9.+-]+", "-", text)


def run_name(overrides: Mapping[str, Any]) -> str:
  """A directory name made of a run's overrides, in their order: ``lr=5e-05,seed=1``."""
  if not overrides:
    return "default"
  return ",".join(f"{k}={_value_text(v)}" for k, v in overrides.items())


@dataclasses.dataclass(frozen=True)
class SweepRun:
  name: str
  overrides: Overrides
  job: Job

  @property
  def complete(self) -> bool:
    return exists(os.path.join(self.job.workdir, "metrics.json"))


def exists(path: str) -> bool:
  """Whether ``path`` exists (local or gs://); LaunchError when the storage cannot be read."""
  if "://" in path:
    import tensorflow as tf  # noqa: PLC0415 (gs:// only)

    try:
      return tf.io.gfile.exists(path)
    except tf.errors.OpError as e:
      reason = " ".join(e.message.split())
      raise LaunchError(f"cannot check {path}: {reason}") from e
  return os.path.exists(path)


def completed(runs: Sequence[SweepRun], dry_run: bool, out: TextIO) -> list[bool]:
  """Which runs are complete; in a dry run, unreadable storage counts as not complete."""
  try:
    return [r.complete for r in runs]
  except LaunchError as e:
    if not dry_run:
      raise
    out.write(f"# sweep: {e}; listing every run\n")
    return [False] * len(runs)


def plan_sweep(
  base: Job, points: Sequence[Overrides], root: str, source: str = "sweep"
) -> list[SweepRun]:
  """One job per point under ``root``; every point checked against the config first."""
  if not points:
    raise LaunchError(f"{source}: the sweep has no runs")
  runs, seen = [], {}
  for i, point in enumerate(points):
    name = run_name(point)
    if name in seen:
      raise LaunchError(f"{source}: runs {seen[name]} and {i} have the same overrides ({name})")
    seen[name] = i
    job = base.replace(
      workdir=os.path.join(root, name), overrides=tuple(base.overrides) + tuple(point.items())
    )
    resolve_config(job, f"{source} (run {i}: {name})")
    runs.append(SweepRun(name, dict(point), job))
  return runs


def write_sweep_record(root: str, runs: Sequence[SweepRun]) -> None:
  """``<root>/sweep.json``: each run's name and overrides (read back by launch.results)."""
  text = json.dumps(
    {"runs": [{"name": os.path.basename(r.job.workdir), "overrides": r.overrides} for r in runs]},
    indent=2,
    default=str,
  )
  path = os.path.join(root, "sweep.json")
  if "://" in root:
    import tensorflow as tf  # noqa: PLC0415 (gs:// only)

    tf.io.gfile.makedirs(root)
    with tf.io.gfile.GFile(path, "w") as f:
      f.write(text)
    return
  os.makedirs(root, exist_ok=True)
  with open(path, "w") as f:
    f.write(text)


def run_target(target: Target, index: int, first: bool, parallel: int = 1) -> Target:
  """The target for run ``index`` of a sweep (``Target.sweep_run``): e.g. a distinct job name
  where the target has one; on a TPU slice the code is shipped and installed (and the slice
  created) by the first run only; local runs in parallel echo none of their processes."""
  return target.sweep_run(index, first, parallel)


def run_sweep(
  runs: Sequence[SweepRun],
  target: Target,
  parallel: int = 1,
  dry_run: bool = False,
  out: TextIO | None = None,
  on_finish: Callable[[SweepRun, int, float], None] | None = None,
) -> dict[str, int]:
  """Runs (or, dry, prints) every incomplete run; returns {name: exit status} of those run.

  ``on_finish(run, status, seconds)`` is called after each run (e.g. a progress line)."""
  out = out or sys.stdout
  note = "# sweep:" if dry_run else "sweep:"  # a dry run's output stays a valid script / YAML
  for i, r in enumerate(runs):  # every run's target settings, before anything is printed
    run_target(target, i, i == 0).validate(r.job)
  done = completed(runs, dry_run, out)
  todo = [r for r, d in zip(runs, done) if not d]
  for r, d in zip(runs, done):
    if d:
      out.write(f"{note} skip {r.name} (metrics.json present)\n")
  out.write(f"{note} {len(todo)} of {len(runs)} run(s) to {'print' if dry_run else 'run'}\n")
  out.flush()
  if dry_run:
    for r in todo:
      out.write(f"# run {r.name}\n")
      launch(r.job, run_target(target, runs.index(r), r is todo[0]), dry_run=True, out=out)
    return {}
  for root in dict.fromkeys(os.path.dirname(r.job.workdir) for r in runs):
    write_sweep_record(root, [r for r in runs if os.path.dirname(r.job.workdir) == root])
  stop = threading.Event()

  def one(r: SweepRun) -> int:
    if stop.is_set():
      return 128 + signal.SIGTERM
    out.write(f"sweep: start {r.name}\n")
    out.flush()
    start = time.monotonic()
    run_on = run_target(target, runs.index(r), r is todo[0], parallel)
    status = launch(r.job, run_on, out=out, stop=stop)
    out.write(f"sweep: {r.name} {'done' if status == 0 else f'FAILED (status {status})'}\n")
    out.flush()
    if on_finish is not None:
      on_finish(r, status, time.monotonic() - start)
    return status

  # SIGTERM / Ctrl-C stop the running runs (SIGTERM to their processes) and start no more.
  previous = {}
  if threading.current_thread() is threading.main_thread():
    for sig in (signal.SIGTERM, signal.SIGINT):
      previous[sig] = signal.signal(sig, lambda signum, frame: stop.set())
  try:
    workers = max(1, parallel) if target.parallel_runs else 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
      return dict(zip([r.name for r in todo], pool.map(one, todo)))
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
