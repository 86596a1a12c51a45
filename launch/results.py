"""Collect a sweep's results into tables: every run, and every configuration over its seeds.

Each run directory ``<root>/<name>`` holds the ``metrics.json`` the fine-tuning entry point
writes (``{"task": ..., "primary_metric": "mcc", "dev": {"mcc": ..., ...}, ...}``); its
overrides come from ``<root>/sweep.json`` (else the run's ``launch.json``). Metrics are
flattened to dotted names (``dev.mcc``); the chosen metric defaults to the primary metric of
the first split holding it. Runs are sorted by that metric (best first), the best run is named,
and runs that differ only in ``seed`` are aggregated: mean, sample standard deviation
(ddof=1; none for a single seed: an empty CSV cell, "–" in Markdown, "0.5234 (1 seed)" in
sentences) and the number of seeds. Written as ``results.csv``, ``results_by_config.csv`` and
``results.md`` in the sweep's root.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .job import LaunchError

SEED_KEYS = ("seed",)


@dataclasses.dataclass
class RunResult:
  name: str
  overrides: dict[str, Any]
  metrics: dict[str, float]  # flattened, e.g. {"dev.accuracy": 0.71}
  primary_metric: str | None
  higher_is_better: bool | None


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, Mapping):
      out.update(flatten(v, key + "."))
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
      out[key] = float(v)
  return out


def _open(path: str, mode: str = "r"):
  """open(), or tf.io.gfile for gs:// and other remote paths."""
  if "://" in path:
    import tensorflow as tf  # noqa: PLC0415 (remote roots only)

    return tf.io.gfile.GFile(path, mode)
  return open(path, mode, newline="" if "w" in mode else None)


def _listdir(root: str) -> list[str]:
  if "://" in root:
    import tensorflow as tf  # noqa: PLC0415 (remote roots only)

    if not tf.io.gfile.isdir(root):
      raise LaunchError(f"sweep root {root!r} is not a directory")
    return [n.rstrip("/") for n in tf.io.gfile.listdir(root)]
  if not os.path.isdir(root):
    raise LaunchError(f"sweep root {root!r} is not a directory")
  return os.listdir(root)


def _read_json(path: str) -> Any:
  """The JSON at ``path``; None when there is no such file."""
  try:
    with _open(path) as f:
      text = f.read()
  except (FileNotFoundError, NotADirectoryError):
    return None
  except Exception as e:  # gfile's NotFoundError is no FileNotFoundError
    if type(e).__name__ == "NotFoundError":
      return None
    raise
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise LaunchError(f"{path}: not valid JSON (line {e.lineno}): {e.msg}") from e


def collect(root: str) -> list[RunResult]:
  """Every complete run (a directory with metrics.json) under ``root`` (local or gs://)."""
  names = sorted(_listdir(root))
  sweep_record = _read_json(os.path.join(root, "sweep.json")) or {"runs": []}
  known = {r["name"]: r["overrides"] for r in sweep_record["runs"]}
  results = []
  for name in names:
    metrics = _read_json(os.path.join(root, name, "metrics.json"))
    if not isinstance(metrics, dict):
      continue
    overrides = known.get(name)
    if overrides is None:
      overrides = (_read_json(os.path.join(root, name, "launch.json")) or {}).get("overrides")
    results.append(
      RunResult(
        name,
        dict(overrides or {}),
        flatten(metrics),
        metrics.get("primary_metric"),
        metrics.get("higher_is_better"),
      )
    )
  return results


def choose_metric(results: Sequence[RunResult], metric: str | None) -> str:
  """The metric to sort by: as given (a flattened name or a bare name), else the primary one."""
  if not results:
    raise LaunchError("no complete runs (no metrics.json) to collect")
  names = set().union(*(r.metrics for r in results))
  wanted = metric or results[0].primary_metric
  if not wanted:
    raise LaunchError(
      f"metrics.json names no primary_metric; pass --metric (one of {sorted(names)})"
    )
  if wanted in names:
    return wanted
  candidates = sorted(n for n in names if n.endswith("." + wanted))
  dev_first = sorted(candidates, key=lambda n: (not n.startswith("dev"), n))
  if not dev_first:
    raise LaunchError(f"metric {wanted!r} is in no metrics.json; known: {sorted(names)}")
  return dev_first[0]


NO_SPREAD = "–"  # a Markdown cell with no standard deviation (a single seed)


def _fmt(x: Any) -> str:
  if isinstance(x, float):
    return NO_SPREAD if math.isnan(x) else f"{x:.4f}"
  return str(x)


