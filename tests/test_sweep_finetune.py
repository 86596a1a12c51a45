"""End to end: a local sweep of 4 short fine-tuning runs (RTE slice, tiny model), the results
table, and a second invocation that skips the finished runs."""

import csv
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers
from float_tolerance import assert_model_close

from bert_jax.checkpoint import load_params
from bert_jax.formats import export
from bert_jax.model import BertForSequenceClassification
from bert_jax.train.best_checkpoint import checkpoint_dir

REPO = pathlib.Path(__file__).resolve().parent.parent


def sweep_command(root, shared_data, vocab):
  return [
    sys.executable,
    "-m",
    "launch",
    "sweep",
    "--job=finetune",
    "--config=configs/glue.py:rte",
    f"--workdir={root}",
    "--sweep=sweeps/glue_smoke.py",
    "--parallel=2",
    "--",
    f"--config.data_dir={shared_data / 'glue'}",
    f"--config.vocab_file={vocab}",
    "--config.max_train_examples=32",
    "--config.max_eval_examples=32",
    "--config.max_seq_length=32",
    "--config.num_train_epochs=1",
    "--config.train_batch_size=16",
    "--config.eval_batch_size=32",
    "--config.predict_test=false",
  ]


def test_local_sweep_of_four_finetuning_runs(tmp_path, shared_data, minilm_dir):
  root = tmp_path / "rte_sweep"
  cmd = sweep_command(root, shared_data, minilm_dir / "vocab.txt")
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  names = sorted(f"learning_rate={lr},seed={s}" for lr in ("0.001", "0.0001") for s in (0, 1))
  assert sorted(p.name for p in root.iterdir() if p.is_dir()) == names
  metrics = {n: json.loads((root / n / "metrics.json").read_text()) for n in names}
  for name, m in metrics.items():
    assert m["task"] == "rte" and m["primary_metric"] == "accuracy", name
    record = json.loads((root / name / "launch.json").read_text())
    assert record["config"]["max_train_examples"] == 32  # resolved config, pass-through applied
    assert record["config"]["seed"] == int(name[-1]) and record["git"]["commit"] is not None

  rows = list(csv.DictReader(open(root / "results.csv")))
  assert sorted(r["run"] for r in rows) == names
  accs = [float(r["dev.accuracy"]) for r in rows]
  assert accs == sorted(accs, reverse=True)
  assert {r["run"]: float(r["dev.accuracy"]) for r in rows} == pytest.approx(
    {n: m["dev"]["accuracy"] for n, m in metrics.items()}
  )
  configs = list(csv.DictReader(open(root / "results_by_config.csv")))
  assert sorted(r["learning_rate"] for r in configs) == ["0.0001", "0.001"]
  assert {r["seeds"] for r in configs} == {"2"}
  assert f"Best run: **{rows[0]['run']}**" in (root / "results.md").read_text()

  # Again: every run is complete, so nothing runs and nothing is rewritten.
  mtimes = {n: os.path.getmtime(root / n / "metrics.json") for n in names}
  again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count("skip ") == 4 and "0 of 4 run(s)" in again.stdout
  assert "start" not in again.stdout
  assert mtimes == {n: os.path.getmtime(root / n / "metrics.json") for n in names}

  # A run of the sweep is a real fine-tuned checkpoint: export its best checkpoint to
  # transformers and compare the classifier's logits with bert_jax's on the same weights.
  run = root / rows[0]["run"]
  out = export(checkpoint_dir(str(run), "best"), "hf", str(tmp_path / "hf"))
  model = transformers.BertForSequenceClassification.from_pretrained(out).eval()
  head = json.loads((run / "head.json").read_text())
  assert [model.config.id2label[i] for i in range(2)] == head["labels"]
  params, config, tokenizer = load_params(str(run / "best"))
  ids = np.array(
    [[tokenizer.cls_id] + tokenizer.encode("the cat sat on the mat .") + [tokenizer.sep_id]],
    np.int32,
  )
  ours = BertForSequenceClassification(config, 2).apply({"params": params}, ids)["logits"]
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids).long()).logits.numpy()
  assert_model_close(theirs, ours, config, ids.shape[1])  # PyTorch's float32 (float_tolerance)
