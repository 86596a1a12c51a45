"""The GLUE table of a ``launch glue`` suite: per-task dev metrics, scores, averages, submission.

Metrics follow GLUE's conventions, on its 0-100 scale: CoLA Matthews correlation, MRPC and QQP
F1 and accuracy, STS-B Pearson and Spearman correlation, MNLI matched and mismatched accuracy,
accuracy elsewhere. A task's score is what the GLUE leaderboard averages: the mean of its two
metrics for MRPC, QQP, STS-B (and MNLI's matched/mismatched), else its one metric. Averages:
over the tasks run, over them without WNLI, and the BERT paper's Table 1 average (no WNLI; MNLI
matched and mismatched as two entries; F1 for MRPC/QQP, Spearman for STS-B; accuracy or MCC
elsewhere), each only where every task it needs was run.

``quick`` protocol: a task's figures are the medians over its seeds (its spread the sample
standard deviation, min and max of the score), and its test predictions those of the run whose
score is the lower median. ``paper`` protocol: the run with the best score on dev.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import statistics
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

from .results import _open, _read_json
from .sweep import exists

# Task -> [(column, split in metrics.json's "eval", metric there)] in GLUE's order of columns.
METRICS: dict[str, list[tuple[str, str, str]]] = {
  "cola": [("mcc", "dev", "mcc")],
  "sst2": [("accuracy", "dev", "accuracy")],
  "mrpc": [("f1", "dev", "f1"), ("accuracy", "dev", "accuracy")],
  "stsb": [("pearson", "dev", "pearson"), ("spearman", "dev", "spearman")],
  "qqp": [("f1", "dev", "f1"), ("accuracy", "dev", "accuracy")],
  "mnli": [
    ("accuracy_m", "dev_matched", "accuracy"),
    ("accuracy_mm", "dev_mismatched", "accuracy"),
  ],
  "qnli": [("accuracy", "dev", "accuracy")],
  "rte": [("accuracy", "dev", "accuracy")],
  "wnli": [("accuracy", "dev", "accuracy")],
}
ORDER = tuple(METRICS)
DIR_NAMES = {
  "cola": "CoLA",
  "sst2": "SST-2",
  "mrpc": "MRPC",
  "stsb": "STS-B",
  "qqp": "QQP",
  "mnli": "MNLI",
  "qnli": "QNLI",
  "rte": "RTE",
  "wnli": "WNLI",
}
# The BERT paper's Table 1 average: one entry per column, WNLI left out.
PAPER_COLUMNS = [
  ("mnli", "accuracy_m"),
  ("mnli", "accuracy_mm"),
  ("qqp", "f1"),
  ("qnli", "accuracy"),
  ("sst2", "accuracy"),
  ("cola", "mcc"),
  ("stsb", "spearman"),
  ("mrpc", "f1"),
  ("rte", "accuracy"),
]


def task_metrics(task: str, metrics: Mapping[str, Any]) -> dict[str, float] | None:
  """A run's GLUE metrics (0-100) and ``score`` from its metrics.json; None when incomplete."""
  evals = metrics.get("eval") or {}
  out = {}
  for column, split, key in METRICS[task]:
    value = (evals.get(split) or {}).get(key)
    if not isinstance(value, (int, float)) or math.isnan(value):
      return None
    out[column] = 100.0 * float(value)
  out["score"] = statistics.fmean(out[c] for c, _, _ in METRICS[task])
  return out


@dataclasses.dataclass
class Run:
  task: str
  name: str
  workdir: str
  overrides: dict[str, Any]
  metrics: dict[str, float] | None  # task_metrics; None while not complete


@dataclasses.dataclass
class TaskRow:
  task: str
  runs_done: int
  runs_planned: int
  metrics: dict[str, float]  # the protocol's figure per column (median or best run's)
  chosen: Run  # the median (quick) or best (paper) run
  spread: dict[str, float] = dataclasses.field(default_factory=dict)  # quick: std, min, max


def read_runs(planned: Sequence[tuple[str, str, str, Mapping[str, Any]]]) -> list[Run]:
  """(task, name, workdir, overrides) of each planned run -> its metrics where complete."""
  runs = []
  for task, name, workdir, overrides in planned:
    record = _read_json(os.path.join(workdir, "metrics.json"))
    found = task_metrics(task, record) if isinstance(record, dict) else None
    runs.append(Run(task, name, workdir, dict(overrides), found))
  return runs


