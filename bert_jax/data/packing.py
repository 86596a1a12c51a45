"""Packing pre-training instances: several sequences per row, none seeing another.

  packed = PackedPretrainInput(instances, rows=32, max_seq_length=128, max_sequences_per_row=4,
                               max_predictions_per_row=80)
  batch = next(packed)            # rows of up to 4 instances each
  state = packed.get_state()      # {"inner": <instances' state>, "offset": int}

``instances`` is any resumable iterator of instance batches in google-research/bert's schema
(``pipeline.PretrainInput``, ``SyntheticPretrainInput``): input_ids / input_mask / segment_ids
[N, L0] (each instance a prefix of real tokens, [CLS] A [SEP] B [SEP], then zeros),
masked_lm_positions / masked_lm_ids / masked_lm_weights [N, P0], next_sentence_labels [N].
Masks are drawn there (static, dynamic or undone), so packing works on masked instances and
never changes a mask.

Greedy first fit within a batch, in the order the instances arrive: each instance goes at the
end of the first row of the batch where its real tokens, its predictions (masked_lm_weights > 0)
and one more sequence fit (``max_seq_length``, ``max_predictions_per_row``,
``max_sequences_per_row``), else into a new row; when it fits no row and the batch has its
``rows`` rows, the batch is done and the instance starts the next one. So a batch holds a
contiguous run of the stream, and a short instance fills a gap an earlier row left. Each packed
sequence keeps its own tokens, token types, masks and NSP label; its predictions' positions are
moved to where it sits in the row. (On the built-in corpus: 96% of the slots real at seq 128
in batches of 32 rows, 91% at seq 512 in batches of 8, where closing each row at the first
instance that does not fit it gave 87% and 79%; benchmarks/results/packing/README.md.)

Row features: input_ids, input_mask, segment_ids, position_ids (0, 1, ... within each
sequence), sequence_ids (0 padding, 1..S the sequence), [R, max_seq_length]; masked_lm_positions
(row positions), masked_lm_ids, masked_lm_weights [R, max_predictions_per_row]; cls_positions
(each sequence's first token; 0 where a row has fewer sequences), next_sentence_labels,
next_sentence_weights (1 for a real sequence, 0 otherwise) [R, max_sequences_per_row].

Position: ``{"inner": s, "offset": k}``: the instance iterator's state before the instance batch
being packed, and how many of that batch's instances are in rows already returned. Restoring
re-reads that instance batch from ``s`` (the same batch: the iterator is deterministic from its
state, dynamic masks included) and skips ``k``, so a resumed run packs exactly the same rows.
"""

from __future__ import annotations

import numpy as np

INSTANCE_KEYS = (
  "input_ids",
  "input_mask",
  "segment_ids",
  "masked_lm_positions",
  "masked_lm_ids",
  "masked_lm_weights",
  "next_sentence_labels",
)
ROW_KEYS = (
  "input_ids",
  "input_mask",
  "segment_ids",
  "position_ids",
  "sequence_ids",
  "masked_lm_positions",
  "masked_lm_ids",
  "masked_lm_weights",
  "cls_positions",
  "next_sentence_labels",
  "next_sentence_weights",
)


def empty_rows(rows: int, max_seq_length: int, sequences: int, predictions: int) -> dict:
  """All-padding packed rows (every feature zero)."""
  i32 = np.int32
  out = {k: np.zeros((rows, max_seq_length), i32) for k in ROW_KEYS[:5]}
  out["masked_lm_positions"] = np.zeros((rows, predictions), i32)
  out["masked_lm_ids"] = np.zeros((rows, predictions), i32)
  out["masked_lm_weights"] = np.zeros((rows, predictions), np.float32)
  out["cls_positions"] = np.zeros((rows, sequences), i32)
  out["next_sentence_labels"] = np.zeros((rows, sequences), i32)
  out["next_sentence_weights"] = np.zeros((rows, sequences), np.float32)
  return out


