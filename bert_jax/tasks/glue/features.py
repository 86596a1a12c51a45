"""Packing one text or a text pair into BERT inputs: ``[CLS] A [SEP] (B [SEP])``.

As google-research/bert's run_classifier.py: a pair longer than ``max_seq_length - 3`` tokens
is cut one token at a time from the end of whichever text is longer at that moment (a single
text longer than ``max_seq_length - 2`` loses its end). Inputs are padded with the tokenizer's
pad id; ``segment_ids`` are 0 for [CLS] A [SEP] and 1 for B [SEP]. Shared by GLUE and SWAG.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def truncate_seq_pair(a: list[int], b: list[int], max_length: int) -> bool:
  """Trim ``a`` and ``b`` in place to ``max_length`` tokens in all; True when anything was cut."""
  cut = False
  while len(a) + len(b) > max_length:
    (a if len(a) > len(b) else b).pop()
    cut = True
  return cut


def pack(
  tokenizer: Any, a_ids: Sequence[int], b_ids: Sequence[int] | None, max_seq_length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
  """(input_ids, input_mask, segment_ids) each [max_seq_length] int32, and whether it was cut."""
  a, b = list(a_ids), (None if b_ids is None else list(b_ids))
  if b is None:
    cut = len(a) > max_seq_length - 2
    a = a[: max_seq_length - 2]
    ids = [tokenizer.cls_id] + a + [tokenizer.sep_id]
    segs = [0] * len(ids)
  else:
    cut = truncate_seq_pair(a, b, max_seq_length - 3)
    ids = [tokenizer.cls_id] + a + [tokenizer.sep_id] + b + [tokenizer.sep_id]
    segs = [0] * (len(a) + 2) + [1] * (len(b) + 1)
  n = len(ids)
  input_ids = np.full(max_seq_length, tokenizer.pad_id, np.int32)
  input_ids[:n] = ids
  input_mask = np.zeros(max_seq_length, np.int32)
  input_mask[:n] = 1
  segment_ids = np.zeros(max_seq_length, np.int32)
  segment_ids[:n] = segs
  return input_ids, input_mask, segment_ids, cut


def encode_texts(
  tokenizer: Any, texts_a: Sequence[str], texts_b: Sequence[str] | None, max_seq_length: int
) -> tuple[dict[str, np.ndarray], int]:
  """Pack many texts (pairs when ``texts_b`` is given): arrays [N, L] and the number cut."""
  if max_seq_length < 3:
    raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
  ids_a = tokenizer.encode_batch(list(texts_a))
  ids_b = tokenizer.encode_batch(list(texts_b)) if texts_b is not None else [None] * len(ids_a)
  rows = [pack(tokenizer, a, b, max_seq_length) for a, b in zip(ids_a, ids_b)]
  empty = np.zeros((0, max_seq_length), np.int32)
  arrays = {
    key: np.stack([r[i] for r in rows]) if rows else empty
    for i, key in enumerate(("input_ids", "input_mask", "segment_ids"))
  }
  return arrays, sum(r[3] for r in rows)
