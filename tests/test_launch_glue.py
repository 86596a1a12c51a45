"""``python -m launch glue``: the GLUE table, its conventions and averages, the submission files,
bad input, resuming and the dry run.

The suite tests run the launcher with a stand-in interpreter: its "fine-tuning" writes the
metrics.json the real entry point writes, from metrics computed by the real task code
(``glue_metrics``) on labels and predictions the test draws; the test recomputes every figure
from those labels and predictions with sklearn / scipy. The submission's layout is checked on
files written by the real task code from the real test TSVs, against the GLUE server's format.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import pathlib
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from launch import glue_report
from launch.glue import Suite, predict_tests, run_glue
from launch.job import LaunchError
from launch.targets import make_target
from launch.targets.base import Target

REPO = pathlib.Path(__file__).resolve().parent.parent
SIX = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "rte": "RTE"}
SIX["wnli"] = "WNLI"
# The GLUE server's files and label vocabularies (gluebenchmark.com submission instructions;
# the same as the official baselines' and Hugging Face's run_glue.py prediction writers).
SERVER = {
  "cola": (["CoLA.tsv"], {"0", "1"}),
  "sst2": (["SST-2.tsv"], {"0", "1"}),
  "mrpc": (["MRPC.tsv"], {"0", "1"}),
  "stsb": (["STS-B.tsv"], None),  # a similarity score
  "qqp": (["QQP.tsv"], {"0", "1"}),
  "mnli": (["MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"], {"entailment", "neutral", "contradiction"}),
  "qnli": (["QNLI.tsv"], {"entailment", "not_entailment"}),
  "rte": (["RTE.tsv"], {"entailment", "not_entailment"}),
  "wnli": (["WNLI.tsv"], {"0", "1"}),
}


def _head(src: pathlib.Path, dst: pathlib.Path, n: int) -> None:
  dst.parent.mkdir(parents=True, exist_ok=True)
  with open(src, encoding="utf-8") as f:
    dst.write_text("".join(line for _, line in zip(range(n), f)), encoding="utf-8")


def _glue_dir(root: pathlib.Path, shared: pathlib.Path, tasks=tuple(SIX)) -> pathlib.Path:
  """The first rows of the real GLUE files of ``tasks``."""
  for task in tasks:
    for name in ("train.tsv", "dev.tsv", "test.tsv"):
      _head(shared / "glue" / SIX[task] / name, root / SIX[task] / name, 21)
  return root


def _mnli_qqp_qnli(root: pathlib.Path) -> None:
  """Small files in the official MNLI / QQP / QNLI layouts."""
  mnli = root / "MNLI"
  (mnli / "diagnostic").mkdir(parents=True)
  head = "index\tsentence1\tsentence2\tgold_label\n"
  rows = "".join(f"{i}\tA {i}.\tB {i}.\t{('entailment', 'neutral')[i % 2]}\n" for i in range(4))
  for name in ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"):
    (mnli / name).write_text(head + rows)
  for name in ("test_matched.tsv", "test_mismatched.tsv", "diagnostic/diagnostic.tsv"):
    (mnli / name).write_text("index\tsentence1\tsentence2\n0\tA.\tB.\n1\tC.\tD.\n")
  qqp = root / "QQP"
  qqp.mkdir()
  head = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
  rows = "".join(f"{i}\t1\t2\tWho {i}?\tWhat {i}?\t{i % 2}\n" for i in range(4))
  (qqp / "train.tsv").write_text(head + rows)
  (qqp / "dev.tsv").write_text(head + rows)
  (qqp / "test.tsv").write_text("id\tquestion1\tquestion2\n0\tWho?\tWhat?\n")
  qnli = root / "QNLI"
  qnli.mkdir()
  head = "index\tquestion\tsentence\tlabel\n"
  rows = "".join(
    f"{i}\tQ {i}?\tS {i}.\t{('entailment', 'not_entailment')[i % 2]}\n" for i in range(4)
  )
  (qnli / "train.tsv").write_text(head + rows)
  (qnli / "dev.tsv").write_text(head + rows)
  (qnli / "test.tsv").write_text("index\tquestion\tsentence\n0\tQ?\tS.\n")


def _checkpoint(tmp_path: pathlib.Path) -> pathlib.Path:
  """A directory with the Hugging Face layout (what the cheap check looks at)."""
  ckpt = tmp_path / "ckpt"
  ckpt.mkdir()
  (ckpt / "config.json").write_text("{}")
  (ckpt / "model.safetensors").write_bytes(b"")
  return ckpt


FAKE = """#!{python}
import json, os, sys, time
plan = json.load(open({plan!r}))
args = dict(a[2:].split("=", 1) for a in sys.argv[3:] if a.startswith("--") and "=" in a)
module, workdir = sys.argv[2], args["workdir"]
task, run = os.path.basename(os.path.dirname(workdir)), os.path.basename(workdir)
with open({log!r}, "a") as f:
  f.write(module + " " + task + "/" + run + "\\n")
