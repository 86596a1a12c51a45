"""Fine-tuning end to end on slices: entry points, MiniLM on SST-2, init, resume, bad config."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.runs.finetuning import runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
  proc = subprocess.run(
    [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def _tiny(config, minilm_dir, **kw):
  """A from-scratch tiny encoder with MiniLM's vocabulary, on a small slice."""
  config.vocab_file = str(minilm_dir / "vocab.txt")
  config.model_preset = "tiny"
  config.max_seq_length = 32
  config.train_batch_size = 16
  config.eval_batch_size = 16
  config.logging.log_every_steps = 1
  for k, v in kw.items():
    setattr(config, k, v)
  return config


@pytest.fixture(scope="module")
def rte_workdir(tmp_path_factory, shared_data, minilm_dir):
  """`python -m bert_jax.finetune` on an RTE slice (tiny model, 4 steps)."""
  workdir = tmp_path_factory.mktemp("rte")
  _run(
    "bert_jax.finetune",
    "--config",
    "configs/glue.py:rte",
    "--workdir",
    str(workdir),
    f"--config.data_dir={shared_data / 'glue'}",
    f"--config.vocab_file={minilm_dir}/vocab.txt",
    "--config.max_train_examples=64",
    "--config.max_eval_examples=32",
    "--config.max_seq_length=32",
    "--config.train_batch_size=16",
    "--config.eval_batch_size=16",
    "--config.num_train_epochs=1",
  )
  return workdir


def test_entry_points_write_the_workdir(rte_workdir):
  names = set(os.listdir(rte_workdir))
  assert {
    "config.json",
    "model_config.json",
    "vocab.txt",
    "tokenizer_config.json",
    "head.json",
    "checkpoints",
    "best",
    "metrics.json",
    "summary.json",
    "predictions",
  } <= names
  metrics = json.load(open(rte_workdir / "metrics.json"))
  assert metrics["task"] == "rte" and metrics["primary_metric"] == "accuracy"
  assert 0 <= metrics["dev"]["accuracy"] <= 1 and metrics["num_train_steps"] == 4
  assert metrics["data"]["train"]["examples"] == 64
  assert metrics["hparams"]["learning_rate"] == 2e-5
  head = json.load(open(rte_workdir / "head.json"))
  assert head["task"] == "sequence_classification" and head["labels"] == [
    "entailment",
    "not_entailment",
  ]
  test_tsv = (rte_workdir / "predictions/RTE.tsv").read_text().splitlines()
  assert test_tsv[0] == "index\tprediction" and len(test_tsv) == 33
  # evaluate.py on the result: same params (best/), same dev metrics; test submission file.
  _run("bert_jax.evaluate", "--workdir", str(rte_workdir), "--split", "dev")
  ev = json.load(open(rte_workdir / "eval_dev/metrics.json"))
  assert ev["eval"]["dev"]["accuracy"] == pytest.approx(metrics["dev"]["accuracy"])
  _run("bert_jax.evaluate", "--workdir", str(rte_workdir), "--split", "test")
  assert (rte_workdir / "eval_test/RTE.tsv").read_text().splitlines() == test_tsv
  # An eval batch far beyond the split's 32 rows: one batch of the 32 rows, said once; same ids.
  out = rte_workdir / "eval_test_big"
  proc = _run(
    "bert_jax.evaluate",
    f"--workdir={rte_workdir}",
    "--split=test",
    f"--output_dir={out}",
    "--set=eval_batch_size=200000",
  )
  assert proc.stderr.count("test: 32 rows, fewer than eval_batch_size=200000: one batch of 32") == 1
  assert (out / "RTE.tsv").read_text().splitlines() == test_tsv


