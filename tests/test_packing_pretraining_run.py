"""Packing in pre-training runs: seq-64 records packed into rows of 128 train and evaluate, the
real-token share reaches summary.json; the real reader's packed rows (dynamic whole-word masks)
resume from a saved position to the same rows; input that cannot be packed is a one-line error
naming the key before anything is written; the dropout / attention-kernel keys and the
base_fast preset."""

import json

import numpy as np
import pytest

from bert_jax.runs.pretraining.runner import (
  bert_config_from,
  build_pretraining_job,
  run_pretraining,
)


@pytest.fixture(scope="module")
def pairs(pretraining_data, shared_data):
  data = pretraining_data(
    "packing_pairs64",
    [shared_data / "pretrain" / "bert_sample_text.txt"],
    vocab_size=600,
    max_seq_lengths=(64,),
    max_predictions_per_seq=(10,),
    dupe_factor=2,
    eval_fraction=0.1,
    model=dict(
      hidden_size=32,
      num_hidden_layers=1,
      num_attention_heads=2,
      intermediate_size=64,
      max_position_embeddings=128,
    ),
  )
  return dict(
    vocab=data["vocab"],
    train=data["files"][64]["train"],
    eval=data["files"][64]["train"],  # (held-out data of this size: none; the train split)
    bert=data["bert_config"],
  )


def _config(data, **overrides):
  from configs import pretrain

  c = pretrain.get_config("tiny")
  c.input_files, c.eval_input_files = data["train"], data["eval"]
  c.vocab_file = data["vocab"]
  c.bert_config_file = data["bert"]
  c.max_seq_length, c.max_predictions_per_seq = 128, 10
  c.phase2.fraction = 0.0
  c.train_batch_size, c.eval_batch_size = 8, 8
  c.num_train_steps, c.num_warmup_steps = 3, 1
  c.save_checkpoints_steps = 3
  c.eval_every_steps = 3
  c.max_eval_steps = 2
  c.shuffle_buffer_size = 20
  c.checkpoint.async_save = False
  c.logging.log_every_steps = 1
  c.packing.enabled = True
  for key, value in overrides.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def _record_share(pattern, length):
  import tensorflow as tf

  from bert_jax.data import corpus, tfrecord

  ds = tf.data.TFRecordDataset(corpus.expand_patterns(pattern)).batch(1000)
  masks = [tfrecord.parse_batch(b, length, 10)["input_mask"].numpy() for b in ds]
  return float(np.concatenate(masks).mean())


def test_packed_run_trains_evaluates_and_reports_the_real_token_share(tmp_path, pairs, caplog):
  caplog.set_level("INFO")
  workdir = tmp_path / "w"
  summary = run_pretraining(
    _config(pairs, dynamic_masking=True, whole_word_mask=True), str(workdir)
  )
  assert summary["status"] == "completed"
  share = summary["input_token_share"]["seq128"]
  assert share["packed"] is True and share["rows"] >= 3 * 8
  # Rows of 128 from records of 64: at least two instances per row, so more real tokens per slot
  # than the records would give unpacked at the run's length (each alone in a row of 128: their
  # real tokens / 128). (Not more than the records' own share over 64: a row holding one record
  # is half empty.)
  assert share["sequences_per_row"] >= 2.0
  assert share["real_token_share"] > _record_share(pairs["train"], 64) * 64 / 128
  assert json.loads((workdir / "summary.json").read_text())["input_token_share"] == {
    "seq128": share
  }
  (evaluation,) = summary["eval_history"]
  assert np.isfinite(evaluation["mlm_loss"]) and np.isfinite(evaluation["nsp_loss"])
  logged = (
    f"seq128 input: real-token share of rows {share['real_token_share']:.4f} (packed, "
    f"{share['sequences_per_row']:.2f} sequences per row, {share['rows']} rows)"
  )
  assert logged in caplog.text


