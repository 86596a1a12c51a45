"""Pre-training ablations as runs: objectives that contradict the data, mask rates that do not
sum to 1 and a causal checkpoint handed to a bidirectional task are clear errors naming the key;
a left-to-right run trains on packed data and its checkpoint, at any kept step, is what
fine-tuning starts from (paper appendix C.1); a run of each objective without NSP (masked LM
with dynamic whole-word masking at 60/20/20 rates, left-to-right LM) killed with SIGKILL and
restarted reproduces the uninterrupted run's losses exactly. The data comes from conftest's
``pretraining_data``; the run and loss helpers are test_pretrain's."""

import json
import os
import signal

import numpy as np
import pytest

from bert_jax.runs.pretraining.runner import run_pretraining


@pytest.fixture(scope="module")
def packed_data(pretraining_data, shared_data):
  """A vocabulary, packed single-segment TFRecords (no NSP pairs) and a one-layer config."""
  data = pretraining_data(
    "packed64",
    [shared_data / "pretrain" / "bert_sample_text.txt"],
    vocab_size=600,
    max_seq_lengths=(64,),
    max_predictions_per_seq=(10,),
    dupe_factor=4,
    sentence_pairs=False,
    model=dict(
      hidden_size=32,
      num_hidden_layers=1,
      num_attention_heads=2,
      intermediate_size=64,
      max_position_embeddings=64,
    ),
  )
  return dict(vocab=data["vocab"], train=data["train"], bert=data["bert_config"])


def _config(data, **overrides):
  from configs import pretrain

  c = pretrain.get_config("tiny")
  c.input_files = data["train"]
  c.vocab_file = data["vocab"]
  c.bert_config_file = data["bert"]
  c.max_seq_length, c.max_predictions_per_seq = 64, 10
  c.phase2.fraction = 0.0
  c.train_batch_size, c.eval_batch_size = 8, 8
  c.num_train_steps, c.num_warmup_steps = 4, 1
  c.save_checkpoints_steps = 2
  c.eval_every_steps = 0
  c.shuffle_buffer_size = 20
  c.checkpoint.async_save = False
  c.logging.log_every_steps = 1
  for key, value in overrides.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def test_nsp_on_data_without_sentence_pairs_is_refused_naming_the_key(tmp_path, packed_data):
  with pytest.raises(ValueError, match=r"config\.objective='mlm_nsp' needs sentence pairs"):
    run_pretraining(_config(packed_data), str(tmp_path / "w"))
  assert not (tmp_path / "w" / "checkpoints").exists()


@pytest.mark.parametrize(
  "overrides, words",
  [
    ({"mask_rates.random": 0.2}, r"config\.mask_rates.*sum to 1"),
    ({"mask_rates.mask": -0.1, "mask_rates.same": 0.3}, r"config\.mask_rates"),
    ({"objective": "bidirectional_lm"}, r"config\.objective='bidirectional_lm' is not one of"),
  ],
)
def test_bad_objective_settings_name_the_key(tmp_path, packed_data, overrides, words):
  with pytest.raises(ValueError, match=words):
    run_pretraining(_config(packed_data, **{"objective": "mlm", **overrides}), str(tmp_path / "w"))
  assert not (tmp_path / "w" / "checkpoints").exists()


@pytest.fixture(scope="module")
def ltr_workdir(tmp_path_factory, packed_data):
  workdir = tmp_path_factory.mktemp("ltr")
  config = _config(packed_data, objective="ltr")
  config.checkpoint.keep_checkpoint_max = 1
  config.checkpoint.keep_period = 2
  summary = run_pretraining(config, str(workdir))
  assert summary["status"] == "completed"
  return workdir