if module == "bert_jax.evaluate":
  os.makedirs(os.path.join(workdir, "eval_test"), exist_ok=True)
  for name in plan["test_files"][task]:
    with open(os.path.join(workdir, "eval_test", name), "w") as f:
      f.write("index\\tprediction\\n0\\t" + run + "\\n")
  sys.exit(0)
time.sleep(plan.get("sleep", {{}}).get(task + "/" + run, 0))
evals = plan["eval"].get(task + "/" + run, plan["eval"].get(task))
json.dump({{"task": task, "eval": evals, "primary_split": "dev"}},
          open(os.path.join(workdir, "metrics.json"), "w"))
json.dump({{"wall_seconds": 2.0}}, open(os.path.join(workdir, "summary.json"), "w"))
"""


def _fake_python(tmp_path, plan) -> tuple[str, pathlib.Path]:
  """A stand-in interpreter: finetune writes plan's metrics, evaluate writes test files."""
  (tmp_path / "plan.json").write_text(json.dumps(plan))
  log = tmp_path / "invocations.log"
  script = tmp_path / "fake_python"
  script.write_text(
    FAKE.format(python=sys.executable, plan=str(tmp_path / "plan.json"), log=str(log))
  )
  script.chmod(0o755)
  return str(script), log


def _draw(task: str, rng) -> tuple[np.ndarray, np.ndarray]:
  n = 60
  if task == "stsb":
    labels = rng.uniform(0, 5, n)
    return labels, labels + rng.normal(0, 1.5, n)
  k = 3 if task == "mnli" else 2
  labels = rng.integers(0, k, n)
  return labels, np.where(rng.random(n) < 0.7, labels, rng.integers(0, k, n))


def _expected(task: str, labels, preds) -> dict[str, float]:
  """GLUE's figures (0-100) recomputed with sklearn / scipy."""
  if task == "cola":
    return {"mcc": 100 * matthews_corrcoef(labels, preds)}
  if task in ("mrpc", "qqp"):
    return {"f1": 100 * f1_score(labels, preds), "accuracy": 100 * accuracy_score(labels, preds)}
  if task == "stsb":
    return {
      "pearson": 100 * stats.pearsonr(labels, preds)[0],
      "spearman": 100 * stats.spearmanr(labels, preds)[0],
    }
  return {"accuracy": 100 * accuracy_score(labels, preds)}


def _metrics_json(task: str, draws) -> dict:
  """metrics.json's "eval" as the fine-tuning writes it (the real task's glue_metrics)."""
  from bert_jax.tasks.glue.data import SPECS
  from bert_jax.tasks.glue.task import glue_metrics

  if task == "mnli":
    return {
      split: glue_metrics(SPECS["mnli"], *d)
      for split, d in zip(("dev_matched", "dev_mismatched"), draws)
    }
  return {"dev": glue_metrics(SPECS[task], *draws[0])}


def _expected_task(task: str, draws) -> dict[str, float]:
  if task == "mnli":
    return {
      "accuracy_m": 100 * accuracy_score(*draws[0]),
      "accuracy_mm": 100 * accuracy_score(*draws[1]),
    }
  return _expected(task, *draws[0])


def _run(tmp_path, data_dir, plan, *args, check=True):
  python, log = _fake_python(tmp_path, plan)
  cmd = [sys.executable, "-m", "launch", "glue", f"--python={python}", *args]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
  if check:
    assert proc.returncode == 0, proc.stdout + proc.stderr
  return proc, log


