"""What a pre-training run reads never changes under it, and bad settings are refused first.

The built-in corpus is cut to its first documents (``iter_default_documents`` patched), so a
run prepares it in seconds; the model is the tiny preset at short lengths."""

import glob
import itertools
import json
import logging as std_logging
import os
import re
import shutil

import numpy as np
import pytest

from bert_jax.data import default_corpus, pipeline
from bert_jax.model.run_settings import run_attention_kernel
from bert_jax.runs.pretraining.runner import run_pretraining
from bert_jax.tasks.pretraining import data as data_lib
from configs import pretrain

_DOCUMENTS = 30


@pytest.fixture(autouse=True)
def small_corpus(monkeypatch):
  real = default_corpus.iter_default_documents

  def first_documents():
    return itertools.islice(real(), _DOCUMENTS)

  monkeypatch.setattr(default_corpus, "iter_default_documents", first_documents)


def _config(steps=4, length=32, **kw):
  c = pretrain.get_config("tiny")
  settings = dict(
    num_train_steps=steps,
    num_warmup_steps=1,
    train_batch_size=8,
    eval_batch_size=8,
    max_seq_length=length,
    max_predictions_per_seq=5,
    save_checkpoints_steps=2,
    eval_every_steps=100,
    max_eval_steps=1,
  )
  settings.update(kw)
  for k, v in settings.items():
    target = c
    *parents, leaf = k.split(".")
    for p in parents:
      target = target[p]
    target[leaf] = v
  c.logging.log_every_steps = 1
  if "phase2.fraction" not in kw:
    c.phase2.fraction = 0.0
  return c


def _files(directory):
  """path -> (bytes, mtime_ns) of every file under ``directory``."""
  out = {}
  for root, _, files in os.walk(directory):
    for f in files:
      p = os.path.join(root, f)
      with open(p, "rb") as fh:
        out[p] = (fh.read(), os.stat(p).st_mtime_ns)
  return out


def _words(text):
  return re.findall(r"[a-z0-9]+", text.lower())


def _record_words(pattern, length, predictions, vocab_lines):
  """The words of the first records of ``pattern`` read through ``vocab_lines`` (masks undone
  with masked_lm_ids, word pieces joined), as a tokenizer-independent reading of the ids."""
  inp = pipeline.PretrainInput(pattern, 8, length, predictions, process_index=0, process_count=1)
  batch = next(inp)
  words = []
  for ids, mask, pos, orig, w in zip(
    batch["input_ids"],
    batch["input_mask"],
    batch["masked_lm_positions"],
    batch["masked_lm_ids"],
    batch["masked_lm_weights"],
  ):
    ids = ids.copy()
    ids[pos[w > 0]] = orig[w > 0]
    tokens = [vocab_lines[i] for i in ids[mask > 0] if not vocab_lines[i].startswith("[")]
    words += _words(" ".join(tokens).replace(" ##", ""))
  return words


def test_a_resume_with_other_data_settings_keeps_the_vocab_and_every_file_it_read(
  tmp_path, monkeypatch, caplog
):
  # Started from one directory with a relative --workdir, resumed after the workdir moved, from
  # another directory, with another max_seq_length: the old files are never touched, the new
  # records are the corpus read through the checkpoint's vocabulary.
  (tmp_path / "a").mkdir()
  monkeypatch.chdir(tmp_path / "a")
  first = run_pretraining(_config(steps=4, length=32), "run")
  assert first["status"] == "completed" and first["step"] == 4
  moved = tmp_path / "b" / "run"
  shutil.move(str(tmp_path / "a" / "run"), str(moved))
  before = _files(moved)
  vocab = (moved / "vocab.txt").read_bytes()
  (tmp_path / "c").mkdir()
  monkeypatch.chdir(tmp_path / "c")
  caplog.set_level(std_logging.INFO)
  second = run_pretraining(_config(steps=6, length=64), "../b/run")
  assert second["init"] == "resumed" and second["step"] == 6
  assert "regenerating" not in caplog.text
  after = _files(moved)
  changed = sorted(
    os.path.relpath(p, moved) for p in before if p in after and after[p] != before[p]
  )
  assert (moved / "vocab.txt").read_bytes() == vocab
  # Only the run's own records of progress change; nothing it reads.
  assert all(
    p.startswith(("checkpoints", "events", "tensorboard")) or p.endswith(".json") for p in changed
  ), changed
  assert not [p for p in changed if "default_corpus" in p or p.endswith(".txt")]
  # The seq-64 records: ids of the workdir's vocab.txt, spelling the corpus's words.
  lines = vocab.decode().splitlines()
  corpus = set()
  for p in glob.glob(str(moved / "default_corpus" / "**" / "*.txt"), recursive=True):
    if "vocab" not in os.path.basename(p):
      corpus.update(_words(open(p).read()))
  seq64 = glob.glob(str(moved / "default_corpus" / "**" / "seq_64" / "train-*"), recursive=True)
  assert seq64
  words = _record_words(os.path.join(os.path.dirname(seq64[0]), "train-*"), 64, 5, lines)
  assert len(words) > 50 and np.mean([w in corpus for w in words]) > 0.95
  # The loss curve of both segments: steps 1..6.
  summary = json.loads((moved / "summary.json").read_text())
  assert [s for s, _ in summary["train_loss_history"]] == [1, 2, 3, 4, 5, 6]