def test_left_to_right_run_and_fine_tuning_from_any_kept_step(ltr_workdir, shared_data):
  from bert_jax.formats import load_pretrained
  from bert_jax.runs.finetuning import runner
  from configs import glue

  head = json.loads((ltr_workdir / "head.json").read_text())
  assert head == {"task": "pretraining", "objective": "ltr"}
  assert json.loads((ltr_workdir / "model_config.json").read_text())["is_decoder"] is True
  # keep_checkpoint_max=1 with keep_period=2: step 2 is kept beside the latest (4).
  assert sorted(p.name for p in (ltr_workdir / "checkpoints").iterdir()) == ["2", "4"]
  latest = load_pretrained(ltr_workdir)
  early = load_pretrained(ltr_workdir / "checkpoints" / "2")
  assert "nsp" not in latest.params and early.config.is_decoder
  word = ("bert", "embeddings", "word_embeddings", "embedding")

  def pick(p):
    for k in word:
      p = p[k]
    return p

  assert not np.array_equal(pick(latest.params), pick(early.params))

  def config(**kw):
    c = glue.get_config("rte")
    c.data_dir = str(shared_data / "glue")
    c.init_checkpoint = str(ltr_workdir / "checkpoints" / "2")
    c.max_seq_length, c.train_batch_size, c.eval_batch_size = 64, 8, 8
    c.num_train_steps, c.max_train_examples, c.max_eval_examples = 2, 16, 16
    c.predict_test = False
    for k, v in kw.items():
      setattr(c, k, v)
    return c

  # A causal encoder for a task that reads both directions: refused unless said how.
  with pytest.raises(ValueError, match=r"config\.causal_checkpoint"):
    runner.finetune(config(), str(ltr_workdir.parent / "ft_refused"))
  out = ltr_workdir.parent / "ft"
  result = runner.finetune(config(causal_checkpoint="bidirectional"), str(out))
  assert f"initialised from {ltr_workdir / 'checkpoints' / '2'}" in result["init"]
  assert "is_decoder" not in json.loads((out / "model_config.json").read_text())
  causal = ltr_workdir.parent / "ft_causal"
  runner.finetune(config(causal_checkpoint="causal"), str(causal))
  assert json.loads((causal / "model_config.json").read_text())["is_decoder"] is True


# -- resume is exact for every objective ------------------------------------------------------

RESUME_CASES = {
  # "No NSP" with masks re-drawn at every read, whole words, Table 8 rates other than 80/10/10.
  "mlm_dynamic_wwm_60_20_20": [
    "--config.objective=mlm",
    "--config.dynamic_masking=true",
    "--config.whole_word_mask=true",
    "--config.mask_rates.mask=0.6",
    "--config.mask_rates.same=0.2",
    "--config.mask_rates.random=0.2",
  ],
  # Left-to-right LM: the static masks in the files are undone.
  "ltr": ["--config.objective=ltr"],
}


@pytest.mark.parametrize(
  "case",
  [
    # ltr resumes through the same code as mlm (no masking at all); kept out of CI for time.
    pytest.param(c, marks=pytest.mark.slow) if c == "ltr" else c
    for c in sorted(RESUME_CASES)
  ],
)
def test_sigkill_and_resume_is_exact_on_packed_data(case, tmp_path, packed_data):
  """SIGKILL between checkpoints and a restart: every step's loss equals the uninterrupted
  run's bit for bit (the data position, the dynamic masks and dropout all resume)."""
  from test_pretrain import losses_by_step, run

  steps = 6
  overrides = [
    *RESUME_CASES[case],
    f"--config.input_files={packed_data['train']}",
    f"--config.vocab_file={packed_data['vocab']}",
    f"--config.bert_config_file={packed_data['bert']}",
    "--config.max_seq_length=64",
    "--config.max_predictions_per_seq=10",
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
  _, out = run(str(ref_dir), *overrides)
  reference = losses_by_step(str(ref_dir))
  assert sorted(reference) == list(range(1, steps + 1))
  config = json.loads((ref_dir / "config.json").read_text())
  head = json.loads((ref_dir / "head.json").read_text())
  if case == "ltr":
    assert head["objective"] == "ltr" and ", unmasked" in out
  else:
    assert head["objective"] == "mlm" and ", dynamic masking" in out
    assert config["mask_rates"] == {"mask": 0.6, "same": 0.2, "random": 0.2}
    assert config["whole_word_mask"] is True
  # Killed after step 5 is logged: step 4 is the last checkpoint, step 5 is lost.
  code, out = run(str(cut_dir), *overrides, kill_at=5, sig=signal.SIGKILL)
  assert code == -signal.SIGKILL, out[-3000:]
  saved = [int(s) for s in os.listdir(cut_dir / "checkpoints") if s.isdigit()]
  assert saved and max(saved) < steps
  _, out = run(str(cut_dir), *overrides)
  assert "resumed from" in out, out[-3000:]
  resumed = losses_by_step(str(cut_dir))
  assert sorted(resumed) == list(range(1, steps + 1))
  assert [resumed[s] for s in range(1, steps + 1)] == [reference[s] for s in range(1, steps + 1)]