def test_quick_table_against_sklearn_and_scipy(tmp_path, shared_data):
  data = _glue_dir(tmp_path / "glue", shared_data)
  _mnli_qqp_qnli(data)
  rng = np.random.default_rng(0)
  tasks = list(glue_report.ORDER)
  draws = {
    (t, s): [_draw(t, rng) for _ in range(2 if t == "mnli" else 1)] for t in tasks for s in range(3)
  }
  plan = {
    "eval": {f"{t}/seed={s}": _metrics_json(t, d) for (t, s), d in draws.items()},
    "test_files": {t: SERVER[t][0] for t in tasks},
  }
  root = tmp_path / "root"
  ckpt = _checkpoint(tmp_path)
  proc, log = _run(
    tmp_path,
    data,
    plan,
    f"--init_checkpoint={ckpt}",
    f"--data_dir={data}",
    f"--workdir={root}",
    "--seeds=3",
  )
  table = json.loads((root / "glue.json").read_text())
  by_task = {row["task"]: row for row in table["tasks"]}
  assert list(by_task) == tasks
  scores = {}
  for t in tasks:
    per_seed = [_expected_task(t, draws[(t, s)]) for s in range(3)]
    seed_scores = [np.mean(list(m.values())) for m in per_seed]
    for column in per_seed[0]:
      assert by_task[t]["metrics"][column] == pytest.approx(
        np.median([m[column] for m in per_seed])
      )
    assert by_task[t]["metrics"]["score"] == pytest.approx(np.median(seed_scores))
    assert by_task[t]["spread"]["std"] == pytest.approx(np.std(seed_scores, ddof=1))
    median_seed = int(np.argsort(seed_scores)[1])
    assert by_task[t]["chosen_run"] == f"seed={median_seed}"
    scores[t] = np.median(seed_scores)
    # The chosen (median) run's test predictions are the ones zipped.
    with zipfile.ZipFile(root / "submission.zip") as zf:
      for name in SERVER[t][0]:
        assert zf.read(name).decode().endswith(f"\tseed={median_seed}\n")
  avg = table["averages"]
  assert avg["average"] == pytest.approx(np.mean(list(scores.values())))
  assert avg["average_without_wnli"] == pytest.approx(
    np.mean([v for t, v in scores.items() if t != "wnli"])
  )
  assert "Average over the 9 task(s) run" in (root / "glue.md").read_text()
  # Only the chosen runs predicted the test sets, after the 27 fine-tuning runs.
  lines = log.read_text().splitlines()
  assert sum(line.startswith("bert_jax.finetune") for line in lines) == 27
  assert sum(line.startswith("bert_jax.evaluate") for line in lines) == 9
  assert "glue: [27/27]" in proc.stdout


def test_bert_paper_average_reproduces_table1():
  """BERT-base's GLUE test figures in Table 1 (Devlin et al. 2019) average to its 79.6."""
  table1 = {
    "mnli": {"accuracy_m": 84.6, "accuracy_mm": 83.4},
    "qqp": {"f1": 71.2, "accuracy": 89.2},
    "qnli": {"accuracy": 90.5},
    "sst2": {"accuracy": 93.5},
    "cola": {"mcc": 52.1},
    "stsb": {"pearson": 87.1, "spearman": 85.8},
    "mrpc": {"f1": 88.9, "accuracy": 84.8},
    "rte": {"accuracy": 66.4},
  }
  rows = []
  for task, m in table1.items():
    m = {**m, "score": float(np.mean(list(m.values())))}
    rows.append(glue_report.TaskRow(task, 1, 1, m, None))
  assert round(glue_report.averages(rows)["bert_paper_average"], 1) == 79.6
  rows = [r for r in rows if r.task != "rte"]
  assert glue_report.averages(rows)["bert_paper_average"] is None  # needs every column


