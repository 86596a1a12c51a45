"""SQuAD end to end through the shared fine-tuning runner, and with SentencePiece vocabularies."""

import json
import math

import numpy as np
import pytest

from bert_jax.tasks.squad import evaluation as squad_eval
from bert_jax.tasks.squad.examples import read_squad_examples
from bert_jax.tasks.squad.features import convert_examples_to_features
from bert_jax.tasks.squad.postprocess import compute_predictions


def _gold_logits(arrays, features):
  start = np.zeros(arrays["input_ids"].shape, np.float32)
  end = np.zeros_like(start)
  start[:, 0] = end[:, 0] = 2.0
  for row, f in enumerate(features):
    sp, ep = arrays["start_positions"][row], arrays["end_positions"][row]
    if sp and f.max_context[sp - f.context_offset]:
      start[row, sp], end[row, ep] = 9.0, 9.0
  return start, end


def test_task_plumbing_on_a_slice(shared_data, minilm_dir, tmp_path):
  from bert_jax.tasks import create_task
  from bert_jax.tokenize import load_tokenizer
  from configs import squad as squad_config

  config = squad_config.get_config("v2")
  config.predict_file = str(shared_data / "squad" / "sample-v2.0.json")
  config.max_eval_examples = 5
  task = create_task(config, load_tokenizer(minilm_dir / "vocab.txt"))
  assert task.head_info()["task"] == "question_answering"
  data = task.load_split("dev")
  assert data.stats["examples"] == 5 and data.stats["features"] == data.num_rows
  assert data.arrays["input_ids"].shape == (data.num_rows, 384)
  start, end = _gold_logits(data.arrays, data.features)
  metrics, preds = task.evaluate(data, {"start_logits": start, "end_logits": end})
  assert metrics["total"] == 5 and metrics["exact"] == metrics["f1"] == 100.0
  paths = task.write_predictions(data, preds, str(tmp_path))
  assert sorted(p.rsplit("/", 1)[-1] for p in paths) == [
    "nbest_predictions.json",
    "null_odds.json",
    "predictions.json",
  ]
  with pytest.raises(ValueError, match="config.train_file is empty"):
    task.load_split("train")
  with pytest.raises(ValueError, match="no split 'test'"):
    task.load_split("test")