def mean_and_spread(row: Mapping[str, Any], metric: str) -> str:
  """A configuration's metric over its seeds: "0.5332 ± 0.0304 (2 seeds)", "0.5234 (1 seed)"."""
  mean, std, seeds = row[f"{metric} mean"], row[f"{metric} std"], row["seeds"]
  if seeds == 1 or math.isnan(std):
    return f"{mean:.4f} ({seeds} seed{'s' if seeds != 1 else ''})"
  return f"{mean:.4f} ± {std:.4f} ({seeds} seeds)"


@dataclasses.dataclass
class Tables:
  metric: str
  higher_is_better: bool
  runs: list[dict[str, Any]]  # one row per run, best first
  configs: list[dict[str, Any]]  # one row per configuration (seeds aggregated), best first
  keys: list[str]  # override keys (columns)

  @property
  def best_run(self) -> dict[str, Any]:
    return self.runs[0]

  @property
  def best_config(self) -> dict[str, Any]:
    return self.configs[0]

  def describe_config(self, row: Mapping[str, Any]) -> str:
    """A configuration's overrides (seeds left out), ``key=value,...``; "every run" when
    the runs differ only in seed."""
    keys = [k for k in self.keys if k in row]
    return ",".join(f"{k}={row[k]}" for k in keys) or "every run"


def build_tables(
  results: Sequence[RunResult], metric: str | None = None, higher_is_better: bool | None = None
) -> Tables:
  metric = choose_metric(results, metric)
  if higher_is_better is None:
    # metrics.json's higher_is_better is about its primary metric only.
    hib = [
      r.higher_is_better
      for r in results
      if r.higher_is_better is not None and metric.rsplit(".", 1)[-1] == r.primary_metric
    ]
    higher_is_better = hib[0] if hib else not any(s in metric for s in ("loss", "perplexity"))
  keys = list(dict.fromkeys(k for r in results for k in r.overrides))
  sign = -1.0 if higher_is_better else 1.0
  scored = [r for r in results if metric in r.metrics]
  runs = sorted(
    (
      {"run": r.name, **{k: r.overrides.get(k, "") for k in keys}, metric: r.metrics[metric]}
      for r in scored
    ),
    key=lambda row: sign * row[metric],
  )
  config_keys = [k for k in keys if k.rsplit(".", 1)[-1] not in SEED_KEYS]
  groups: dict[tuple, list[float]] = {}
  for r in scored:
    groups.setdefault(tuple(str(r.overrides.get(k, "")) for k in config_keys), []).append(
      r.metrics[metric]
    )
  configs = []
  for group, values in groups.items():
    std = statistics.stdev(values) if len(values) > 1 else float("nan")
    configs.append(
      {
        **dict(zip(config_keys, group)),
        f"{metric} mean": statistics.fmean(values),
        f"{metric} std": std,
        "seeds": len(values),
      }
    )
  configs.sort(key=lambda row: sign * row[f"{metric} mean"])
  return Tables(metric, higher_is_better, runs, configs, keys)


def _markdown(rows: Sequence[Mapping[str, Any]]) -> str:
  if not rows:
    return "(none)\n"
  cols = list(rows[0])
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  lines += ["| " + " | ".join(_fmt(row[c]) for c in cols) + " |" for row in rows]
  return "\n".join(lines) + "\n"


def render_markdown(tables: Tables) -> str:
  best = tables.best_run
  best_cfg = tables.configs[0]
  direction = "higher" if tables.higher_is_better else "lower"
  return (
    f"# Sweep results: {tables.metric} ({direction} is better)\n\n"
    f"Best run: **{best['run']}** with {tables.metric} = {_fmt(best[tables.metric])}.\n\n"
    f"Best configuration over seeds: {tables.describe_config(best_cfg)}: "
    f"{mean_and_spread(best_cfg, tables.metric)}.\n\n"
    f"## Configurations (mean and standard deviation over seeds)\n\n"
    f"{_markdown(tables.configs)}\n## Runs\n\n{_markdown(tables.runs)}"
  )


def _write_csv(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
  with _open(path, "w") as f:
    if not rows:
      return
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(
      {k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
      for row in rows
    )


def write_results(
  root: str, metric: str | None = None, higher_is_better: bool | None = None
) -> Tables:
  """Collects ``root`` and writes results.csv, results_by_config.csv and results.md there."""
  tables = build_tables(collect(root), metric, higher_is_better)
  _write_csv(os.path.join(root, "results.csv"), tables.runs)
  _write_csv(os.path.join(root, "results_by_config.csv"), tables.configs)
  with _open(os.path.join(root, "results.md"), "w") as f:
    f.write(render_markdown(tables))
  return tables
