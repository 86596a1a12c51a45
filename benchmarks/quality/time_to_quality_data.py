"""The time-to-quality benchmark's data: real text split by document, one vocabulary, one set of
pre-training TFRecords that every recipe reads.

  data = prepare(out_dir, corpora=("wiki", "shakespeare", "cpython"), heldout_fraction=0.05)
  data.train_files, data.heldout_files, data.vocab_file, data.eval_records

Corpora: ``wiki`` (the Wikipedia excerpt under /work/shared/data/pretrain/wiki: an article is a
document), ``shakespeare`` (a play or poem file is a document), ``cpython`` (the built-in corpus,
``bert_jax.data.default_corpus``: CPython's docs). A document goes to the held-out side when the
hash of its text falls below ``heldout_fraction``: the same text always lands on the same side,
and a held-out document whose text or long sentences the training side holds is dropped, so no
held-out document's text is trained on, even where a corpus repeats or nests one. The sides are
written in google-research/bert's format (``train/<corpus>.txt``, ``heldout/heldout.txt``), the
WordPiece vocabulary is built from the training side only (``bert_jax.tokenize.vocab``), and the
records by ``bert_jax.data.generate`` (static masks, seq 128, 20 predictions; the held-out side
once, ``dupe_factor`` 1, one file). The evaluation reads the first ``eval_records`` held-out
records (a multiple of the evaluation batch). ``data.json`` records what was made: a second
call with the same settings reuses it.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
from collections.abc import Iterable, Iterator

from benchmarks.common.torch_pretrain import read_records
from bert_jax.data import corpus, generate
from bert_jax.data.default_corpus import iter_default_documents
from bert_jax.tokenize import vocab

CORPORA = ("wiki", "shakespeare", "cpython")
SHARED_PRETRAIN = "/work/shared/data/pretrain"
MAX_SEQ_LENGTH, MAX_PREDICTIONS = 128, 20


@dataclasses.dataclass(frozen=True)
class Data:
  out_dir: str
  vocab_file: str
  train_files: str  # glob
  heldout_files: str  # glob
  eval_records: int  # the held-out records every evaluation reads (from the start)
  train_records: int
  real_tokens_per_record: float  # mean non-pad tokens of a training record
  documents: dict  # {"train": n, "heldout": n}


def iter_documents(name: str, root: str = SHARED_PRETRAIN) -> Iterator[list[str]]:
  """The documents (lists of sentences) of one corpus, in a fixed order."""

  if name == "wiki":
    for path in sorted(glob.glob(os.path.join(root, "wiki", "*.bz2"))):
      yield from corpus.read_wiki_dump(path, {})
  elif name == "shakespeare":
    for path in sorted(glob.glob(os.path.join(root, "shakespeare", "*_gut.txt"))):
      yield from corpus.read_plain_text(path, {}, doc_boundary=0)
  elif name == "cpython":
    for _, sentences in iter_default_documents():
      yield sentences
  else:
    raise ValueError(f"--corpora: unknown corpus {name!r}; choose from {', '.join(CORPORA)}")


def is_heldout(document: list[str], fraction: float) -> bool:
  """Whether a document is held out: its text's hash, as a number in [0, 1), below fraction."""
  digest = hashlib.sha256("\n".join(document).encode()).digest()
  return int.from_bytes(digest[:8], "little") / 2**64 < fraction


def split_documents(
  documents: Iterable[list[str]], fraction: float, long_sentence: int = 40
) -> tuple[list[list[str]], list[list[str]], int]:
  """(train, heldout, dropped) by ``is_heldout``. A corpus may hold a document inside another
  (CPython's pydoc topics do): a held-out document is dropped (counted, used by neither side)
  when its text lies within the training text or any of its sentences of ``long_sentence``
  characters or more is a training sentence."""
  train, heldout = [], []
  for doc in documents:
    (heldout if is_heldout(doc, fraction) else train).append(doc)
  train_text = "\n\n".join("\n".join(d) for d in train)
  train_sentences = {s for d in train for s in d if len(s) >= long_sentence}
  kept = [
    d
    for d in heldout
    if "\n".join(d) not in train_text
    and not any(s in train_sentences for s in d if len(s) >= long_sentence)
  ]
  return train, kept, len(heldout) - len(kept)


