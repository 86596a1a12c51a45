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