def summarise(runs: Sequence[Run], protocol: str) -> list[TaskRow]:
  """One row per task with at least one complete run, in GLUE's order."""
  rows = []
  for task in ORDER:
    mine = [r for r in runs if r.task == task]
    done = [r for r in mine if r.metrics is not None]
    if not done:
      continue
    if protocol == "paper":
      best = max(done, key=lambda r: r.metrics["score"])  # the first of equal scores
      rows.append(TaskRow(task, len(done), len(mine), dict(best.metrics), best))
      continue
    scores = [r.metrics["score"] for r in done]
    low = statistics.median_low(scores)
    chosen = done[scores.index(low)]
    columns = list(done[0].metrics)
    medians = {c: statistics.median(r.metrics[c] for r in done) for c in columns}
    spread = {
      "std": statistics.stdev(scores) if len(scores) > 1 else float("nan"),
      "min": min(scores),
      "max": max(scores),
    }
    rows.append(TaskRow(task, len(done), len(mine), medians, chosen, spread))
  return rows


def averages(rows: Sequence[TaskRow]) -> dict[str, float | None]:
  """The averages of the table (None where a task they need was not run)."""
  by_task = {r.task: r for r in rows}
  scores = [r.metrics["score"] for r in rows]
  no_wnli = [r.metrics["score"] for r in rows if r.task != "wnli"]
  paper = [by_task[t].metrics[c] for t, c in PAPER_COLUMNS if t in by_task]
  return {
    "average": statistics.fmean(scores) if scores else None,
    "average_without_wnli": statistics.fmean(no_wnli) if no_wnli else None,
    "bert_paper_average": statistics.fmean(paper) if len(paper) == len(PAPER_COLUMNS) else None,
  }


def test_files(task: str) -> list[str]:
  """The GLUE server's file names for a task's test splits."""
  from bert_jax.tasks.glue.data import SPECS  # noqa: PLC0415 (only when collecting)

  return [sub for _, _, sub in SPECS[task].test_files]


def find_test_file(workdir: str, name: str) -> str | None:
  """A run's test predictions: written by the run (predictions/) or by evaluate (eval_test/)."""
  for folder in ("predictions", "eval_test"):
    path = os.path.join(workdir, folder, name)
    if exists(path):
      return path
  return None


def _rows_in(path: str) -> int:
  with _open(path) as f:
    return sum(1 for line in f if line.strip()) - 1  # the header


def build_submission(
  rows: Sequence[TaskRow], expected_rows: Mapping[str, int | None]
) -> tuple[bytes, dict[str, str]]:
  """The zip of the chosen runs' test files, and a note per file (missing, short, ...)."""
  buffer, notes = io.BytesIO(), {}
  with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
    for row in rows:
      for name in test_files(row.task):
        path = find_test_file(row.chosen.workdir, name)
        if path is None:
          notes[name] = f"no test predictions in {row.chosen.workdir}"
          continue
        with _open(path) as f:
          zf.writestr(name, f.read())
        want, got = expected_rows.get(name), _rows_in(path)
        notes[name] = (
          f"{got} rows"
          if want is None or want == got
          else f"{got} rows, the test file has {want}: not a complete submission"
        )
  return buffer.getvalue(), notes


def _cell(x: float | None) -> str:
  return "–" if x is None or math.isnan(x) else f"{x:.1f}"


