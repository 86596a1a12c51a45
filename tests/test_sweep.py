"""Sweeps: expansion, run names, validation against the config, and the results tables.

Expansions are checked against itertools, aggregates against numpy / the csv module. The end
to end test (4 short fine-tuning runs, then a second invocation that skips them) is in
tests/test_sweep_finetune.py.
"""

import csv
import io
import itertools
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from launch import sweep
from launch.job import Job, LaunchError
from launch.results import build_tables, collect, write_results
from launch.targets import KubernetesTarget, LocalTarget, TpuTarget

REPO = pathlib.Path(__file__).resolve().parent.parent
GLUE = "configs/glue.py:rte"


def test_product_zip_chain_against_itertools():
  lrs, batches, seeds = [5e-5, 4e-5, 3e-5, 2e-5], [16, 32], [0, 1, 2]
  points = sweep.product(
    sweep.axis("learning_rate", lrs),
    sweep.axis("train_batch_size", batches),
    sweep.axis("seed", seeds),
  )
  want = [
    {"learning_rate": a, "train_batch_size": b, "seed": c}
    for a, b, c in itertools.product(lrs, batches, seeds)
  ]
  assert points == want
  zipped = sweep.zipped(
    sweep.axis("learning_rate", lrs), sweep.axis("num_train_epochs", [2, 3, 4, 5])
  )
  assert zipped == [{"learning_rate": a, "num_train_epochs": e} for a, e in zip(lrs, [2, 3, 4, 5])]
  both = sweep.chain(sweep.fixed(learning_rate=1e-4), zipped)
  assert len(both) == 5 and both[0] == {"learning_rate": 1e-4}
  with pytest.raises(LaunchError, match="equal length"):
    sweep.zipped(sweep.axis("a", [1, 2]), sweep.axis("b", [1]))
  with pytest.raises(LaunchError, match="twice"):
    sweep.product(sweep.axis("a", [1]), sweep.axis("a", [2]))


def test_paper_grid_sweep_file():
  points = sweep.load_sweep(str(REPO / "sweeps" / "glue_paper_grid.py") + ":3")
  assert len(points) == 4 * 2 * 3 * 3
  assert {p["learning_rate"] for p in points} == {5e-5, 4e-5, 3e-5, 2e-5}
  assert {p["train_batch_size"] for p in points} == {16, 32}
  assert {p["num_train_epochs"] for p in points} == {2, 3, 4}
  assert {p["seed"] for p in points} == {0, 1, 2}
  runs = sweep.plan_sweep(Job("finetune", GLUE, "/unused"), points, "/tmp/grid")
  assert len({r.job.workdir for r in runs}) == len(points)  # every run its own workdir
  assert runs[0].name == "learning_rate=5e-05,train_batch_size=16,num_train_epochs=2,seed=0"
  assert runs[0].job.argv()[-4:] == [
    "--config.learning_rate=5e-05",
    "--config.train_batch_size=16",
    "--config.num_train_epochs=2",
    "--config.seed=0",
  ]


def test_unknown_sweep_key_is_an_error_before_anything_starts(tmp_path):
  bad = tmp_path / "bad_sweep.py"
  bad.write_text(
    "from launch import sweep\n"
    "def get_sweep(arg):\n"
    "  return sweep.product(sweep.axis('learning_rate', [1e-5, 2e-5]),\n"
    "                       sweep.axis('optimizer.warmup_stepz', [1, 2]))\n"
  )
  root = tmp_path / "root"
  with pytest.raises(LaunchError, match=r"bad_sweep.py.*'optimizer.warmup_stepz' does not exist"):
    sweep.plan_sweep(Job("finetune", GLUE, ""), sweep.load_sweep(str(bad)), str(root), str(bad))
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "launch",
      "sweep",
      "--job=finetune",
      f"--config={GLUE}",
      f"--workdir={root}",
      f"--sweep={bad}",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
  )
  assert proc.returncode == 2 and "warmup_stepz" in proc.stderr, proc.stderr
  assert "Traceback" not in proc.stderr
  assert not root.exists()  # nothing started, nothing written


def test_wrong_value_type_is_an_error():
  with pytest.raises(LaunchError, match="train_batch_size"):
    sweep.plan_sweep(Job("finetune", GLUE, ""), [{"train_batch_size": "large"}], "/tmp/x")