def test_unpacked_run_reports_its_share_too(tmp_path, pairs):
  summary = run_pretraining(
    _config(
      pairs,
      **{
        "packing.enabled": False,
        "max_seq_length": 64,
        "num_train_steps": 2,
        "eval_every_steps": 0,
      },
    ),
    str(tmp_path / "w"),
  )
  share = summary["input_token_share"]["seq64"]
  assert share["packed"] is False and share["sequences_per_row"] == 1.0
  assert 0 < share["real_token_share"] < 1


@pytest.mark.parametrize("objective", ["mlm_nsp", "ltr"])
def test_packed_reader_resumes_to_the_same_rows(tmp_path, pairs, objective):
  """The real reader with dynamic whole-word masks (ltr: unmasked), packed: a position saved
  after a few batches restores the same following rows in a new iterator."""
  from bert_jax.tasks.pretraining import data as pretraining_data

  dynamic = objective != "ltr"
  config = _config(pairs, objective=objective, dynamic_masking=dynamic, whole_word_mask=dynamic)
  sources = pretraining_data.resolve_data(config, str(tmp_path))
  (phase,) = sources.phases
  assert (phase.max_seq_length, phase.record_seq_length, phase.max_sequences_per_row) == (
    128,
    64,
    4,
  )
  make = pretraining_data.input_factory(config, sources, phase, 3)
  it = make()
  for _ in range(3):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  expected = [next(it) for _ in range(4)]
  again = make()
  again.set_state(state)
  for want, got in zip(expected, (next(again) for _ in range(4))):
    assert sorted(want) == sorted(got)
    for k in want:
      np.testing.assert_array_equal(want[k], got[k], err_msg=k)
  assert expected[0]["input_ids"].shape == (3, 128)
  if objective == "mlm_nsp":
    assert expected[0]["next_sentence_labels"].shape == (3, 4)


@pytest.mark.parametrize(
  "overrides, message",
  [
    (
      {"max_seq_length": 32},
      r"^config\.max_seq_length=32 is shorter than the records of config\.input_files "
      r"\(.*: 64 tokens\): a packed row must hold a whole instance; set "
      r"config\.max_seq_length >= 64$",
    ),
    (
      {"packing.max_sequences_per_row": 0},
      r"^config\.packing\.max_sequences_per_row must be >= 1 with config\.packing\.enabled, "
      r"got 0$",
    ),
    (
      {"packing.max_predictions_per_row": 6},
      r"^config\.packing\.max_predictions_per_row=6 is less than the 10 predictions per record "
      r"of config\.input_files \(.*\); set it to >= 10, or 0 for the default$",
    ),
  ],
)
def test_input_that_cannot_be_packed_is_refused_before_anything_is_written(
  tmp_path, pairs, overrides, message
):
  workdir = tmp_path / "w"
  with pytest.raises(ValueError, match=message):
    run_pretraining(_config(pairs, **overrides), str(workdir))
  assert not workdir.exists() or not any(workdir.iterdir())


def test_abstract_packed_job_has_the_packed_batch_shapes():
  from conftest import tiny_pretrain_config

  config = tiny_pretrain_config()
  config.packing.enabled = True
  config.phase2.fraction = 0.1
  job = build_pretraining_job(config)
  p1, p2 = (p.batch_spec for p in job.program.phases)
  b1, b2 = config.train_batch_size, config.phase2.train_batch_size
  assert p1["sequence_ids"].shape == (b1, 128) and p1["position_ids"].shape == (b1, 128)
  # ceil(0.15 x 128) + 4 = 24 prediction slots for 4 sequences; at 512 with 8: 77 + 8 = 85.
  assert p1["masked_lm_positions"].shape == (b1, 24) and p1["cls_positions"].shape == (b1, 4)
  assert p2["masked_lm_positions"].shape == (b2, 85) and p2["sequence_weights"].shape == (b2, 8)
  # Held-out batches stay one sequence per row.
  assert "sequence_ids" not in job.program.eval_batch_spec