def test_finetune_and_evaluate_v2_sample(shared_data, minilm_dir, tmp_path):
  from bert_jax.runs.finetuning import runner
  from configs import squad as squad_config

  sample = str(shared_data / "squad" / "sample-v2.0.json")
  config = squad_config.get_config("v2")
  config.train_file = config.predict_file = sample
  config.vocab_file = str(minilm_dir / "vocab.txt")  # tiny encoder from scratch
  config.max_seq_length, config.doc_stride, config.max_query_length = 64, 32, 16
  config.train_batch_size = config.eval_batch_size = 8
  config.num_train_steps, config.learning_rate = 6, 1e-3
  config.logging.log_every_steps = 1
  workdir = tmp_path / "run"
  result = runner.finetune(config, str(workdir))

  dataset = json.loads((shared_data / "squad" / "sample-v2.0.json").read_text())["data"]
  qids = {qa["id"] for a in dataset for p in a["paragraphs"] for qa in p["qas"]}
  out = workdir / "predictions"
  preds = json.loads((out / "predictions.json").read_text())
  null_odds = json.loads((out / "null_odds.json").read_text())
  nbest = json.loads((out / "nbest_predictions.json").read_text())
  assert set(preds) == set(null_odds) == set(nbest) == qids
  assert all(1 <= len(v) <= 20 for v in nbest.values())
  dev = result["dev"]
  assert dev["HasAns_total"] == 8 and dev["NoAns_total"] == 6
  # The reported numbers are those of the written files under the official script's logic.
  official = squad_eval.evaluate_v2(dataset, preds, null_odds, na_prob_thresh=0.0)
  assert {k: dev[k] for k in official} == pytest.approx(official)
  assert dev["f1"] == pytest.approx(squad_eval.evaluate_v2(dataset, preds)["f1"])
  assert "tuned_f1_thresh" in dev
  # Training lowered the loss from about log(64) (the near-zero logits of a new head: uniform
  # start/end guesses over the 64 positions).
  losses = [
    loss for _, loss in json.loads((workdir / "summary.json").read_text())["train_loss_history"]
  ]
  assert losses[0] == pytest.approx(math.log(64), abs=0.3)
  assert losses[-1] < losses[0] - 0.1
  head = json.loads((workdir / "head.json").read_text())
  assert head["task"] == "question_answering"

  metrics = runner.evaluate(str(workdir), "dev")
  again = workdir / "eval_dev"
  for name in ("predictions.json", "nbest_predictions.json", "null_odds.json", "metrics.json"):
    assert (again / name).is_file()
  assert json.loads((again / "predictions.json").read_text()) == preds
  assert metrics["eval"]["dev"]["f1"] == pytest.approx(dev["f1"])


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_vocab_recovers_gold_answers(shared_data, tmp_path, model_type):
  """With SentencePiece pieces (no punctuation split) gold logits give the gold answer up to
  the pieces' boundaries: the official EM (which drops punctuation) where they align."""
  from bert_jax.tokenize.vocab import build_sentencepiece_model

  tokenizer = build_sentencepiece_model(
    [str(shared_data / "pretrain" / "shakespeare" / "hamlet_gut.txt")],
    str(tmp_path / "sp"),
    1500,
    model_type,
  )
  for name, v2 in (("sample-v1.1.json", False), ("sample-v2.0.json", True)):
    path = shared_data / "squad" / name
    examples = read_squad_examples(str(path), False, v2)
    arrays, features = convert_examples_to_features(examples, tokenizer, 64, 16, 16)
    start, end = _gold_logits(arrays, features)
    preds = compute_predictions(examples, features, start, end, tokenizer, 20, 30, v2)
    contexts = {
      qa["id"]: p["context"]
      for a in json.loads(path.read_text())["data"]
      for p in a["paragraphs"]
      for qa in p["qas"]
    }
    for e in examples:
      pred = preds.predictions[e.qas_id]
      if not e.answers:
        assert pred == ""
        continue
      assert pred in contexts[e.qas_id]
      assert squad_eval.normalize_answer(e.answers[0]) in squad_eval.normalize_answer(pred)
    exact = (squad_eval.evaluate_v2 if v2 else squad_eval.evaluate_v1)(
      json.loads(path.read_text())["data"], preds.predictions
    )
    assert exact["exact" if v2 else "exact_match"] >= 80.0


def test_unlabelled_file_gets_predictions_without_metrics(shared_data, minilm_dir, tmp_path):
  from bert_jax.tasks import create_task
  from bert_jax.tokenize import load_tokenizer
  from configs import squad as squad_config

  data = json.loads((shared_data / "squad" / "sample-v1.1.json").read_text())
  for article in data["data"]:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        del qa["answers"]
  (tmp_path / "test.json").write_text(json.dumps(data))
  config = squad_config.get_config("v1")
  config.predict_file = str(tmp_path / "test.json")
  config.max_seq_length = 128
  task = create_task(config, load_tokenizer(minilm_dir / "vocab.txt"))
  split = task.load_split("dev")
  assert not split.has_labels
  rng = np.random.default_rng(0)
  logits = {
    k: rng.normal(size=split.arrays["input_ids"].shape).astype(np.float32)
    for k in ("start_logits", "end_logits")
  }
  metrics, preds = task.evaluate(split, logits)
  assert metrics == {} and len(preds.predictions) == 5
  assert all(p for p in preds.predictions.values())
  task.write_predictions(split, preds, str(tmp_path / "out"))
  assert json.loads((tmp_path / "out" / "predictions.json").read_text()) == preds.predictions