def test_minilm_sst2_learns(tmp_path, shared_data, minilm_dir):
  from configs import glue

  c = glue.get_config("sst2")
  c.data_dir = str(shared_data / "glue")
  c.init_checkpoint = str(minilm_dir)
  c.max_train_examples, c.max_eval_examples, c.max_seq_length = 384, 128, 32
  c.train_batch_size, c.eval_batch_size, c.learning_rate = 16, 32, 3e-4
  c.num_train_epochs, c.predict_test = 1.0, False
  c.logging.log_every_steps = 1
  # fsdp over the suite's 8 fake devices: each updates an eighth of the parameters (data
  # parallel, all 8 would update all of them on this host's 2 cores); the same losses to 4 digits
  c.mesh.data, c.mesh.fsdp = 1, 8
  result = runner.finetune(c, str(tmp_path))
  assert "newly initialised: ['classifier/bias', 'classifier/kernel']" in result["init"]
  assert "not loaded (in the checkpoint, unused): none" in result["init"]
  # A fresh 2-way head starts at a loss of ln 2 (logits ~ 0); the dev loss ends well below,
  # and so does the training loss.
  assert result["dev"]["loss"] < np.log(2) - 0.05, result["dev"]
  losses = [l for _, l in json.load(open(tmp_path / "summary.json"))["train_loss_history"]]
  assert len(losses) == 24 and np.mean(losses[-6:]) < np.mean(losses[:6]) - 0.05, losses
  preds = (tmp_path / "predictions/dev_predictions.tsv").read_text().splitlines()[1:]
  assert len(preds) == 128
  gold = np.array(_sst2_dev_labels(shared_data, 128))
  majority = max(gold.mean(), 1 - gold.mean())
  assert result["dev"]["accuracy"] > majority + 0.1, (result["dev"], majority)


def _sst2_dev_labels(shared_data, n):
  lines = (shared_data / "glue/SST-2/dev.tsv").read_text().splitlines()[1 : n + 1]
  return [int(l.split("\t")[-1]) for l in lines]


def test_ner_from_our_workdir_reports_unloaded_head(tmp_path, rte_workdir, shared_data, minilm_dir):
  from configs import ner

  c = _tiny(
    ner.get_config(), minilm_dir, num_train_steps=4, max_train_examples=64, max_eval_examples=32
  )
  c.train_file = str(shared_data / "conll2003/train.txt")
  c.dev_file = str(shared_data / "conll2003/dev.txt")
  c.test_file = str(shared_data / "conll2003/dev.txt")
  c.init_checkpoint = str(rte_workdir)  # a bert_jax fine-tuning workdir: encoder only
  result = runner.finetune(c, str(tmp_path))
  assert (
    "not loaded (in the checkpoint, unused): ['classifier/bias', 'classifier/kernel']"
    in result["init"]
  )
  assert set(result["dev"]) >= {"precision", "recall", "f1", "accuracy", "per_type"}
  lines = (tmp_path / "predictions/test_predictions.txt").read_text().split("\n\n")
  assert len([l for l in lines if l.strip()]) == 32
  assert len(lines[0].splitlines()[0].split()) == 3  # word gold predicted


def test_swag_end_to_end(tmp_path, shared_data, minilm_dir):
  from configs import swag

  c = _tiny(swag.get_config(), minilm_dir, num_train_steps=3, train_batch_size=8, eval_batch_size=8)
  c.train_file = str(shared_data / "swag/sample.csv")
  c.dev_file = str(shared_data / "swag/sample.jsonl")
  result = runner.finetune(c, str(tmp_path))
  assert 0 <= result["dev"]["accuracy"] <= 1
  rows = (tmp_path / "predictions/dev_predictions.csv").read_text().splitlines()
  assert rows[0] == "index,prediction,score0,score1,score2,score3" and len(rows) == 11


def test_feature_based_trains_only_the_bilstm(tmp_path, rte_workdir, shared_data, minilm_dir):
  from bert_jax.checkpoint import load_params
  from configs import ner_feature_based

  c = _tiny(
    ner_feature_based.get_config("sum_all"),
    minilm_dir,
    num_train_steps=3,
    max_train_examples=48,
    max_eval_examples=16,
    lstm_hidden_size=16,
  )
  c.train_file = str(shared_data / "ner_sci/bert_paper.bio")
  c.dev_fraction, c.skip_malformed_lines = 0.1, True
  c.init_checkpoint = str(rte_workdir)
  result = runner.finetune(c, str(tmp_path))
  assert "f1" in result["dev"] and result["data"]["train"]["skipped_lines"] == 1
  trained, _, _ = load_params(str(tmp_path))
  initial, _, _ = load_params(str(rte_workdir / "best"))
  import jax

  for a, b in zip(
    jax.tree_util.tree_leaves(trained["bert"]), jax.tree_util.tree_leaves(initial["bert"])
  ):
    np.testing.assert_array_equal(a, b)  # frozen: not even weight decay
  assert set(trained["tagger"]) == {
    "lstm_0_forward",
    "lstm_0_backward",
    "lstm_1_forward",
    "lstm_1_backward",
    "classifier",
  }
  assert trained["tagger"]["lstm_0_forward"]["ii"]["kernel"].shape == (128, 16)  # tiny: D=128
  assert trained["tagger"]["classifier"]["kernel"].shape == (
    16 * 2,
    len(json.load(open(tmp_path / "head.json"))["labels"]),
  )