def test_runs_sharing_a_corpus_directory_never_write_under_each_other(tmp_path):
  shared = str(tmp_path / "corpus")
  a = _config(default_corpus_dir=shared)
  data_a = data_lib.resolve_data(a, str(tmp_path / "wa"))
  files_a = _files(shared)
  b = _config(length=64, default_corpus_dir=shared, objective="mlm")
  data_b = data_lib.resolve_data(b, str(tmp_path / "wb"))
  after = _files(shared)
  assert {p: after[p] for p in files_a} == files_a  # every file of run a's as it was
  assert data_b.phases[0].input_files != data_a.phases[0].input_files
  again = data_lib.resolve_data(a, str(tmp_path / "wa"))
  assert again.phases[0].input_files == data_a.phases[0].input_files
  assert _files(shared) == after  # reused, nothing written


def test_sizes_no_row_can_hold_are_refused_before_any_work(tmp_path):
  workdir = tmp_path / "w"
  c = _config(**{"packing.enabled": True, "phase2.fraction": 0.5, "phase2.max_seq_length": 64})
  c.phase2.max_predictions_per_seq = 8
  c.phase2.max_sequences_per_row = 100000
  with pytest.raises(ValueError) as e:
    run_pretraining(c, str(workdir))
  # A row of 64 tokens holds at most 64 // 3 = 21 instances of [CLS] x [SEP].
  assert str(e.value).startswith("config.phase2.max_sequences_per_row=100000 is more than")
  assert str(e.value).endswith("set it to <= 21") and "\n" not in str(e.value)
  c.phase2.max_sequences_per_row = 8
  c.packing.max_predictions_per_row = 31  # a row of 32 has 30 non-special tokens
  with pytest.raises(ValueError, match=r"^config\.packing\.max_predictions_per_row=31 .*<= 30$"):
    run_pretraining(c, str(workdir))
  assert not workdir.exists()


def test_the_splash_length_error_names_phase_2s_key():
  c = _config(length=128, attention_kernel="splash", attention_probs_dropout_prob=0.0)
  c.phase2.fraction, c.phase2.max_seq_length = 0.1, 200
  with pytest.raises(ValueError, match=r"needs config\.phase2\.max_seq_length a multiple of"):
    run_attention_kernel(c, platform="tpu", attention_dropout=0.0)


def test_resume_refusals_come_before_any_work_or_write(tmp_path, caplog):
  workdir = tmp_path / "packed"
  packed = dict(**{"packing.enabled": True, "packing.max_sequences_per_row": 4})
  assert run_pretraining(_config(steps=2, **packed), str(workdir))["step"] == 2
  before = _files(workdir)
  caplog.set_level(std_logging.INFO)
  for change, message in (
    ({"packing.enabled": False}, "config.packing.enabled=True"),
    ({**packed, "packing.max_sequences_per_row": 3}, "config.packing.max_sequences_per_row=4"),
  ):
    with pytest.raises(ValueError) as e:
      run_pretraining(_config(steps=4, **change), str(workdir))
    assert message in str(e.value) and str(workdir) in str(e.value)
    assert "\n" not in str(e.value)
  assert "Init:" not in caplog.text
  assert _files(workdir) == before  # config.json included
  # An init checkpoint of another model size: refused before the corpus is prepared.
  fresh = tmp_path / "fresh"
  with pytest.raises(ValueError, match=r"model_config.json: config.init_checkpoint holds another "
                     r"model \(hidden_size: 128 there vs 256"):  # fmt: skip
    run_pretraining(_config(model_preset="mini", init_checkpoint=str(workdir)), str(fresh))
  assert not fresh.exists()