def test_paper_protocol_picks_the_best_run_of_the_grid(tmp_path, shared_data):
  data = _glue_dir(tmp_path / "glue", shared_data, ["rte"])
  rng = np.random.default_rng(1)
  grid = [
    f"learning_rate={lr!r},train_batch_size={b},num_train_epochs={e}"
    for lr in (5e-5, 4e-5, 3e-5, 2e-5)
    for b in (16, 32)
    for e in (2, 3, 4)
  ]
  evals = {f"rte/{name}": {"dev": {"accuracy": float(rng.random())}} for name in grid}
  plan = {"eval": evals, "test_files": {"rte": ["RTE.tsv"]}}
  root = tmp_path / "root"
  _run(
    tmp_path,
    data,
    plan,
    f"--init_checkpoint={_checkpoint(tmp_path)}",
    f"--data_dir={data}",
    f"--workdir={root}",
    "--protocol=paper",
  )
  row = json.loads((root / "glue.json").read_text())["tasks"][0]
  best = max(grid, key=lambda n: evals[f"rte/{n}"]["dev"]["accuracy"])
  assert row["chosen_run"] == best and row["runs_done"] == 24
  assert row["metrics"]["accuracy"] == pytest.approx(100 * evals[f"rte/{best}"]["dev"]["accuracy"])
  assert row["chosen_overrides"]["learning_rate"] == float(best.split(",")[0].split("=")[1])


def test_submission_layout_matches_the_glue_server(tmp_path, shared_data, minilm_dir):
  """The real task code's test files: server names, header, labels, one row per test row."""
  from bert_jax.tasks import create_task
  from bert_jax.tokenize import load_tokenizer
  from configs import glue

  data = _glue_dir(tmp_path / "glue", shared_data)
  _mnli_qqp_qnli(data)
  tokenizer = load_tokenizer(minilm_dir)
  rng = np.random.default_rng(2)
  rows = []
  for task in glue_report.ORDER:
    config = glue.get_config(task)
    config.data_dir, config.max_seq_length = str(data), 32
    t = create_task(config, tokenizer)
    out = tmp_path / "runs" / task / "seed=0"
    for split in t.test_splits:
      d = t.load_split(split)
      preds = (
        rng.normal(2, 1, d.num_rows)
        if task == "stsb"
        else rng.integers(0, t.num_labels, d.num_rows)
      )
      t.write_predictions(d, preds, str(out / "predictions"))
    run = glue_report.Run(task, "seed=0", str(out), {}, {"score": 0.0})
    rows.append(glue_report.TaskRow(task, 1, 1, {"score": 0.0}, run))
  expected = {}
  for task in glue_report.ORDER:
    files = dict(
      zip(
        SERVER[task][0],
        ["test.tsv"]
        if task != "mnli"
        else ["test_matched.tsv", "test_mismatched.tsv", "diagnostic/diagnostic.tsv"],
      )
    )
    for name, file in files.items():
      with open(
        data / ("MNLI" if task == "mnli" else glue_report.DIR_NAMES[task]) / file, encoding="utf-8"
      ) as f:
        expected[name] = sum(1 for _ in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)) - 1
  archive, notes = glue_report.build_submission(rows, expected)
  with zipfile.ZipFile(io.BytesIO(archive)) as zf:
    assert sorted(zf.namelist()) == sorted(n for names, _ in SERVER.values() for n in names)
    for names, vocabulary in SERVER.values():
      for name in names:
        lines = zf.read(name).decode().splitlines()
        assert lines[0] == "index\tprediction"
        body = [line.split("\t") for line in lines[1:]]
        assert len(body) == expected[name], name
        assert all(len(r) == 2 and r[0] for r in body)
        if vocabulary is None:
          [float(r[1]) for r in body]
        else:
          assert {r[1] for r in body} <= vocabulary, name
  assert all("not a complete" not in note for note in notes.values())
  short = dict(expected, **{"RTE.tsv": expected["RTE.tsv"] + 1})
  assert "not a complete submission" in glue_report.build_submission(rows, short)[1]["RTE.tsv"]


