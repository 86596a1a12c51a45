"""The built-in default corpus (CPython's own documentation) and prepare_default_data."""

import glob
import os

import numpy as np

from bert_jax.data import default_corpus, pipeline


def test_default_documents_are_prose():
  docs = list(default_corpus.iter_default_documents())
  assert len(docs) > 300
  names = [n for n, _ in docs]
  assert "pydoc:assert" in names and any(n.startswith("stdlib:") for n in names)
  sentences = [s for _, d in docs for s in d]
  assert sum(len(s) for s in sentences) > 1_000_000
  assert not any(s.lstrip().startswith(">>>") for s in sentences)
  # Prose: most sentences are several words and end like sentences.
  assert np.mean([len(s.split()) >= 4 for s in sentences]) > 0.9
  assert np.mean([s.rstrip()[-1] in ".:?!)\"'" for s in sentences]) > 0.8


def test_prepare_default_data(tmp_path):
  out = str(tmp_path / "default")
  data = default_corpus.prepare_default_data(
    out, vocab_size=2000, max_documents=60, dupe_factor=1, eval_fraction=0.1, num_workers=1
  )
  assert set(data.train_files) == {128, 512} and data.max_predictions_per_seq == {128: 20, 512: 80}
  from bert_jax.tokenize import load_tokenizer

  tokenizer = load_tokenizer(data.tokenizer_dir)
  assert tokenizer.vocab_size <= 2000 and tokenizer.do_lower_case
  assert os.path.exists(data.vocab_file)
  for seq, preds in data.max_predictions_per_seq.items():
    assert glob.glob(data.train_files[seq]) and glob.glob(data.eval_files[seq])
    inp = pipeline.PretrainInput(
      data.train_files[seq], 4, seq, preds, process_index=0, process_count=1
    )
    batch = next(inp)
    assert batch["input_ids"].shape == (4, seq)
    assert batch["input_ids"].max() < tokenizer.vocab_size
    assert (batch["input_ids"][:, 0] == tokenizer.cls_id).all()
    evals = list(
      pipeline.eval_batches(data.eval_files[seq], 8, seq, preds, process_index=0, process_count=1)
    )
    assert (
      sum(b["example_weights"].sum() for b in evals)
      == data.stats["per_length"][str(seq)]["eval_examples"]
      > 0
    )

  # Idempotent: a second call with the same arguments reuses the files (none is rewritten).
  def stamps():
    return {
      p: os.stat(p).st_mtime_ns
      for p in glob.glob(os.path.join(out, "**", "*"), recursive=True)
      if os.path.isfile(p)
    }

  before = stamps()
  again = default_corpus.prepare_default_data(
    out, vocab_size=2000, max_documents=60, dupe_factor=1, eval_fraction=0.1, num_workers=1
  )
  assert again == data and stamps() == before


def test_prepare_default_data_for_the_ablations(tmp_path):
  import json

  from bert_jax.data import tfrecord

  out = str(tmp_path / "default")
  small = dict(
    vocab_size=1500,
    max_documents=40,
    dupe_factor=1,
    eval_fraction=0.1,
    num_workers=1,
    max_seq_lengths=(128,),
    max_predictions_per_seq=(20,),
  )
  data = default_corpus.prepare_default_data(out, **small)

  def data_dir(d):  # each set of arguments has its own directory, with its manifest
    return os.path.dirname(os.path.dirname(d.train_files[128]))

  with open(os.path.join(data_dir(data), "default_data.json")) as f:
    args = json.load(f)["args"]
  # New settings at their defaults are not recorded: directories prepared before stay valid.
  assert not {"sentence_pairs", "masked_lm_prob", "mask_rates", "whole_word_mask"} & set(args)
  assert tfrecord.records_have_sentence_pairs(data.train_files[128], 128, 20)

  packed = default_corpus.prepare_default_data(
    out, **small, sentence_pairs=False, mask_rates=(1.0, 0.0, 0.0), whole_word_mask=True
  )
  assert data_dir(packed) != data_dir(data) and packed.vocab_file == data.vocab_file
  with open(os.path.join(data_dir(packed), "default_data.json")) as f:
    args = json.load(f)["args"]
  assert args["sentence_pairs"] is False and args["mask_rates"] == [1.0, 0.0, 0.0]
  assert args["whole_word_mask"] is True and "masked_lm_prob" not in args
  with open(os.path.join(data_dir(packed), "generation_config.json")) as f:
    config = json.load(f)
  assert config["sentence_pairs"] is False and config["whole_word_mask"] is True
  assert not tfrecord.records_have_sentence_pairs(packed.train_files[128], 128, 20)
  batch = next(
    pipeline.PretrainInput(packed.train_files[128], 8, 128, 20, process_index=0, process_count=1)
  )
  assert (batch["segment_ids"] == 0).all()
  k = batch["masked_lm_weights"] > 0
  positions = batch["masked_lm_positions"][k]
  rows = np.nonzero(k)[0]
  from bert_jax.tokenize import load_tokenizer

  mask_id = load_tokenizer(packed.tokenizer_dir).mask_id
  assert (batch["input_ids"][rows, positions] == mask_id).all()  # rates (1, 0, 0): all [MASK]