def test_dropout_and_attention_kernel_keys_reach_the_model():
  from configs import pretrain

  config = pretrain.get_config("tiny")
  default = bert_config_from(config, 100)
  assert (default.hidden_dropout_prob, default.attention_probs_dropout_prob) == (0.1, 0.1)
  assert default.attention_kernel == "reference"
  config.hidden_dropout_prob, config.attention_probs_dropout_prob = 0.2, 0.0
  config.attention_kernel = "dot_product"
  bert = bert_config_from(config, 100)
  assert (bert.hidden_dropout_prob, bert.attention_probs_dropout_prob) == (0.2, 0.0)
  assert bert.attention_kernel == "dot_product"
  config.attention_kernel = "auto"  # on CPUs: the reference path
  assert bert_config_from(config, 100).attention_kernel == "reference"
  config.attention_probs_dropout_prob, config.attention_kernel = 0.1, "dot_product"
  with pytest.raises(ValueError, match=r"config\.attention_kernel='dot_product' has no attention"):
    bert_config_from(config, 100)


def test_base_fast_departs_from_base_in_exactly_its_documented_keys():
  from configs import pretrain

  base, fast = pretrain.get_config("base"), pretrain.get_config("base_fast")
  b, f = json.loads(base.to_json()), json.loads(fast.to_json())
  changed = {k: (b[k], f[k]) for k in b if b[k] != f[k] and k != "packing"}
  assert changed == {
    "dtype": ("float32", "bfloat16"),
    "attention_probs_dropout_prob": (0.1, 0.0),
    "attention_kernel": ("reference", "auto"),
  }
  assert f["packing"] == dict(b["packing"], enabled=True)
  assert f["hidden_dropout_prob"] == 0.1 and f["model_preset"] == "base"
  with pytest.raises(ValueError, match=r"unknown pre-training preset 'base_slow'.*base_fast"):
    pretrain.get_config("base_slow")


@pytest.mark.slow
def test_sigkill_and_resume_of_a_packed_run_is_exact(tmp_path, pairs):
  """A packed run (dynamic whole-word masks, seq-64 records in rows of 128) killed with SIGKILL
  between checkpoints and restarted: every step's loss equals the uninterrupted run's."""
  import os
  import signal

  from test_pretrain import losses_by_step, run

  steps = 6
  overrides = [
    f"--config.input_files={pairs['train']}",
    f"--config.vocab_file={pairs['vocab']}",
    f"--config.bert_config_file={pairs['bert']}",
    "--config.max_seq_length=128",
    "--config.max_predictions_per_seq=10",
    "--config.packing.enabled=true",
    "--config.dynamic_masking=true",
    "--config.whole_word_mask=true",
    "--config.phase2.fraction=0",
    f"--config.num_train_steps={steps}",
    "--config.num_warmup_steps=1",
    "--config.train_batch_size=4",
    "--config.save_checkpoints_steps=2",
    "--config.eval_every_steps=0",
    "--config.logging.log_every_steps=1",
    "--config.checkpoint.keep_checkpoint_max=10",
    "--config.shuffle_buffer_size=20",
  ]
  ref_dir, cut_dir = tmp_path / "uninterrupted", tmp_path / "interrupted"
  run(str(ref_dir), *overrides)
  reference = losses_by_step(str(ref_dir))
  assert sorted(reference) == list(range(1, steps + 1))
  code, out = run(str(cut_dir), *overrides, kill_at=5, sig=signal.SIGKILL)
  assert code == -signal.SIGKILL, out[-3000:]
  saved = [int(s) for s in os.listdir(cut_dir / "checkpoints") if s.isdigit()]
  assert saved and max(saved) < steps
  _, out = run(str(cut_dir), *overrides)
  assert "resumed from" in out, out[-3000:]
  resumed = losses_by_step(str(cut_dir))
  assert [resumed[s] for s in range(1, steps + 1)] == [reference[s] for s in range(1, steps + 1)]


def test_a_kernel_the_devices_cannot_run_is_refused_before_anything_is_written(tmp_path):
  from configs import pretrain

  config = pretrain.get_config("tiny")
  config.attention_kernel, config.attention_probs_dropout_prob = "splash", 0.0
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=r"^config\.attention_kernel='splash' runs on TPUs only"):
    run_pretraining(config, str(workdir))
  assert not workdir.exists()  # no corpus prepared, no workdir made