def test_extending_a_finished_curriculum_trains_on_in_phase_2(tmp_path):
  workdir = str(tmp_path / "w")
  two = {"phase2.fraction": 0.2, "phase2.max_seq_length": 64, "phase2.max_predictions_per_seq": 8}
  first = run_pretraining(_config(steps=5, **two), workdir)
  assert first["step"] == 5 and set(first["input_token_share"]) == {"seq32", "seq64"}
  # Phase 2 began at step 4; 10 steps would put it at 8: steps 5 to 7 stay in phase 2.
  second = run_pretraining(_config(steps=10, **two), workdir)
  assert second["step"] == 10
  assert set(second["input_token_share"]) == {"seq64"}  # not one phase-1 row
  assert second["input_token_share"]["seq64"]["rows"] == 5 * 8


def test_a_corpus_directory_of_the_earlier_layout_is_read_and_never_changed(tmp_path):
  # The earlier layout: one data set, its vocabulary and corpus at the top, and a manifest whose
  # paths are relative to the directory it was made from (here "old/dc").
  small = dict(vocab_size=2000, max_documents=20, dupe_factor=1, num_workers=1)
  made = default_corpus.prepare_default_data(
    str(tmp_path / "made"), max_seq_lengths=(32,), max_predictions_per_seq=(5,), **small
  )
  legacy = tmp_path / "legacy"
  shutil.copytree(os.path.dirname(made.corpus_files[0]), legacy / "corpus")
  shutil.copy(made.vocab_file, legacy / "vocab.txt")
  shutil.copytree(os.path.dirname(made.train_files[32]), legacy / "seq_32")
  old = "old/dc"
  manifest = dict(
    args=dict(
      vocab_size=2000, max_seq_lengths=[32], max_predictions_per_seq=[5], dupe_factor=1,
      eval_fraction=0.05, max_documents=20, random_seed=12345,
    ),
    data=dict(
      corpus_files=[f"{old}/corpus/{os.path.basename(p)}" for p in made.corpus_files],
      vocab_file=f"{old}/vocab.txt",
      tokenizer_dir=old,
      train_files={"32": f"{old}/seq_32/train-*.tfrecord"},
      eval_files={"32": f"{old}/seq_32/eval-*.tfrecord"},
      max_predictions_per_seq={"32": 5},
      stats={},
    ),
  )  # fmt: skip
  (legacy / "default_data.json").write_text(json.dumps(manifest))
  before = _files(legacy)
  same = default_corpus.prepare_default_data(
    str(legacy), max_seq_lengths=(32,), max_predictions_per_seq=(5,), **small
  )
  assert same.train_files[32] == str(legacy / "seq_32" / "train-*.tfrecord")
  assert same.vocab_file == str(legacy / "vocab.txt") and glob.glob(same.train_files[32])
  other = default_corpus.prepare_default_data(
    str(legacy), max_seq_lengths=(64,), max_predictions_per_seq=(5,), **small
  )
  assert other.vocab_file == str(legacy / "vocab.txt")  # its vocabulary, not a new one
  assert glob.glob(other.train_files[64]) and not glob.glob(str(legacy / "vocab-*"))
  after = _files(legacy)
  assert {p: after[p] for p in before} == before


def test_rerunning_a_finished_run_keeps_its_summary(tmp_path):
  """A finished run started again (a requeue that lands as the run exits, say) trains nothing
  and keeps the finished run's training figures and loss curve in summary.json."""
  workdir = str(tmp_path / "w")
  first = run_pretraining(_config(steps=4), workdir)
  assert first["status"] == "completed" and first["train"]
  again = run_pretraining(_config(steps=4), workdir)
  assert again["step"] == 4 and again["start_step"] == 4
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  assert summary["train"] == json.loads(json.dumps(first["train"]))
  assert summary["train_loss_history"] == [list(e) for e in first["train_loss_history"]]