def _write_original(path: str, documents: list[list[str]]) -> None:
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    for doc in documents:
      f.write("\n".join(s.replace("\n", " ") for s in doc) + "\n\n")
  os.replace(path + ".tmp", path)


def prepare(
  out_dir: str,
  corpora: Iterable[str] = CORPORA,
  heldout_fraction: float = 0.05,
  max_documents: int = 0,
  vocab_size: int = 8000,
  dupe_factor: int = 3,
  max_eval_records: int = 2048,
  eval_batch_size: int = 64,
  seed: int = 12345,
) -> Data:
  """Splits, builds the vocabulary and writes the records under ``out_dir`` (see module
  docstring); ``max_documents`` > 0 keeps that many documents of each corpus (a quick run)."""
  corpora = list(corpora)
  for name in corpora:
    if name not in CORPORA:
      raise ValueError(f"--corpora: unknown corpus {name!r}; choose from {', '.join(CORPORA)}")
  settings = dict(
    corpora=corpora,
    heldout_fraction=heldout_fraction,
    max_documents=max_documents,
    vocab_size=vocab_size,
    dupe_factor=dupe_factor,
    max_eval_records=max_eval_records,
    eval_batch_size=eval_batch_size,
    seed=seed,
    split="text hash; held-out documents nested in the training side dropped",
  )
  marker = os.path.join(out_dir, "data.json")
  if os.path.exists(marker):
    with open(marker) as f:
      done = json.load(f)
    if done["settings"] != settings:
      raise ValueError(
        f"{marker} was made with other settings ({done['settings']}); use another --workdir"
      )
    return Data(**done["data"])

  os.makedirs(os.path.join(out_dir, "text", "train"), exist_ok=True)
  train_paths, heldout_docs = [], []
  counts = {"train": 0, "heldout": 0, "heldout_dropped": 0}
  for name in corpora:
    docs = iter_documents(name)
    if max_documents:
      docs = (d for i, d in zip(range(max_documents), docs))
    train, heldout, dropped = split_documents(docs, heldout_fraction)
    path = os.path.join(out_dir, "text", "train", f"{name}.txt")
    _write_original(path, train)
    train_paths.append(path)
    heldout_docs += heldout
    counts["train"] += len(train)
    counts["heldout"] += len(heldout)
    counts["heldout_dropped"] += dropped
  if not heldout_docs:
    raise ValueError(f"no held-out document at --heldout_fraction={heldout_fraction}")
  heldout_path = os.path.join(out_dir, "text", "heldout.txt")
  _write_original(heldout_path, heldout_docs)

  vocab_dir = os.path.join(out_dir, "vocab")
  vocab.build_vocabulary(train_paths, vocab_dir, vocab_size=vocab_size, overwrite=True)
  common = dict(
    tokenizer_path=vocab_dir,
    max_seq_lengths=(MAX_SEQ_LENGTH,),
    max_predictions_per_seq=(MAX_PREDICTIONS,),
    random_seed=seed,
  )
  records = {}
  for split, inputs, dupe in (
    ("train", train_paths, dupe_factor),
    ("heldout", [heldout_path], 1),
  ):
    out = os.path.join(out_dir, "records", split)
    config = generate.GenerationConfig(**common, dupe_factor=dupe)
    generate.generate(inputs, out, config, num_workers=1, overwrite=True, progress=False)
    records[split] = generate.output_pattern(out, MAX_SEQ_LENGTH, "train")
  train = read_records(records["train"])
  n_heldout = len(read_records(records["heldout"])["next_sentence_labels"])
  eval_records = min(n_heldout, max_eval_records) // eval_batch_size * eval_batch_size
  if eval_records == 0:
    raise ValueError(
      f"{n_heldout} held-out records, fewer than one evaluation batch of {eval_batch_size}: "
      "raise --heldout_fraction or use more documents"
    )
  data = Data(
    out_dir=out_dir,
    vocab_file=os.path.join(vocab_dir, "vocab.txt"),
    train_files=records["train"],
    heldout_files=records["heldout"],
    eval_records=eval_records,
    train_records=len(train["next_sentence_labels"]),
    real_tokens_per_record=float(train["input_mask"].sum(1).mean()),
    documents=counts,
  )
  with open(marker + ".tmp", "w") as f:
    json.dump(dict(settings=settings, data=dataclasses.asdict(data)), f, indent=1)
  os.replace(marker + ".tmp", marker)
  return data