def write_run(root, name, overrides, metrics):
  d = root / name
  d.mkdir(parents=True)
  (d / "metrics.json").write_text(json.dumps(metrics))
  (d / "launch.json").write_text(json.dumps({"overrides": overrides}))


def test_results_table_sorted_with_seeds_aggregated(tmp_path):
  rng = np.random.RandomState(0)
  truth = {}
  for lr in (5e-5, 2e-5):
    for seed in range(3):
      acc = float(rng.uniform(0.5, 0.8))
      truth[(lr, seed)] = acc
      overrides = {"learning_rate": lr, "seed": seed}
      write_run(
        tmp_path,
        sweep.run_name(overrides),
        overrides,
        {
          "task": "rte",
          "primary_metric": "accuracy",
          "higher_is_better": True,
          "dev": {"accuracy": acc, "loss": 1 - acc},
        },
      )
  (tmp_path / "unfinished").mkdir()  # no metrics.json: not a result
  tables = write_results(str(tmp_path))
  assert tables.metric == "dev.accuracy"
  best = max(truth, key=truth.get)
  assert tables.best_run["run"] == sweep.run_name({"learning_rate": best[0], "seed": best[1]})
  rows = list(csv.DictReader(open(tmp_path / "results.csv")))
  assert len(rows) == 6
  assert [float(r["dev.accuracy"]) for r in rows] == sorted(truth.values(), reverse=True)
  by_config = list(csv.DictReader(open(tmp_path / "results_by_config.csv")))
  assert len(by_config) == 2
  for row in by_config:
    values = [truth[(float(row["learning_rate"]), s)] for s in range(3)]
    assert float(row["dev.accuracy mean"]) == pytest.approx(np.mean(values))
    assert float(row["dev.accuracy std"]) == pytest.approx(np.std(values, ddof=1))
    assert row["seeds"] == "3"
  means = [float(r["dev.accuracy mean"]) for r in by_config]
  assert means == sorted(means, reverse=True)
  md = (tmp_path / "results.md").read_text()
  assert f"Best run: **{tables.best_run['run']}**" in md
  # A metric where lower is better sorts the other way.
  loss = build_tables(collect(str(tmp_path)), "loss")
  assert loss.metric == "dev.loss" and not loss.higher_is_better
  assert loss.best_run["run"] == tables.best_run["run"]


