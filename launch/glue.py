r"""The GLUE table in one command: fine-tune a checkpoint on every GLUE task found, collect it.

  python -m launch glue --init_checkpoint=CKPT --data_dir=../shared/data/glue --workdir=ROOT \
      [--protocol=quick|paper] [--seeds=N] [--tasks=cola,rte] [--parallel=N] [--dry_run] \
      [target flags] [-- --config.max_seq_length=64 ...]

Each task is a sweep (``launch.sweep``) under ``ROOT/<task>/<run>``, on any launch target:

- ``quick``: one setting for every task (``QUICK_SETTINGS``; a ``--config.<key>`` after ``--``
  replaces it) and ``--seeds`` seeds (default 5); a task's figure is the median over seeds.
- ``paper``: the BERT paper's grid (lr x batch x epochs, ``PAPER_GRID``), times ``--seeds``
  (default 1); a task's figure is its best run on dev.

Runs predict no test set; afterwards the chosen run of each task (median or best) predicts it
with ``bert_jax.evaluate --split=test`` (every test row: ``max_eval_examples`` is lifted), unless
``--config.predict_test=true`` is passed. ``ROOT/glue.json``, ``glue.md`` and ``submission.zip``
(``launch.glue_report``) are rebuilt from the runs complete so far at every invocation, so a
killed suite resumes: complete runs (``metrics.json``) are skipped, only the missing ones run.
``ROOT/glue_suite.json`` records the suite (checkpoint, protocol, data, overrides); a ROOT of
another suite is refused. Every input is checked before any work; a bad one is one line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from . import glue_report as report
from . import sweep
from .job import Job, LaunchError, config_overrides_in_args, resolve_config
from .launch import launch
from .results import _listdir, _open, _read_json
from .targets.base import Target

PROTOCOLS = ("quick", "paper")
QUICK_SETTINGS = {"learning_rate": 4e-5, "train_batch_size": 32, "num_train_epochs": 3.0}
PAPER_GRID = {
  "learning_rate": [5e-5, 4e-5, 3e-5, 2e-5],
  "train_batch_size": [16, 32],
  "num_train_epochs": [2, 3, 4],
}
CONFIG = "configs/glue.py"
SUITE_FILE = "glue_suite.json"
IDENTITY = ("protocol", "init_checkpoint", "data_dir", "extra_args")
# The dry run's time estimate without measured runs: start-up and compilation, then training
# examples (x epochs) per second; an evaluated or predicted row costs a third of one.
ASSUMED_OVERHEAD_S = 30.0
ASSUMED_EXAMPLES_PER_S = 10.0
EVAL_COST = 1 / 3
STOPPED = (128 + signal.SIGTERM, 128 + signal.SIGINT)  # a run's status when the suite stopped


@dataclasses.dataclass(frozen=True)
class Suite:
  root: str
  init_checkpoint: str
  data_dir: str
  protocol: str = "quick"
  tasks: tuple[str, ...] = ()  # empty: every task with data
  seeds: int = 0  # 0: the protocol's default (quick 5, paper 1)
  extra_args: tuple[str, ...] = ()
  python: str = sys.executable
  config: str = CONFIG  # the GLUE config file (the task is its argument)

  def identity(self) -> dict[str, Any]:
    return {k: getattr(self, k) if k != "extra_args" else list(self.extra_args) for k in IDENTITY}


def _abs(path: str) -> str:
  return path if "://" in path else os.path.abspath(path)


def task_name(name: str) -> str:
  """A task named as in the registry (``sst2``) or as GLUE's folder (``SST-2``)."""
  by_dir = {d.lower(): t for t, d in report.DIR_NAMES.items()}
  key = name.strip().lower()
  if key in report.DIR_NAMES:
    return key
  if key in by_dir:
    return by_dir[key]
  raise LaunchError(
    f"--tasks: unknown GLUE task {name!r}; known: {', '.join(report.ORDER)} "
    f"(or {', '.join(report.DIR_NAMES.values())})"
  )


