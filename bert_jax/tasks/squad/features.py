"""SQuAD examples -> fixed-length model inputs: sliding windows over the context.

As google-research/bert's run_squad.py: every whitespace word of the context is split into
word pieces; the question is cut to ``max_query_length`` pieces; the context pieces are covered
by windows ("doc spans") of at most ``max_seq_length - len(question) - 3`` pieces that start
``doc_stride`` pieces apart; each window becomes ``[CLS] question [SEP] window [SEP]`` (segment
0 then 1), zero-padded to ``max_seq_length``. A piece that lies in several windows is scored in
only one of them at prediction time: the one where it has the most context on both sides
(``min(left, right) + 0.01 * window length``). The gold span is first narrowed to the pieces of
the answer text ("improved answer span": "(1895-1943)." -> "1895"); a window that does not
contain the whole answer (and every window of an unanswerable question) points at [CLS] (0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax.tasks.squad.examples import SquadExample


class DocPieces:
  """A context's pieces and the maps between pieces and whitespace words, shared by its windows.

  Attributes:
    ids, pieces: the context's piece ids and strings, every word's pieces in order.
    piece_to_word: int32 [num_pieces], the word each piece belongs to.
    word_to_first_piece: per word, the index of its first piece.
  """

  def __init__(self, tokenizer: Any, doc_tokens: list[str]):
    ids_per_word = tokenizer.encode_batch(doc_tokens) if doc_tokens else []
    self.ids: list[int] = []
    piece_to_word: list[int] = []
    self.word_to_first_piece: list[int] = []
    for w, ids in enumerate(ids_per_word):
      self.word_to_first_piece.append(len(self.ids))
      self.ids.extend(ids)
      piece_to_word.extend([w] * len(ids))
    self.piece_to_word = np.asarray(piece_to_word, np.int32)
    self.pieces: list[str] = tokenizer.convert_ids_to_tokens(self.ids) if self.ids else []


@dataclasses.dataclass
class SquadFeature:
  """One window of one example; what post-processing needs besides the logits.

  The window's row is ``[CLS] question [SEP] context[span_start:span_start+span_length] [SEP]``;
  the context pieces sit at positions ``context_offset .. context_offset + span_length - 1``.

  Attributes:
    example_index: index of its example in the example list.
    doc_span_index: which window of that example (0, 1, ...).
    context_offset: the row position of the window's first context piece.
    span_start, span_length: the window's piece range in the context.
    max_context: bool [span_length]: whether this window is the one that scores each piece.
    doc: the context's pieces (shared by the example's windows and its paragraph's questions).
  """

  example_index: int
  doc_span_index: int
  context_offset: int
  span_start: int
  span_length: int
  max_context: np.ndarray
  doc: DocPieces = dataclasses.field(repr=False)

  def in_context(self, positions: np.ndarray) -> np.ndarray:
    """Whether row positions fall on the window's context pieces."""
    return (positions >= self.context_offset) & (positions < self.context_offset + self.span_length)

  def word_index(self, position: int) -> int:
    """The context word of a row position inside the context."""
    return int(self.doc.piece_to_word[self.span_start + position - self.context_offset])

  def pieces(self, start: int, end: int) -> list[str]:
    """The pieces at row positions start..end (inclusive, inside the context)."""
    first = self.span_start + start - self.context_offset
    return self.doc.pieces[first : first + end - start + 1]

  def token_to_orig(self, length: int) -> np.ndarray:
    """int32 [length]: per row position its context word, -1 outside the context."""
    out = np.full([length], -1, np.int32)
    out[self.context_offset : self.context_offset + self.span_length] = self.doc.piece_to_word[
      self.span_start : self.span_start + self.span_length
    ]
    return out


