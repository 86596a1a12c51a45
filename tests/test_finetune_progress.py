"""Fine-tuning's evaluation and prediction passes: progress lines while they run, and a split
never padded to an ``eval_batch_size`` beyond its rows."""

from __future__ import annotations

import re
import time
import types

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import parallel
from bert_jax.runs.finetuning import inputs as finetune_input
from bert_jax.runs.finetuning.inputs import Predictor
from bert_jax.tasks.base import SplitData


def _predictor(batch_size, before_step=None):
  """A Predictor over all devices (the tests' 8 CPU devices, or 1) whose "model" sums each row's
  ids; ``before_step(batch)`` runs before each step."""
  from configs.common import logical_axis_rules

  mesh = parallel.create_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  rules = parallel.normalize_rules(logical_axis_rules())
  task = types.SimpleNamespace(
    prediction_axes={},
    apply=lambda model, params, batch, deterministic: batch["input_ids"],
    predict=lambda ids: {"sum": jnp.sum(ids, axis=-1)},
  )
  predictor = Predictor(task, None, mesh, rules, batch_size)
  if before_step is not None:
    step = predictor._step

    def watched(params, batch):
      before_step(batch)
      return step(params, batch)

    predictor._step = watched
  return predictor


def _split(n, name="dev"):
  ids = np.arange(n * 4, dtype=np.int32).reshape(n, 4)
  return SplitData(name, {"input_ids": ids, "input_mask": np.ones_like(ids)})


@pytest.fixture
def info_lines(caplog):
  caplog.set_level("INFO")
  return lambda: [r.getMessage() for r in caplog.records]


def test_a_slow_pass_logs_progress_with_an_eta(info_lines):
  """A pass longer than the interval logs 'k/N batches (p%), rate, elapsed, eta' lines as it
  goes and a closing line; the outputs are every row's, in the split's order."""
  shapes = []

  def slow(batch):
    shapes.append(batch["input_ids"].shape)
    time.sleep(0.05)

  predictor = _predictor(8, slow)
  predictor.progress_interval_sec = 0.08
  data = _split(60)
  out = predictor(None, data, "evaluating dev at step 7")
  np.testing.assert_array_equal(out["sum"], data.arrays["input_ids"].sum(-1))
  assert shapes == [(8, 4)] * 8  # 60 rows: 8 batches of eval_batch_size 8, the last padded
  lines = [m for m in info_lines() if m.startswith("evaluating dev at step 7: ")]
  assert len(lines) >= 3, info_lines()
  pattern = r"evaluating dev at step 7: (\d)/8 batches \(\d+%\), [\d.]+ batches/s, elapsed 0m\d\ds"
  for line in lines[:-1]:
    match = re.fullmatch(pattern + r", eta 0m\d\ds", line)
    assert match and int(match.group(1)) < 8, line
  assert re.fullmatch(pattern + r" \(done\)", lines[-1]) and "8/8" in lines[-1]


def test_default_label_names_the_split(info_lines):
  predictor = _predictor(8)
  predictor.progress_interval_sec = 0.0
  predictor(None, _split(16, "test"))
  assert any(m.startswith("predicting test: 1/2 batches (50%)") for m in info_lines())


def test_a_quick_pass_is_quiet(info_lines):
  predictor = _predictor(8)
  predictor(None, _split(16))
  assert not any("batches" in m for m in info_lines())


def test_a_split_smaller_than_the_batch_is_not_padded_to_it(info_lines):
  """eval_batch_size 200,000 on 16 rows: the step sees one batch of the 16 rows (padding it
  to 200,000 rows is what ran out of memory), with one log line however often it runs."""
  shapes = []

  predictor = _predictor(200_000, lambda batch: shapes.append(batch["input_ids"].shape[0]))
  data = _split(16)
  for _ in range(3):
    out = predictor(None, data)
    np.testing.assert_array_equal(out["sum"], data.arrays["input_ids"].sum(-1))
  assert shapes == [16] * 3
  said = [m for m in info_lines() if "eval_batch_size=200000" in m]
  assert said == ["dev: 16 rows, fewer than eval_batch_size=200000: one batch of 16"]


def test_finetuning_cuts_the_eval_batch_before_training(info_lines):
  """The run's eval batch is cut to the largest dev split (said once, before any training),
  so the train job's eval batch spec and every evaluation use it."""
  from bert_jax.runs.finetuning import runner

  mesh = types.SimpleNamespace(shape={"data": 8, "fsdp": 1, "tensor": 1})
  config = types.SimpleNamespace(eval_batch_size=200_000)
  splits = [_split(16, "dev_matched"), _split(21, "dev_mismatched")]
  assert runner._eval_batch_size(config, splits, mesh) == 24
  assert info_lines() == [
    "config.eval_batch_size=200000 is more than the 21 rows of dev_mismatched: evaluating in "
    "batches of 24"
  ]
  config.eval_batch_size = 16
  assert runner._eval_batch_size(config, splits, mesh) == 16


def test_split_batch_size_rounds_up_to_the_data_parallel_size():
  mesh = types.SimpleNamespace(shape={"data": 4, "fsdp": 2, "tensor": 1})
  assert finetune_input.split_batch_size(200_000, 16, mesh) == 16
  assert finetune_input.split_batch_size(200_000, 17, mesh) == 24
  assert finetune_input.split_batch_size(200_000, 0, mesh) == 8
  assert finetune_input.split_batch_size(32, 3000, mesh) == 32  # a larger split: unchanged


def test_finetune_logs_evaluation_and_prediction(
  tmp_path, shared_data, minilm_dir, monkeypatch, info_lines
):
  """A fine-tuning run on an RTE slice: the clamp is said before training, the dev evaluation
  and the test prediction log progress lines (interval 0: every batch), metrics as usual."""
  from bert_jax.runs.finetuning import runner
  from configs import glue

  monkeypatch.setattr(finetune_input, "INTERVAL_SEC", 0.0)
  c = glue.get_config("rte")
  c.data_dir = str(shared_data / "glue")
  c.vocab_file = str(minilm_dir / "vocab.txt")
  c.model_preset = "tiny"
  c.max_seq_length = 32
  c.train_batch_size = 16
  c.eval_batch_size = 4096
  c.max_train_examples = 32
  c.max_eval_examples = 16
  c.num_train_epochs = 1
  result = runner.finetune(c, str(tmp_path / "w"))
  assert result["status"] == "completed" and 0 <= result["dev"]["accuracy"] <= 1
  said = "\n".join(info_lines())
  clamp = "config.eval_batch_size=4096 is more than the 16 rows of dev: evaluating in batches of 16"
  assert said.count(clamp) == 1, said
  assert said.index(clamp) < said.index("Fine-tuning rte")  # said before training
  assert re.search(r"^evaluating dev at step 2: 1/1 batches \(100%\)", said, re.M), said
  assert re.search(r"^predicting test: 1/1 batches \(100%\)", said, re.M), said