def _passed(extra_args: Sequence[str]) -> dict[str, str]:
  return dict(config_overrides_in_args(extra_args))


def task_files(data_dir: str, task: str) -> dict[str, str]:
  """The TSV files of a task under a GLUE root: train, dev file(s), test file(s)."""
  from bert_jax.tasks.glue.data import SPECS  # noqa: PLC0415 (imports JAX)

  spec, folder = SPECS[task], os.path.join(data_dir, report.DIR_NAMES[task])
  files = {"train": os.path.join(folder, "train.tsv")}
  files.update({split: os.path.join(folder, f) for split, f in spec.eval_files})
  files.update({sub: os.path.join(folder, f) for _, f, sub in spec.test_files})
  return files


def has_data(suite: Suite, task: str) -> bool:
  """Whether ``task`` can be fine-tuned: its train and dev TSVs, or its TFDS data."""
  passed = _passed(suite.extra_args)
  if passed.get("data_source") == "tfds":
    tfds_dir = passed.get("tfds_data_dir", "")
    return bool(tfds_dir) and os.path.isdir(os.path.join(tfds_dir, "glue", task))
  files = task_files(suite.data_dir, task)
  from bert_jax.tasks.glue.data import SPECS  # noqa: PLC0415 (imports JAX)

  needed = ["train"] + [s for s, _ in SPECS[task].eval_files]
  return all(sweep.exists(files[s]) for s in needed)


def choose_tasks(suite: Suite) -> list[str]:
  """The tasks to run: those asked for (each must have data), else every task with data."""
  asked = [task_name(t) for t in suite.tasks]
  if asked:
    missing = [report.DIR_NAMES[t] for t in asked if not has_data(suite, t)]
    if missing:
      raise LaunchError(
        f"--tasks: no data for {', '.join(missing)} under --data_dir={suite.data_dir} "
        "(expected <Task>/train.tsv and dev.tsv)"
      )
    return [t for t in report.ORDER if t in asked]
  found = [t for t in report.ORDER if has_data(suite, t)]
  if not found:
    raise LaunchError(
      f"--data_dir={suite.data_dir}: no GLUE task data found (expected CoLA/train.tsv, "
      "SST-2/train.tsv, ... with their dev.tsv)"
    )
  return found


def check_checkpoint(path: str) -> None:
  """A checkpoint fine-tuning can load (bert_jax workdir, Hugging Face dir, TF checkpoint)."""
  if not path:
    raise LaunchError("--init_checkpoint is required (a bert_jax workdir, HF or TF checkpoint)")
  if "://" in path:
    return  # remote storage: checked by the run itself
  from bert_jax.formats import CheckpointError, detect  # noqa: PLC0415 (imports JAX)

  try:
    detect(path)
  except CheckpointError as e:
    raise LaunchError(f"--init_checkpoint: {e}") from e


def check_suite_record(suite: Suite) -> None:
  """Refuses a ROOT that holds another suite's runs (or files of something else)."""
  record = _read_json(os.path.join(suite.root, SUITE_FILE))
  if record is None:
    try:
      entries = _listdir(suite.root)
    except LaunchError:
      return  # no ROOT yet
    if entries:
      raise LaunchError(
        f"--workdir={suite.root} is not empty and has no {SUITE_FILE}: not a launch glue "
        "root; use a new directory"
      )
    return
  mine = suite.identity()
  for key in IDENTITY:
    if record.get(key) != mine[key]:
      raise LaunchError(
        f"--workdir={suite.root} holds another suite ({SUITE_FILE}: {key} = "
        f"{record.get(key)!r}, this one: {mine[key]!r}); use another --workdir"
      )