def doc_spans(num_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> list[tuple[int, int]]:
  """(start, length) windows covering ``num_tokens`` pieces, ``doc_stride`` apart."""
  if max_tokens_for_doc <= 0:
    raise ValueError(
      f"no room for the context: max_seq_length leaves {max_tokens_for_doc} "
      "pieces after the question and [CLS]/[SEP]; raise max_seq_length or lower "
      "max_query_length"
    )
  if doc_stride <= 0:
    raise ValueError(f"doc_stride must be positive, got {doc_stride}")
  spans = []
  start = 0
  while start < num_tokens:
    length = min(num_tokens - start, max_tokens_for_doc)
    spans.append((start, length))
    if start + length == num_tokens:
      break
    start += min(length, doc_stride)
  return spans


def improve_answer_span(
  doc_pieces: Sequence[str], start: int, end: int, answer_pieces: Sequence[str]
) -> tuple[int, int]:
  """The narrowest piece span inside [start, end] whose pieces are exactly the answer's."""
  target = " ".join(answer_pieces)
  for new_start in range(start, end + 1):
    for new_end in range(end, new_start - 1, -1):
      if " ".join(doc_pieces[new_start : new_end + 1]) == target:
        return new_start, new_end
  return start, end


def max_context_owner(spans: Sequence[tuple[int, int]], num_pieces: int) -> np.ndarray:
  """int [num_pieces]: for every piece the window that scores it (``is_max_context``, at once)."""
  scores = np.full([len(spans), num_pieces], -np.inf)
  for k, (start, length) in enumerate(spans):
    pos = np.arange(start, start + length)
    scores[k, start : start + length] = np.minimum(pos - start, start + length - 1 - pos) + (
      0.01 * length
    )
  return np.argmax(scores, axis=0)  # ties: the first window, as the strict ">" of the original


def convert_examples_to_features(
  examples: Sequence[SquadExample],
  tokenizer: Any,
  max_seq_length: int,
  doc_stride: int,
  max_query_length: int,
  stats: dict[str, int] | None = None,
) -> tuple[dict[str, np.ndarray], list[SquadFeature]]:
  """(arrays, features): model inputs and targets [N, ...] and per-window metadata.

  arrays: input_ids, input_mask, segment_ids (int32 [N, max_seq_length]); start_positions,
  end_positions (int32 [N]): the gold span where the window holds all of it, else 0 ([CLS]);
  filled whenever the gold span is known (at evaluation too, for checks). ``stats`` receives
  "features" and "query_truncated" (questions cut to max_query_length) counts.
  """
  stats = {} if stats is None else stats
  stats.setdefault("features", 0)
  stats.setdefault("query_truncated", 0)
  cache: dict[int, DocPieces] = {}
  query_ids_all = tokenizer.encode_batch([e.question_text for e in examples]) if examples else []
  answerable = [i for i, e in enumerate(examples) if not e.is_impossible and e.start_position >= 0]
  answer_pieces = dict(
    zip(
      answerable,
      tokenizer.tokenize_batch([examples[i].orig_answer_text for i in answerable])
      if answerable
      else [],
    )
  )
  rows: dict[str, list] = {k: [] for k in ("input_ids", "start_positions", "end_positions")}
  lengths: list[tuple[int, int]] = []  # (question + 2, real length) per row
  features: list[SquadFeature] = []
  for example_index, example in enumerate(examples):
    key = id(example.doc_tokens)
    if key not in cache:
      cache[key] = DocPieces(tokenizer, example.doc_tokens)
    doc = cache[key]
    query_ids = query_ids_all[example_index]
    if len(query_ids) > max_query_length:
      stats["query_truncated"] += 1
      query_ids = query_ids[:max_query_length]

    gold = None
    if example_index in answer_pieces:
      start = doc.word_to_first_piece[example.start_position]
      end = (
        doc.word_to_first_piece[example.end_position + 1] - 1
        if example.end_position + 1 < len(example.doc_tokens)
        else len(doc.ids) - 1
      )
      gold = improve_answer_span(doc.pieces, start, end, answer_pieces[example_index])

    spans = doc_spans(len(doc.ids), max_seq_length - len(query_ids) - 3, doc_stride)
    owner = max_context_owner(spans, len(doc.ids))
    prefix = [tokenizer.cls_id, *query_ids, tokenizer.sep_id]
    offset = len(prefix)
    for span_index, (span_start, span_length) in enumerate(spans):
      span_end = span_start + span_length - 1
      input_ids = prefix + doc.ids[span_start : span_end + 1] + [tokenizer.sep_id]
      start_position = end_position = 0
      if gold is not None and span_start <= gold[0] and gold[1] <= span_end:
        start_position, end_position = gold[0] - span_start + offset, gold[1] - span_start + offset
      rows["input_ids"].append(input_ids + [tokenizer.pad_id] * (max_seq_length - len(input_ids)))
      rows["start_positions"].append(start_position)
      rows["end_positions"].append(end_position)
      lengths.append((offset, len(input_ids)))
      features.append(
        SquadFeature(
          example_index,
          span_index,
          offset,
          span_start,
          span_length,
          owner[span_start : span_end + 1] == span_index,
          doc,
        )
      )
  n_rows = len(features)
  stats["features"] += n_rows
  input_ids = np.asarray(rows["input_ids"], np.int32).reshape(n_rows, max_seq_length)
  position = np.arange(max_seq_length)[None, :]
  offsets, real = (np.asarray(lengths, np.int32).reshape(n_rows, 2)[:, i : i + 1] for i in (0, 1))
  arrays = {
    "input_ids": input_ids,
    "input_mask": (position < real).astype(np.int32),
    "segment_ids": ((position >= offsets) & (position < real)).astype(np.int32),
    "start_positions": np.asarray(rows["start_positions"], np.int32).reshape(n_rows),
    "end_positions": np.asarray(rows["end_positions"], np.int32).reshape(n_rows),
  }
  return arrays, features