def test_one_seed_has_no_spread_in_any_results_format(tmp_path):
  """A configuration run with one seed has a mean and no standard deviation: no "±" with
  nothing after it in results.md or on the command line, an empty CSV cell."""
  results = {(1e-4, 0): 0.5234, (1e-3, 0): 0.4, (1e-3, 1): 0.6}
  for (lr, seed), acc in results.items():
    overrides = {"learning_rate": lr, "seed": seed}
    metrics = {"primary_metric": "accuracy", "higher_is_better": True, "dev": {"accuracy": acc}}
    write_run(tmp_path, sweep.run_name(overrides), overrides, metrics)
  std = float(np.std([0.4, 0.6], ddof=1))
  write_results(str(tmp_path))
  md = (tmp_path / "results.md").read_text()
  assert "Best configuration over seeds: learning_rate=0.0001: 0.5234 (1 seed).\n" in md
  table = [line for line in md.splitlines() if line.startswith("| 0.")]
  assert table == ["| 0.0001 | 0.5234 | – | 1 |", f"| 0.001 | 0.5000 | {std:.4f} | 2 |"]
  by_config = list(csv.DictReader(open(tmp_path / "results_by_config.csv")))
  assert [(r["dev.accuracy std"], r["seeds"]) for r in by_config] == [("", "1"), (str(std), "2")]
  proc = subprocess.run(
    [sys.executable, "-m", "launch", "results", f"--workdir={tmp_path}"],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines()[-1] == (
    "best configuration: learning_rate=0.0001 (dev.accuracy = 0.5234 (1 seed))"
  )
  # The worse configuration first: its two seeds have a spread.
  write_results(str(tmp_path), higher_is_better=False)
  md = (tmp_path / "results.md").read_text()
  assert f"learning_rate=0.001: 0.5000 ± {std:.4f} (2 seeds).\n" in md


def test_complete_runs_are_skipped(tmp_path):
  runs = sweep.plan_sweep(Job("finetune", GLUE, ""), sweep.axis("seed", [0, 1]), str(tmp_path))
  write_run(tmp_path, runs[0].name, {"seed": 0}, {"dev": {"accuracy": 0.5}})
  out = io.StringIO()
  sweep.run_sweep(runs, LocalTarget(), dry_run=True, out=out)
  text = out.getvalue()
  assert f"skip {runs[0].name}" in text and "1 of 2 run(s)" in text
  assert f"--workdir={tmp_path / runs[1].name}" in text
  assert not os.path.exists(tmp_path / runs[1].name)


def test_remote_sweep_gives_each_run_its_own_job():
  root = "/mnt/workdir/grid"  # on a PersistentVolumeClaim mounted in every pod
  runs = sweep.plan_sweep(
    Job("finetune", GLUE, ""),
    sweep.load_sweep(str(REPO / "sweeps" / "glue_paper_grid.py") + ":1"),
    root,
  )
  out = io.StringIO()
  sweep.run_sweep(runs, KubernetesTarget(image="img", volume_claim="runs"), dry_run=True, out=out)
  docs = [d for d in yaml.safe_load_all(out.getvalue()) if d and d.get("kind") == "Job"]
  assert len(docs) == len(runs) == 24
  names = {d["metadata"]["name"] for d in docs}
  assert len(names) == 24  # distinct names for distinct runs
  assert all(re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", n) and len(n) <= 63 for n in names)
  workdirs = {
    a
    for d in docs
    for a in d["spec"]["template"]["spec"]["containers"][0]["command"]
    if a.startswith("--workdir=")
  }
  assert workdirs == {f"--workdir={root}/{r.name}" for r in runs}


def test_tpu_sweep_ships_the_code_once(monkeypatch):
  monkeypatch.setattr(sweep, "exists", lambda path: False)  # no bucket to look into here
  runs = sweep.plan_sweep(
    Job("finetune", GLUE, ""), sweep.axis("seed", [0, 1, 2]), "gs://bucket/grid"
  )
  out = io.StringIO()
  target = TpuTarget(tpu_name="pod", zone="us-central2-b", project="proj-1")
  sweep.run_sweep(runs, target, dry_run=True, out=out)
  lines = [line for line in out.getvalue().splitlines() if line.startswith("gcloud")]
  assert sum(" tpu-vm scp " in line for line in lines) == 1
  runs_started = [line for line in lines if "bert_jax.finetune" in line]
  assert [
    f"--workdir=gs://bucket/grid/seed={i}" in line for i, line in enumerate(runs_started)
  ] == [True] * 3


def test_stopping_a_sweep_stops_its_runs_and_starts_no_more(tmp_path):
  python = tmp_path / "fake_python"
  python.write_text(f"""#!{sys.executable}
import os, signal, sys, time
workdir = [a for a in sys.argv if a.startswith("--workdir=")][0].split("=", 1)[1]
def on_term(signum, frame):
  open(os.path.join(workdir, "stopped"), "w").close()
  sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(workdir, "started"), "w").close()
time.sleep(120)
""")
  python.chmod(0o755)
  root = tmp_path / "root"
  seeds = tmp_path / "seeds.py"
  seeds.write_text(
    "from launch import sweep\ndef get_sweep(arg):\n  return sweep.axis('seed', range(4))\n"
  )
  launcher = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "launch",
      "sweep",
      "--job=finetune",
      f"--config={GLUE}",
      f"--workdir={root}",
      f"--sweep={seeds}",
      "--parallel=2",
      f"--python={python}",
      "--kill_grace_s=20",
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  started = lambda: sorted(p.parent.name for p in root.glob("*/started"))
  deadline = time.monotonic() + 120
  while len(started()) < 2:
    assert time.monotonic() < deadline and launcher.poll() is None, launcher.stdout.read()
    time.sleep(0.2)
  launcher.terminate()
  output = launcher.communicate(timeout=60)[0]
  assert launcher.returncode == 1, output
  assert started() == ["seed=0", "seed=1"]
  assert sorted(p.parent.name for p in root.glob("*/stopped")) == ["seed=0", "seed=1"]
  assert not (root / "seed=2").exists() and not (root / "seed=3").exists()