def settings(suite: Suite) -> dict[str, Any]:
  """The quick protocol's setting, less the keys passed after ``--`` (which replace them)."""
  passed = _passed(suite.extra_args)
  if suite.protocol == "paper":
    clash = sorted(set(passed) & set(PAPER_GRID))
    if clash:
      raise LaunchError(f"--config.{clash[0]} is swept by the paper protocol; drop it")
    return {}
  return {k: v for k, v in QUICK_SETTINGS.items() if k not in passed}


def points(suite: Suite) -> list[dict[str, Any]]:
  seeds = suite.seeds or (5 if suite.protocol == "quick" else 1)
  seed_axis = sweep.axis("seed", range(seeds))
  if suite.protocol == "quick":
    return seed_axis
  grid = [sweep.axis(k, v) for k, v in PAPER_GRID.items()]
  return sweep.product(*grid, seed_axis) if seeds > 1 else sweep.product(*grid)


def plan(suite: Suite, tasks: Sequence[str]) -> list[tuple[str, sweep.SweepRun]]:
  """(task, run) of every run of the suite, each checked against the config first."""
  passed = _passed(suite.extra_args)
  for key in ("init_checkpoint", "data_dir"):
    if key in passed:
      raise LaunchError(f"--config.{key}: pass --{key} to launch glue instead")
  base = {"init_checkpoint": suite.init_checkpoint, "data_dir": suite.data_dir}
  if "predict_test" not in passed:
    base["predict_test"] = False  # the chosen runs predict it afterwards
  base.update(settings(suite))
  out = []
  for task in tasks:
    job = Job(
      "finetune",
      f"{suite.config}:{task}",
      os.path.join(suite.root, task),
      overrides=tuple(base.items()),
      extra_args=suite.extra_args,
      python=suite.python,
    )
    for run in sweep.plan_sweep(job, points(suite), job.workdir, f"glue {task}"):
      out.append((task, dataclasses.replace(run, name=f"{task}/{run.name}")))
  return out


# --- the dry run's estimate -------------------------------------------------------------------
def _rows(path: str, header: bool = True) -> int:
  if not os.path.isfile(path):
    return 0
  with open(path, encoding="utf-8", errors="replace") as f:
    return max(0, sum(1 for line in f if line.strip()) - int(header))


def work(suite: Suite, task: str, run: sweep.SweepRun) -> tuple[int, float, int]:
  """(training examples, epochs, evaluated rows) of a run, from its config and the TSVs."""
  config = resolve_config(run.job)
  files = task_files(suite.data_dir, task)
  from bert_jax.tasks.glue.data import SPECS  # noqa: PLC0415 (imports JAX)

  spec = SPECS[task]
  train = _rows(files["train"], header=task != "cola")
  if config.max_train_examples:
    train = min(train, int(config.max_train_examples))
  epochs = float(config.num_train_epochs)
  if config.num_train_steps:
    epochs = config.num_train_steps * config.train_batch_size / max(train, 1)
  cap = int(config.max_eval_examples) or math.inf
  rows = sum(min(_rows(files[s], header=task != "cola"), cap) for s, _ in spec.eval_files)
  if config.predict_test:
    rows += sum(min(_rows(files[sub]), cap) for _, _, sub in spec.test_files)
  return train, epochs, int(rows)


def seconds_per_unit(runs: Sequence[tuple[str, sweep.SweepRun]], suite: Suite) -> float | None:
  """Measured wall seconds per unit of work (a training example) of the runs complete."""
  spent, units = 0.0, 0.0
  for task, r in runs:
    summary = _read_json(os.path.join(r.job.workdir, "summary.json"))
    if isinstance(summary, dict) and summary.get("wall_seconds") and r.complete:
      train, epochs, rows = work(suite, task, r)
      spent += float(summary["wall_seconds"])
      units += train * epochs + rows * EVAL_COST
  return spent / units if units else None