def render_markdown(suite: Mapping[str, Any], table: Mapping[str, Any]) -> str:
  quick = suite["protocol"] == "quick"
  lines = [
    f"# GLUE dev: {suite['init_checkpoint']}",
    "",
    f"Protocol: **{suite['protocol']}** "
    + (
      "(median over seeds of one setting: "
      + (", ".join(f"{k}={v}" for k, v in table["settings"].items()) or "the overrides")
      + ")"
      if quick
      else "(the paper's grid; the best run on dev per task)"
    )
    + f". Overrides for every run: {' '.join(suite['extra_args']) or 'none'}.",
    "",
    "| task | metrics | score | " + ("std | min to max | seeds |" if quick else "runs | chosen |"),
    "|---|---|---|" + ("---|---|---|" if quick else "---|---|"),
  ]
  for row in table["tasks"]:
    metrics = ", ".join(f"{k} {_cell(v)}" for k, v in row["metrics"].items() if k != "score")
    head = f"| {DIR_NAMES[row['task']]} | {metrics} | {_cell(row['metrics']['score'])} |"
    if quick:
      s = row["spread"]
      lines.append(
        f"{head} {_cell(s['std'])} | {_cell(s['min'])} to {_cell(s['max'])} | "
        f"{row['runs_done']}/{row['runs_planned']} |"
      )
    else:
      chosen = ",".join(f"{k}={v}" for k, v in row["chosen_overrides"].items())
      lines.append(f"{head} {row['runs_done']}/{row['runs_planned']} | {chosen} |")
  avg = table["averages"]
  lines += [
    "",
    f"Average over the {len(table['tasks'])} task(s) run: **{_cell(avg['average'])}**; "
    f"without WNLI: **{_cell(avg['average_without_wnli'])}**; the BERT paper's Table 1 "
    f"average: {_cell(avg['bert_paper_average'])}"
    + ("" if avg["bert_paper_average"] is not None else " (needs all eight tasks but WNLI)")
    + ".",
    "",
  ]
  if table["no_complete_run"]:
    names = ", ".join(table["no_complete_run"])
    lines += [f"No complete run yet (rerun the command to finish): {names}.", ""]
  if table["not_run"]:
    lines += [
      f"Not run (no data under data_dir, or not in --tasks): {', '.join(table['not_run'])}.",
      "",
    ]
  incomplete = [r for r in table["tasks"] if r["runs_done"] < r["runs_planned"]]
  if incomplete:
    names = ", ".join(DIR_NAMES[r["task"]] for r in incomplete)
    lines += [f"Incomplete (runs missing or failed; rerun to finish): {names}.", ""]
  lines += ["## Test predictions (submission.zip)", ""]
  lines += [f"- {name}: {note}" for name, note in table["submission"].items()]
  return "\n".join(lines) + "\n"


def write_report(
  root: str,
  suite: Mapping[str, Any],
  runs: Sequence[Run],
  tasks: Sequence[str],
  expected_rows: Mapping[str, int | None],
) -> dict[str, Any]:
  """Writes ROOT/glue.json, glue.md and submission.zip from the runs complete so far."""
  rows = summarise(runs, suite["protocol"])
  archive, notes = build_submission(rows, expected_rows)
  table = {
    "suite": dict(suite),
    "settings": suite.get("settings", {}),
    "tasks": [
      {
        "task": r.task,
        "metrics": r.metrics,
        "spread": r.spread,
        "runs_done": r.runs_done,
        "runs_planned": r.runs_planned,
        "chosen_run": r.chosen.name,
        "chosen_overrides": r.chosen.overrides,
      }
      for r in rows
    ],
    "averages": averages(rows),
    "not_run": [DIR_NAMES[t] for t in ORDER if t not in tasks],
    "no_complete_run": [
      DIR_NAMES[t] for t in ORDER if t in tasks and t not in {r.task for r in rows}
    ],
    "not_complete": [f"{r.task}/{r.name}" for r in runs if r.metrics is None and r.task in tasks],
    "submission": notes,
  }
  text = json.dumps(_no_nan(table), indent=2, default=str)
  with _open(os.path.join(root, "glue.json"), "w") as f:
    f.write(text + "\n")
  with _open(os.path.join(root, "glue.md"), "w") as f:
    f.write(render_markdown(suite, table))
  _write_bytes(os.path.join(root, "submission.zip"), archive)
  return table


def _write_bytes(path: str, data: bytes) -> None:
  if "://" in path:
    import tensorflow as tf  # noqa: PLC0415 (remote roots only)

    with tf.io.gfile.GFile(path, "wb") as f:
      f.write(data)
    return
  with open(path, "wb") as f:
    f.write(data)


def _no_nan(x: Any) -> Any:
  """NaN (a single seed's std) as null: glue.json stays strict JSON."""
  if isinstance(x, float) and math.isnan(x):
    return None
  if isinstance(x, Mapping):
    return {k: _no_nan(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_no_nan(v) for v in x]
  return x
