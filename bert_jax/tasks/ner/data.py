"""CoNLL-format tagged files and their packing into BERT token-classification rows.

File format: one token per line, its tag in the last whitespace-separated field (so
``word TAG`` and CoNLL-2003's ``word POS chunk TAG`` both work), a blank line between
sentences, ``-DOCSTART-`` lines ignored. Tags are ``O`` or ``<B|I|E|S>-<type>`` (IOB1, IOB2 or
IOBES). The file is UTF-8 text: anything else (a binary or gzipped file) is an error naming the
file and the line of the first undecodable byte. A line with a single field (no tag) or a
malformed tag is an error naming the file and line, unless ``skip_malformed`` (the NER task's
``config.skip_malformed_lines``; then it is dropped and counted; the shared
ner_sci/bert_paper.bio has one such line, ``A;`` at line 8880). A file with no sentence (empty,
blank lines or ``-DOCSTART-`` only, or every line skipped) is an error naming it: every split
read is trained on or evaluated.

Packing: each word is split into WordPiece/SentencePiece pieces and labelled on its first piece
(the other pieces get weight 0 in the loss and are not predicted), as in the paper (section
5.3). A sentence whose pieces do not fit ``max_seq_length - 2`` is split, between words, into as
many rows as needed (``stats["sentences_split"]``), so no word is lost; a single word with more
pieces than fit keeps its first pieces (``stats["words_truncated"]``).
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

_TAG = re.compile(r"^(O|[BIES]-\S+)$")


class ConllInputError(ValueError):
  """Bad CoNLL input; the message names the file and line."""


@dataclasses.dataclass
class Sentence:
  words: list[str]
  tags: list[str]
  lines: list[int]  # 1-based line number of each token, for error messages
  path: str


# What a malformed-line error advises: the NER task's key (configs/ner.py) that skips such lines.
SKIP_ADVICE = "fix the file or set config.skip_malformed_lines=True to skip (and count) such lines"


def read_conll(
  path: str,
  skip_malformed: bool = False,
  stats: dict | None = None,
  advice: str = SKIP_ADVICE,
) -> list[Sentence]:
  """Sentences of a CoNLL-format file (see the module docstring).

  With ``skip_malformed`` a line without a tag or with a malformed tag is dropped (the
  sentence keeps its other tokens) and counted in ``stats["skipped_lines"]``. ``advice`` ends
  the error for such a line: the default names the NER task's ``config.skip_malformed_lines``; a
  caller whose config has no such key passes its own.
  """
  stats = {} if stats is None else stats
  stats.setdefault("skipped_lines", 0)
  if os.path.isdir(path):
    raise IsADirectoryError(f"{path} is a directory, not a CoNLL file")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"CoNLL file not found: {path}")
  sentences, words, tags, lines = [], [], [], []

  def flush():
    if words:
      sentences.append(Sentence(list(words), list(tags), list(lines), path))
    words.clear(), tags.clear(), lines.clear()

  for line_no, line in enumerate(_text_lines(path), start=1):
    fields = line.split()
    if not fields:
      flush()
      continue
    if fields[0] == "-DOCSTART-":
      flush()
      continue
    problem = None
    if len(fields) < 2:
      problem = f"token {fields[0]!r} has no tag (expected 'word TAG')"
    elif not _TAG.match(fields[-1]):
      problem = f"malformed tag {fields[-1]!r} (expected O or B-/I-/E-/S-<type>)"
    if problem:
      if skip_malformed:
        stats["skipped_lines"] += 1
        continue
      raise ConllInputError(f"{path}:{line_no}: {problem}; {advice}")
    words.append(fields[0])
    tags.append(fields[-1])
    lines.append(line_no)
  flush()
  if not sentences:
    skipped = stats["skipped_lines"]
    why = f" ({skipped} malformed line(s) skipped)" if skipped else ""
    raise ConllInputError(
      f"{path}: no sentences{why}; expected one 'word TAG' line per token, a blank line "
      "between sentences"
    )
  return sentences


def _text_lines(path: str) -> io.StringIO:
  """The lines of a UTF-8 file (universal newlines, as ``open`` in text mode reads them); bytes
  that are not UTF-8 are an error naming the file and the line they are on."""
  with open(path, "rb") as f:
    data = f.read()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise ConllInputError(
      f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x}); a CoNLL file is UTF-8 text, "
      "one 'word TAG' line per token (a binary or compressed file?)"
    ) from None
  return io.StringIO(text, newline=None)


def label_list(sentences: Sequence[Sentence], extra: Sequence[str] = ()) -> list[str]:
  """Sorted labels seen (plus ``extra``), "O" first."""
  seen = {t for s in sentences for t in s.tags} | set(extra)
  return ["O"] + sorted(seen - {"O"})


def check_labels(sentences: Sequence[Sentence], labels: Sequence[str]) -> None:
  known = set(labels)
  for s in sentences:
    for tag, line in zip(s.tags, s.lines):
      if tag not in known:
        raise ConllInputError(
          f"{s.path}:{line}: tag {tag!r} is not among the task's labels "
          f"{list(labels)} (set config.labels to include it)"
        )


def split_sentences(sentences: Sequence[Sentence], fraction: float, seed: int):
  """(train, held_out): a seeded random ``fraction`` of the sentences held out as dev."""
  if not 0 < fraction < 1:
    raise ValueError(f"config.dev_fraction must be in (0, 1), got {fraction}")
  if len(sentences) < 2:
    raise ValueError(
      "config.dev_fraction needs at least 2 sentences to hold one out, the file has "
      f"{len(sentences)}{' (' + sentences[0].path + ')' if sentences else ''}"
    )
  order = np.random.default_rng(seed).permutation(len(sentences))
  n_dev = max(1, int(round(fraction * len(sentences))))
  dev = set(order[:n_dev].tolist())
  return (
    [s for i, s in enumerate(sentences) if i not in dev],
    [s for i, s in enumerate(sentences) if i in dev],
  )


@dataclasses.dataclass
class Row:
  sentence: int  # index of the sentence in the split
  first_word: int  # index of the row's first word in that sentence
  positions: list[int]  # token position of each of the row's words' first piece


def pack_sentences(
  tokenizer: Any, sentences: Sequence[Sentence], labels: Sequence[str], max_seq_length: int
) -> tuple[dict[str, np.ndarray], list[Row], dict]:
  """Rows [N, L] (input_ids, input_mask, segment_ids, label_ids, label_weights) and their map."""
  if max_seq_length < 3:
    raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
  label_index = {l: i for i, l in enumerate(labels)}
  room = max_seq_length - 2
  unk = tokenizer.unk_id
  rows_ids, rows_lab, rows = [], [], []
  n_split = n_trunc = 0
  for si, s in enumerate(sentences):
    pieces = [p if p else [unk] for p in tokenizer.encode_batch(s.words)] if s.words else []
    start = 0
    while start < len(s.words) or (start == 0 and not s.words):
      ids, labs, pos = [tokenizer.cls_id], [-1], []
      w = start
      while w < len(s.words):
        p = pieces[w]
        if len(p) > room:
          n_trunc += 1
          p = p[:room]
        if len(ids) - 1 + len(p) > room:
          break
        pos.append(len(ids))
        ids += p
        labs += [label_index.get(s.tags[w], 0)] + [-1] * (len(p) - 1)
        w += 1
      ids.append(tokenizer.sep_id)
      labs.append(-1)
      rows_ids.append(ids), rows_lab.append(labs), rows.append(Row(si, start, pos))
      if w < len(s.words) and start == 0:
        n_split += 1
      if w == start:  # empty sentence
        break
      start = w
  n, L = len(rows), max_seq_length
  arrays = {
    "input_ids": np.full((n, L), tokenizer.pad_id, np.int32),
    "input_mask": np.zeros((n, L), np.int32),
    "segment_ids": np.zeros((n, L), np.int32),
    "label_ids": np.zeros((n, L), np.int32),
    "label_weights": np.zeros((n, L), np.float32),
  }
  for i, (ids, labs) in enumerate(zip(rows_ids, rows_lab)):
    k = len(ids)
    arrays["input_ids"][i, :k] = ids
    arrays["input_mask"][i, :k] = 1
    lab = np.asarray(labs)
    arrays["label_ids"][i, :k] = np.maximum(lab, 0)
    arrays["label_weights"][i, :k] = lab >= 0
  return arrays, rows, {"sentences_split": n_split, "words_truncated": n_trunc}


def unpack_predictions(
  pred_ids_NxL: np.ndarray,
  rows: Sequence[Row],
  sentences: Sequence[Sentence],
  labels: Sequence[str],
) -> list[list[str]]:
  """Predicted tags per word of every sentence, from the rows' argmax label ids."""
  out = [["O"] * len(s.words) for s in sentences]
  for r, row in enumerate(rows):
    for j, p in enumerate(row.positions):
      out[row.sentence][row.first_word + j] = labels[int(pred_ids_NxL[r, p])]
  return out