@pytest.mark.parametrize(
  "case, message",
  [
    ("no_data", "no GLUE task data found"),
    ("unknown_task", "unknown GLUE task 'colaa'"),
    ("task_without_data", "no data for QQP"),
    ("missing_checkpoint", "no such file or directory"),
    ("not_a_checkpoint", "not a checkpoint bert_jax knows"),
    ("other_protocol", "holds another suite (glue_suite.json: protocol = 'paper'"),
    ("other_checkpoint", "holds another suite (glue_suite.json: init_checkpoint"),
    ("foreign_root", "is not empty and has no glue_suite.json"),
    ("grid_key", "--config.learning_rate is swept by the paper protocol"),
  ],
)
def test_bad_input_is_one_line_before_any_work(tmp_path, shared_data, case, message):
  data = _glue_dir(tmp_path / "glue", shared_data, ["rte"])
  root = tmp_path / "root"
  ckpt = str(_checkpoint(tmp_path))
  kw = dict(root=str(root), init_checkpoint=ckpt, data_dir=str(data))
  if case == "no_data":
    kw["data_dir"] = str(tmp_path)
  if case == "unknown_task":
    kw["tasks"] = ("rte", "colaa")
  if case == "task_without_data":
    kw["tasks"] = ("qqp",)
  if case == "missing_checkpoint":
    kw["init_checkpoint"] = str(tmp_path / "nope")
  if case == "not_a_checkpoint":
    kw["init_checkpoint"] = str(data)
  if case in ("other_protocol", "other_checkpoint"):
    root.mkdir()
    record = Suite(**kw).identity() | {"init_checkpoint": ckpt, "data_dir": str(data)}
    record |= {"protocol": "paper"} if case == "other_protocol" else {"init_checkpoint": "/x"}
    (root / "glue_suite.json").write_text(json.dumps(record))
  if case == "foreign_root":
    (root / "seed=0").mkdir(parents=True)
  if case == "grid_key":
    kw |= {"protocol": "paper", "extra_args": ("--config.learning_rate=1e-3",)}
  before = sorted(p.name for p in root.rglob("*")) if root.exists() else None
  with pytest.raises(LaunchError, match=None) as e:
    run_glue(Suite(**kw), make_target("local", {}), out=io.StringIO())
  assert message in str(e.value) and "\n" not in str(e.value)
  assert (sorted(p.name for p in root.rglob("*")) if root.exists() else None) == before