def _duration(seconds: float) -> str:
  m, s = divmod(int(round(seconds)), 60)
  h, m = divmod(m, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def describe_plan(
  suite: Suite, runs: Sequence[tuple[str, sweep.SweepRun]], tasks: Sequence[str], out: TextIO
) -> None:
  """The dry run: every run still to do with its estimated time, and how it was estimated."""
  measured = seconds_per_unit(runs, suite)
  total, todo = 0.0, 0
  for task, r in runs:
    if r.complete:
      out.write(f"# glue: {r.name}: complete (metrics.json present)\n")
      continue
    train, epochs, rows = work(suite, task, r)
    units = train * epochs + rows * EVAL_COST
    secs = units * measured if measured else ASSUMED_OVERHEAD_S + units / ASSUMED_EXAMPLES_PER_S
    total, todo = total + secs, todo + 1
    out.write(
      f"# glue: {r.name}: {train} train examples x {epochs:g} epochs, {rows} eval rows: "
      f"~{_duration(secs)}\n"
    )
  how = (
    f"measured: {measured:.3f} s per training example in this root's complete runs"
    if measured
    else f"assumed: {ASSUMED_OVERHEAD_S:.0f} s start-up + {ASSUMED_EXAMPLES_PER_S:g} training "
    f"examples/s, an eval row {EVAL_COST:.2f} of one (MiniLM-L6, length 64, 2 CPU cores)"
  )
  out.write(
    f"# glue: {todo} of {len(runs)} run(s) to run over {len(tasks)} task(s), "
    f"estimated ~{_duration(total)} one at a time ({how})\n"
  )
  if "predict_test" not in _passed(suite.extra_args):
    out.write("# glue: then each task's chosen run predicts its test set (bert_jax.evaluate)\n")


# --- running and collecting -------------------------------------------------------------------
def expected_test_rows(suite: Suite, tasks: Sequence[str]) -> dict[str, int | None]:
  out: dict[str, int | None] = {}
  for task in tasks:
    for sub, path in task_files(suite.data_dir, task).items():
      if sub.endswith(".tsv"):
        out[sub] = _rows(path) if os.path.isfile(path) else None
  return out


def predict_tests(suite: Suite, rows, target: Target, out: TextIO) -> list[str]:
  """Runs bert_jax.evaluate --split=test on each chosen run without test predictions."""
  failed = []
  for row in rows:
    if row.runs_done < row.runs_planned:
      continue  # the chosen run may change when the missing runs complete
    names = report.test_files(row.task)
    files = task_files(suite.data_dir, row.task)
    wanted = [n for n in names if os.path.isfile(files[n]) or "://" in suite.data_dir]
    if not wanted or all(report.find_test_file(row.chosen.workdir, n) for n in wanted):
      continue
    last = _read_json(os.path.join(row.chosen.workdir, "launch.json")) or {}
    if not target.results_on_return and last.get("entry") == "bert_jax.evaluate":
      out.write(f"glue: test predictions of {row.task}/{row.chosen.name} submitted; waiting\n")
      continue  # submitted by an earlier invocation, not finished yet
    job = Job(
      "evaluate",
      "",
      row.chosen.workdir,
      extra_args=("--split=test", "--set=max_eval_examples=0"),
      python=suite.python,
    )
    out.write(f"glue: test predictions of {row.task}/{row.chosen.name}\n")
    out.flush()
    status = launch(job, target, out=out)
    if status:
      failed.append(f"{row.task} test predictions (status {status})")
  return failed


def run_glue(
  suite: Suite, target: Target, parallel: int = 1, dry_run: bool = False, out=None
) -> int:
  """Checks everything, then runs (or lists) the suite and writes the table; an exit status."""
  out = out or sys.stdout
  suite = dataclasses.replace(
    suite,
    root=_abs(suite.root),
    data_dir=_abs(suite.data_dir) if suite.data_dir else "",
    init_checkpoint=_abs(suite.init_checkpoint)
    if os.path.exists(suite.init_checkpoint)
    else suite.init_checkpoint,
  )
  if not suite.data_dir:
    raise LaunchError("--data_dir is required (the GLUE root holding CoLA/, SST-2/, ...)")
  if suite.protocol not in PROTOCOLS:
    raise LaunchError(f"--protocol must be one of {PROTOCOLS}, got {suite.protocol!r}")
  if not os.path.isdir(suite.data_dir) and "://" not in suite.data_dir:
    raise LaunchError(f"--data_dir={suite.data_dir}: no such directory")
  tasks = choose_tasks(suite)
  check_checkpoint(suite.init_checkpoint)
  check_suite_record(suite)
  runs = plan(suite, tasks)
  sweep_runs = [r for _, r in runs]
  for i, r in enumerate(sweep_runs):  # every run's target settings, before any work
    sweep.run_target(target, i, i == 0).validate(r.job)
  if dry_run:
    describe_plan(suite, runs, tasks, out)
    out.write("# glue: the first run (the others differ in workdir and overrides):\n")
    return launch(sweep_runs[0].job, sweep.run_target(target, 0, True), dry_run=True, out=out)
  record = os.path.join(suite.root, SUITE_FILE)
  if _read_json(record) is None:
    if "://" not in suite.root:
      os.makedirs(suite.root, exist_ok=True)
    with _open(record, "w") as f:
      f.write(json.dumps(suite.identity(), indent=2) + "\n")
  todo = [r for r in sweep_runs if not r.complete]
  done, took = [len(sweep_runs) - len(todo)], []

  def progress(r: sweep.SweepRun, status: int, seconds: float) -> None:
    done[0] += 1
    took.append(seconds)
    task, name = r.name.split("/", 1)
    found = report.read_runs([(task, name, r.job.workdir, r.overrides)])[0].metrics
    what = (
      f"score {found['score']:.1f}"
      if status == 0 and found
      else f"FAILED (status {status}; logs in {r.job.workdir}/logs)"
    )
    left = (len(sweep_runs) - done[0]) * sum(took) / len(took) / max(1, parallel)
    out.write(
      f"glue: [{done[0]}/{len(sweep_runs)}] {r.name}: {what} in {_duration(seconds)}; "
      f"~{_duration(left)} left for the runs\n"
    )
    out.flush()

  statuses = sweep.run_sweep(sweep_runs, target, parallel, on_finish=progress, out=out)
  halted = {n for n, s in statuses.items() if s in STOPPED}
  stopped = bool(halted)
  if not target.results_on_return and todo:
    out.write("glue: runs submitted; run the same command again once they finish to collect\n")
    return max(statuses.values(), default=0)
  planned = [(t, r.name.split("/", 1)[1], r.job.workdir, r.overrides) for t, r in runs]
  rows = report.summarise(report.read_runs(planned), suite.protocol)
  failed = [n for n, s in statuses.items() if s and n not in halted]
  if not stopped and "predict_test" not in _passed(suite.extra_args):
    failed += predict_tests(suite, rows, target, out)
  identity = {**suite.identity(), "settings": settings(suite), "tasks": tasks}
  table = report.write_report(
    suite.root, identity, report.read_runs(planned), tasks, expected_test_rows(suite, tasks)
  )
  avg = table["averages"]
  out.write(
    f"glue: {len(table['tasks'])} task(s); average {_fmt(avg['average'])}, without WNLI "
    f"{_fmt(avg['average_without_wnli'])}; {suite.root}/glue.md, glue.json, submission.zip"
    + (
      f"; interrupted ({len(halted)} run(s) stopped or not started): run the same command "
      "again to finish"
      if stopped
      else ""
    )
    + f"; failed: {', '.join(failed) or 'none'}\n"
  )
  return 1 if failed or stopped else 0


def _fmt(x: float | None) -> str:
  return "–" if x is None else f"{x:.1f}"