def test_resume_reproduces_the_uninterrupted_run(tmp_path, shared_data, minilm_dir):
  """With length bucketing on and batches of several lengths (CoLA at 64, buckets of 16)."""
  from configs import glue

  def config():
    c = _tiny(
      glue.get_config("cola"),
      minilm_dir,
      num_train_steps=6,
      max_train_examples=48,
      max_eval_examples=16,
      save_checkpoints_steps=3,
      eval_every_steps=3,
      predict_test=False,
      max_seq_length=64,
      length_buckets="16",
    )
    c.data_dir = str(shared_data / "glue")
    c.checkpoint.keep_checkpoint_max = 3
    return c

  runner.finetune(config(), str(tmp_path))
  loss_a = json.load(open(tmp_path / "summary.json"))["train_loss_history"]
  dev_a = json.load(open(tmp_path / "metrics.json"))["dev"]
  shutil.rmtree(tmp_path / "checkpoints/6")  # as if killed between step 3 and step 6
  resumed = runner.finetune(config(), str(tmp_path))
  assert resumed["init"].startswith("resumed") and "step 3" in resumed["init"]
  loss_b = json.load(open(tmp_path / "summary.json"))["train_loss_history"]
  # The whole curve survives the resume: steps 1-3 as the first run logged them, 4-6 retrained.
  assert [s for s, _ in loss_a] == [1, 2, 3, 4, 5, 6] and [s for s, _ in loss_b] == [
    1,
    2,
    3,
    4,
    5,
    6,
  ]
  assert loss_b[:3] == loss_a[:3]
  np.testing.assert_allclose([l for _, l in loss_b[3:]], [l for _, l in loss_a[3:]], rtol=1e-6)
  assert resumed["dev"] == dev_a
  assert [h["step"] for h in resumed["history"]] == [3, 6]
  # The steps after the resume point were cut to more than one length.
  from bert_jax.runs.finetuning.inputs import FinetuneInput, make_bucketer
  from bert_jax.tasks import create_task
  from bert_jax.tokenize import load_tokenizer

  c = config()
  task = create_task(c, load_tokenizer(str(tmp_path)))
  inputs = FinetuneInput(task.load_split("train"), 3, 16, int(c.seed), make_bucketer(task, c))
  inputs.set_state({"step": 3})
  assert len({next(inputs)["input_mask"].shape[1] for _ in range(3)}) > 1


def test_bad_config_errors(tmp_path, shared_data, minilm_dir):
  from configs import glue

  c = _tiny(glue.get_config("rte"), minilm_dir, train_batch_size=12, max_train_examples=32)
  c.data_dir = str(shared_data / "glue")
  with pytest.raises(ValueError, match="train_batch_size=12 is not divisible"):
    runner.finetune(c, str(tmp_path / "a"))
  c = _tiny(glue.get_config("rte"), minilm_dir, max_train_examples=32, grad_accum_steps=3)
  c.data_dir = str(shared_data / "glue")
  with pytest.raises(
    ValueError, match=r"config.train_batch_size=16 is not divisible by config.grad_accum_steps=3"
  ):
    runner.finetune(c, str(tmp_path / "a2"))  # refused before a step, as pre-training does
  assert not (tmp_path / "a2").exists()
  c = _tiny(glue.get_config("rte"), minilm_dir)
  with pytest.raises(ValueError, match="config.data_dir is empty"):
    runner.finetune(c, str(tmp_path / "b"))
  c = _tiny(glue.get_config("rte"), minilm_dir, max_train_examples=8)
  c.data_dir = str(shared_data / "glue")
  with pytest.raises(ValueError, match="8 rows, fewer than config.train_batch_size=16"):
    runner.finetune(c, str(tmp_path / "c"))
  with pytest.raises(AttributeError):
    glue.get_config("rte").no_such_key = 1