def test_a_killed_suite_reruns_only_what_is_missing(tmp_path, shared_data):
  data = _glue_dir(tmp_path / "glue", shared_data, ["rte", "wnli"])
  plan = {
    "eval": {t: {"dev": {"accuracy": 0.5}} for t in ("rte", "wnli")},
    "test_files": {"rte": ["RTE.tsv"], "wnli": ["WNLI.tsv"]},
    "sleep": {"wnli/seed=0": 120},
  }
  plan["eval"]["rte/seed=1"] = {"dev": {"accuracy": 0.75}}
  root = tmp_path / "root"
  python, log = _fake_python(tmp_path, plan)
  args = [
    sys.executable,
    "-m",
    "launch",
    "glue",
    f"--python={python}",
    f"--workdir={root}",
    f"--init_checkpoint={_checkpoint(tmp_path)}",
    f"--data_dir={data}",
    "--seeds=2",
  ]
  launcher = subprocess.Popen(
    args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  deadline = time.monotonic() + 120
  while "wnli/seed=0" not in (log.read_text() if log.exists() else ""):
    assert time.monotonic() < deadline and launcher.poll() is None
    time.sleep(0.2)
  launcher.send_signal(signal.SIGTERM)
  first = launcher.communicate(timeout=120)[0]
  assert launcher.returncode != 0
  assert "interrupted (2 run(s) stopped or not started): run the same command again" in first
  assert "failed: none" in first
  table = json.loads((root / "glue.json").read_text())  # written from the runs complete
  assert [r["task"] for r in table["tasks"]] == ["rte"]
  assert not (root / "wnli" / "seed=0" / "metrics.json").exists()
  log.write_text("")
  plan["sleep"] = {}
  proc, log = _run(tmp_path, data, plan, *args[5:])
  assert "skip rte/seed=0" in proc.stdout and "skip rte/seed=1" in proc.stdout
  assert log.read_text().splitlines() == [
    "bert_jax.finetune wnli/seed=0",
    "bert_jax.finetune wnli/seed=1",
    "bert_jax.evaluate rte/seed=0",
    "bert_jax.evaluate wnli/seed=0",
  ]
  table = json.loads((root / "glue.json").read_text())
  assert [r["task"] for r in table["tasks"]] == ["rte", "wnli"]
  assert table["tasks"][0]["metrics"]["score"] == pytest.approx(62.5)


def test_dry_run_lists_the_runs_with_an_estimate_and_writes_nothing(tmp_path, shared_data):
  data = _glue_dir(tmp_path / "glue", shared_data, ["rte", "wnli"])
  root = tmp_path / "root"
  out = io.StringIO()
  suite = Suite(
    str(root),
    str(_checkpoint(tmp_path)),
    str(data),
    seeds=2,
    extra_args=("--config.num_train_epochs=2", "--config.max_eval_examples=5"),
  )
  assert run_glue(suite, make_target("local", {}), dry_run=True, out=out) == 0
  text = out.getvalue()
  assert not root.exists()
  # 20 training rows x 2 epochs, 5 dev rows: 30 s + (40 + 5/3) / 10 examples/s = 34 s.
  for name in ("rte/seed=0", "rte/seed=1", "wnli/seed=0", "wnli/seed=1"):
    assert f"# glue: {name}: 20 train examples x 2 epochs, 5 eval rows: ~0m34s" in text
  assert "4 of 4 run(s) to run over 2 task(s), estimated ~2m17s" in text
  assert "--config.seed=0" in text and "--config.predict_test=false" in text


@pytest.mark.slow
def test_real_suite_fine_tunes_and_predicts_the_test_set(tmp_path, shared_data, minilm_dir):
  """The real entry points end to end: MiniLM on 20 WNLI rows, then its test predictions."""
  data = _glue_dir(tmp_path / "glue", shared_data, ["wnli"])
  root = tmp_path / "root"
  cmd = [sys.executable, "-m", "launch", "glue", f"--init_checkpoint={minilm_dir}"]
  cmd += [f"--data_dir={data}", f"--workdir={root}", "--seeds=1", "--"]
  cmd += [
    "--config.max_seq_length=32",
    "--config.num_train_epochs=1",
    "--config.max_eval_examples=8",
    "--config.train_batch_size=8",
  ]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "glue: [1/1] wnli/seed=0: score" in proc.stdout
  row = json.loads((root / "glue.json").read_text())["tasks"][0]
  dev = json.loads((root / "wnli" / "seed=0" / "metrics.json").read_text())["eval"]["dev"]
  assert row["metrics"]["accuracy"] == pytest.approx(100 * dev["accuracy"])
  with zipfile.ZipFile(root / "submission.zip") as zf:
    lines = zf.read("WNLI.tsv").decode().splitlines()
  assert lines[0] == "index\tprediction" and len(lines) == 1 + 20  # every test row, not 8
  assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}


def test_remote_test_predictions_are_submitted_once(tmp_path):
  """On a remote target the chosen run's evaluate job is submitted once, not at every rerun;
  a task with runs missing predicts nothing yet (its median run may change)."""

  @dataclasses.dataclass
  class Remote(Target):
    """Submits (records) the job and returns: its results are not here yet."""

    submitted: tuple = ()

    name = "slurm"
    processes = 1

    def validate(self, job):
      pass

    def describe(self, job):
      return job.shell_command()

    def run(self, job, out=None, stop=None):
      self.submitted += (job.workdir,)
      return 0

  data = tmp_path / "glue"
  for task in ("RTE", "WNLI"):
    (data / task).mkdir(parents=True)
    (data / task / "test.tsv").write_text("index\tsentence1\tsentence2\n0\ta\tb\n")
  rows = []
  for task, done in (("rte", 2), ("wnli", 1)):
    run = glue_report.Run(task, "seed=0", str(tmp_path / task / "seed=0"), {}, {"score": 1.0})
    rows.append(glue_report.TaskRow(task, done, 2, {"score": 1.0}, run))
  suite = Suite(str(tmp_path), "ckpt", str(data))
  target, out = Remote(), io.StringIO()
  assert predict_tests(suite, rows, target, out) == []
  assert target.submitted == (str(tmp_path / "rte" / "seed=0"),)
  record = json.loads((tmp_path / "rte" / "seed=0" / "launch.json").read_text())
  assert record["argv"][-2:] == ["--split=test", "--set=max_eval_examples=0"]
  assert predict_tests(suite, rows, target, out) == []  # run again before the job finished
  assert len(target.submitted) == 1 and "submitted; waiting" in out.getvalue()