class PackedPretrainInput:
  """An endless, resumable iterator of packed rows (see the module docstring)."""

  def __init__(
    self,
    instances,
    rows: int,
    max_seq_length: int,
    max_sequences_per_row: int,
    max_predictions_per_row: int,
  ):
    if rows < 1 or max_sequences_per_row < 1 or max_predictions_per_row < 0:
      raise ValueError(
        f"packing needs rows >= 1, max_sequences_per_row >= 1, max_predictions_per_row >= 0; "
        f"got {rows}, {max_sequences_per_row}, {max_predictions_per_row}"
      )
    self.instances = instances
    self.rows = rows
    self.max_seq_length = max_seq_length
    self.max_sequences_per_row = max_sequences_per_row
    self.max_predictions_per_row = max_predictions_per_row
    self._chunk = None  # the instance batch being packed, as per-instance tuples
    self._chunk_state = instances.get_state()
    self._offset = 0
    self.sequences = 0  # instances packed into rows returned so far
    self.rows_returned = 0

  # -- state -------------------------------------------------------------------------------------
  def get_state(self) -> dict:
    """The position after the last batch returned (JSON-serialisable)."""
    return {"inner": self._chunk_state, "offset": self._offset}

  def set_state(self, state: dict) -> None:
    try:
      inner, offset = state["inner"], int(state["offset"])
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(
        f"packed input state must be {{'inner': <input state>, 'offset': int}}, got {state!r}"
      ) from e
    if offset < 0:
      raise ValueError(f"packed input state must have a non-negative offset, got {state!r}")
    self.instances.set_state(inner)
    self._chunk_state, self._offset, self._chunk = inner, offset, None

  # -- instances ---------------------------------------------------------------------------------
  def _load_chunk(self) -> None:
    """Reads the instance batch at ``_chunk_state`` and splits it into instances."""
    batch = next(self.instances)
    ids_NxL = np.asarray(batch["input_ids"])
    mask_NxL = np.asarray(batch["input_mask"]) > 0
    if np.any(mask_NxL[:, 1:] & ~mask_NxL[:, :-1]):
      raise ValueError(
        "an instance's input_mask has a real token after padding (packing needs "
        "each instance's tokens first, then zeros)"
      )
    lengths_N = mask_NxL.sum(axis=1)
    weights_NxP = np.asarray(batch["masked_lm_weights"])
    chunk = []
    for i in range(ids_NxL.shape[0]):
      n = int(lengths_N[i])
      (slots,) = np.nonzero(weights_NxP[i] > 0)
      chunk.append(
        (
          n,
          ids_NxL[i, :n],
          np.asarray(batch["segment_ids"][i, :n]),
          np.asarray(batch["masked_lm_positions"][i, slots]),
          np.asarray(batch["masked_lm_ids"][i, slots]),
          weights_NxP[i, slots],
          int(batch["next_sentence_labels"][i]),
        )
      )
    self._chunk = chunk

  def _peek(self):
    """The next instance not yet placed, reading the next instance batch when needed."""
    if self._chunk is None:
      self._load_chunk()
    while self._offset >= len(self._chunk):
      self._chunk_state = self.instances.get_state()
      self._offset = 0
      self._load_chunk()
    return self._chunk[self._offset]

  # -- rows --------------------------------------------------------------------------------------
  def __iter__(self):
    return self

  def __next__(self) -> dict:
    rows, length = self.rows, self.max_seq_length
    out = empty_rows(rows, length, self.max_sequences_per_row, self.max_predictions_per_row)
    used_R = np.zeros(rows, np.int64)  # tokens, predictions and sequences of each row so far
    preds_R = np.zeros(rows, np.int64)
    seqs_R = np.zeros(rows, np.int64)
    opened = 0
    while True:
      n, ids, segments, positions, labels, weights, nsp = self._peek()
      p = len(positions)
      if n > length or p > self.max_predictions_per_row:
        raise ValueError(
          f"an instance with {n} tokens and {p} predictions does not fit a packed row of "
          f"max_seq_length={length}, {self.max_predictions_per_row} predictions"
        )
      (fits,) = np.nonzero(
        (used_R[:opened] + n <= length)
        & (preds_R[:opened] + p <= self.max_predictions_per_row)
        & (seqs_R[:opened] < self.max_sequences_per_row)
      )
      if fits.size:
        r = int(fits[0])
      elif opened < rows:
        r, opened = opened, opened + 1
      else:
        break  # the batch is full: this instance starts the next one
      start, q, s = int(used_R[r]), int(preds_R[r]), int(seqs_R[r])
      span = slice(start, start + n)
      out["input_ids"][r, span] = ids
      out["input_mask"][r, span] = 1
      out["segment_ids"][r, span] = segments
      out["position_ids"][r, span] = np.arange(n)
      out["sequence_ids"][r, span] = s + 1
      out["masked_lm_positions"][r, q : q + p] = positions + start
      out["masked_lm_ids"][r, q : q + p] = labels
      out["masked_lm_weights"][r, q : q + p] = weights
      out["cls_positions"][r, s] = start
      out["next_sentence_labels"][r, s] = nsp
      out["next_sentence_weights"][r, s] = 1.0
      used_R[r], preds_R[r], seqs_R[r] = start + n, q + p, s + 1
      self._offset += 1
      self.sequences += 1
    self.rows_returned += rows
    return out
