"""Packing: several sequences in one row of ``max_seq_length``, none seeing another. One row
layout for every task, and the two ways of filling rows.

The packed-row layout (``RowLayout``; the same names, shapes and dtypes in pre-training and
fine-tuning). A packed batch of R rows of L tokens holding up to S sequences a row has, besides
the task's own arrays:

  input_mask        [R, L] int32    1 on every packed token
  position_ids      [R, L] int32    0, 1, ... restarting at each sequence's first token
  sequence_ids      [R, L] int32    0 padding, 1..S the sequence (its slot + 1): the model lets
                                    a token attend only to tokens of its own sequence
  cls_positions     [R, S] int32    each sequence's first token ([CLS]); 0 for an empty slot
  sequence_weights  [R, S] float32  1 for a real sequence, 0 for an empty slot: the weight of
                                    each per-sequence term (NSP, a GLUE label)

Token arrays (``input_ids``, ``segment_ids``, NER's labels) move with their tokens, [R, L];
per-sequence arrays (``next_sentence_labels``, GLUE's ``label``) sit at their sequence's slot,
[R, S, ...], 0 in empty slots. Pre-training adds its predictions, [R, P]: masked_lm_positions
(row positions), masked_lm_ids, masked_lm_weights. Packing happens after records are read, so
the TFRecord features keep google-research/bert's names.

Two algorithms, because the two inputs differ:

* ``PackedPretrainInput``: first fit over an endless stream, in arrival order (pre-training).
  A batch holds a contiguous run of the stream, so its resumable position is (the reader's
  position, instances used), and a packed run trains on the unpacked run's instances in the
  same order (the packing convergence comparison relies on it). Sorting would need a buffer
  and a position inside it.
* ``place_sequences`` / ``Packer``: best-fit decreasing over a known set of rows (one
  fine-tuning step's rows, or a whole evaluation split). The set is fixed, so its order can be
  chosen: longest first gives fewer packed rows, and the step's loss is the unpacked loss over
  exactly those rows whatever their placement.

First fit over a stream
-----------------------

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

Rows (``PRETRAIN_ROW_KEYS``): the layout's fields, input_ids and segment_ids [R, L], the
predictions [R, max_predictions_per_row] and next_sentence_labels [R, max_sequences_per_row].

Position: ``{"inner": s, "offset": k}``: the instance iterator's state before the instance batch
being packed, and how many of that batch's instances are in rows already returned. Restoring
re-reads that instance batch from ``s`` (the same batch: the iterator is deterministic from its
state, dynamic masks included) and skips ``k``, so a resumed run packs exactly the same rows.

Best fit over a set of rows
---------------------------

  packer = Packer(row_length=128, max_sequences=4, token_keys=("input_ids", "segment_ids"))
  placement = packer.place(packer.lengths(arrays))        # where each row's sequence goes
  batch = packer.pack(arrays, idx, placement, num_rows)   # rows idx of a split, packed
  outputs = packer.unpack(packed_outputs, placement, token_outputs)   # back per sequence

Each input row is one sequence ``[CLS] ... [SEP]`` padded to ``row_length`` (its ``input_mask``
1 on a prefix). ``place_sequences``: the longest first (ties in input order), each into the
row with the least room that still holds it and has a free slot, else into a new row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import numpy as np

# --- the packed-row layout ---------------------------------------------------------------------
INPUT_MASK = "input_mask"
POSITION_IDS = "position_ids"
SEQUENCE_IDS = "sequence_ids"
CLS_POSITIONS = "cls_positions"
SEQUENCE_WEIGHTS = "sequence_weights"
# What the model reads of a packed row beyond the unpacked inputs.
MODEL_KEYS = (POSITION_IDS, SEQUENCE_IDS, CLS_POSITIONS)


@dataclasses.dataclass(frozen=True)
class RowLayout:
  """The fields every packed row has (see the module docstring): rows of ``row_length``
  tokens, up to ``max_sequences`` sequences each. Both packers make their rows from
  ``zeros`` and ``put``, so pre-training and fine-tuning rows cannot drift apart."""

  row_length: int
  max_sequences: int

  TOKEN_FIELDS = (INPUT_MASK, POSITION_IDS, SEQUENCE_IDS)  # [R, row_length]
  SEQUENCE_FIELDS = (CLS_POSITIONS, SEQUENCE_WEIGHTS)  # [R, max_sequences]
  DTYPES = {
    INPUT_MASK: np.int32,
    POSITION_IDS: np.int32,
    SEQUENCE_IDS: np.int32,
    CLS_POSITIONS: np.int32,
    SEQUENCE_WEIGHTS: np.float32,
  }

  def shapes(self, rows: int) -> dict[str, tuple[int, int]]:
    """Each field's shape in a batch of ``rows`` packed rows."""
    out = {k: (rows, self.row_length) for k in self.TOKEN_FIELDS}
    out.update({k: (rows, self.max_sequences) for k in self.SEQUENCE_FIELDS})
    return out

  def zeros(self, rows: int) -> dict[str, np.ndarray]:
    """``rows`` empty rows: every field zero."""
    return {k: np.zeros(shape, self.DTYPES[k]) for k, shape in self.shapes(rows).items()}

  def spec(self, rows: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The fields' shapes and dtypes in a batch of ``rows`` rows (for abstract batches)."""
    return {k: jax.ShapeDtypeStruct(s, self.DTYPES[k]) for k, s in self.shapes(rows).items()}

  @staticmethod
  def put(out: dict[str, np.ndarray], row: int, slot: int, start: int, length: int) -> None:
    """Marks the ``length`` tokens from ``start`` of row ``row`` as the sequence of ``slot``."""
    span = slice(start, start + length)
    out[INPUT_MASK][row, span] = 1
    out[POSITION_IDS][row, span] = np.arange(length)
    out[SEQUENCE_IDS][row, span] = slot + 1
    out[CLS_POSITIONS][row, slot] = start
    out[SEQUENCE_WEIGHTS][row, slot] = 1.0


# --- first fit over a stream (pre-training) ------------------------------------------------------
INSTANCE_KEYS = (
  "input_ids",
  "input_mask",
  "segment_ids",
  "masked_lm_positions",
  "masked_lm_ids",
  "masked_lm_weights",
  "next_sentence_labels",
)
PRETRAIN_ROW_KEYS = (
  "input_ids",
  INPUT_MASK,
  "segment_ids",
  POSITION_IDS,
  SEQUENCE_IDS,
  "masked_lm_positions",
  "masked_lm_ids",
  "masked_lm_weights",
  CLS_POSITIONS,
  "next_sentence_labels",
  SEQUENCE_WEIGHTS,
)


def empty_rows(rows: int, max_seq_length: int, sequences: int, predictions: int) -> dict:
  """All-padding packed pre-training rows (every feature zero), in ``PRETRAIN_ROW_KEYS``' order."""
  i32 = np.int32
  out = RowLayout(max_seq_length, sequences).zeros(rows)
  out["input_ids"] = np.zeros((rows, max_seq_length), i32)
  out["segment_ids"] = np.zeros((rows, max_seq_length), i32)
  out["masked_lm_positions"] = np.zeros((rows, predictions), i32)
  out["masked_lm_ids"] = np.zeros((rows, predictions), i32)
  out["masked_lm_weights"] = np.zeros((rows, predictions), np.float32)
  out["next_sentence_labels"] = np.zeros((rows, sequences), i32)
  return {k: out[k] for k in PRETRAIN_ROW_KEYS}


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
      out["segment_ids"][r, span] = segments
      RowLayout.put(out, r, s, start, n)
      out["masked_lm_positions"][r, q : q + p] = positions + start
      out["masked_lm_ids"][r, q : q + p] = labels
      out["masked_lm_weights"][r, q : q + p] = weights
      out["next_sentence_labels"][r, s] = nsp
      used_R[r], preds_R[r], seqs_R[r] = start + n, q + p, s + 1
      self._offset += 1
      self.sequences += 1
    self.rows_returned += rows
    return out


# --- best fit over a set of rows (fine-tuning) ---------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Placement:
  """Where each packed sequence goes: its row, slot (0..S-1) and first position in that row."""

  row_N: np.ndarray
  slot_N: np.ndarray
  offset_N: np.ndarray
  length_N: np.ndarray
  num_rows: int


def place_sequences(length_N: np.ndarray, row_length: int, max_sequences: int) -> Placement:
  """Best-fit decreasing: the longest sequence first (ties in input order), each into the row
  with the least room that still holds it and has a free slot, else a new row. Deterministic:
  the same lengths in the same order always give the same placement."""
  length_N = np.asarray(length_N, np.int64)
  n = length_N.size
  if n and (length_N.min() < 1 or length_N.max() > row_length):
    raise ValueError(
      f"a sequence of {int(length_N.max() if length_N.max() > row_length else length_N.min())}"
      f" tokens cannot be packed into rows of config.max_seq_length={row_length}"
    )
  row_N, slot_N, offset_N = (np.zeros(n, np.int64) for _ in range(3))
  # by_room[c]: rows with exactly c positions left and a free slot (last opened on top).
  by_room: list[list[int]] = [[] for _ in range(row_length + 1)]
  used_R: list[int] = []  # positions used per row
  count_R: list[int] = []  # sequences per row
  for i in np.argsort(-length_N, kind="stable"):
    need = int(length_N[i])
    room = next((c for c in range(need, row_length + 1) if by_room[c]), None)
    if room is None:
      r = len(used_R)
      used_R.append(0), count_R.append(0)
    else:
      r = by_room[room].pop()
    row_N[i], slot_N[i], offset_N[i] = r, count_R[r], used_R[r]
    used_R[r] += need
    count_R[r] += 1
    if count_R[r] < max_sequences and used_R[r] < row_length:
      by_room[row_length - used_R[r]].append(r)
  return Placement(row_N, slot_N, offset_N, length_N, len(used_R))


@dataclasses.dataclass(frozen=True)
class Packer:
  """Packs rows of a split, each one sequence ``[CLS] ... [SEP]`` padded to ``row_length``,
  several to a row, best fit (``place_sequences``).

  A packed batch of R rows holds the layout's fields (``RowLayout``), the arrays of
  ``token_keys`` (input ids, token types, NER's per-token labels and weights) moved with their
  tokens, and every other array of the split (per sequence: GLUE's ``label``) as [R, S, ...],
  0 in empty slots.
  """

  row_length: int
  max_sequences: int
  token_keys: tuple[str, ...]

  @property
  def layout(self) -> RowLayout:
    return RowLayout(self.row_length, self.max_sequences)

  def lengths(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """Each row's sequence length (its ``input_mask`` is 1 on a prefix)."""
    return arrays[INPUT_MASK].sum(axis=1).astype(np.int64)

  def place(self, length_N: np.ndarray) -> Placement:
    return place_sequences(length_N, self.row_length, self.max_sequences)

  def pack(
    self, arrays: Mapping[str, np.ndarray], idx: np.ndarray, placement: Placement, num_rows: int
  ) -> dict[str, np.ndarray]:
    """Rows ``idx`` of ``arrays`` (placed by ``placement``, in idx's order) as ``num_rows``
    packed rows (rows past ``placement.num_rows`` stay empty)."""
    R, L, S = num_rows, self.row_length, self.max_sequences
    if placement.num_rows > R:
      raise ValueError(f"{placement.num_rows} packed rows do not fit a batch of {R}")
    fields = self.layout.zeros(R)
    out = {INPUT_MASK: fields[INPUT_MASK]}
    for k in self.token_keys:
      out[k] = np.zeros((R, L), arrays[k].dtype)
    out.update(fields)
    per_sequence = [k for k in arrays if k != INPUT_MASK and k not in self.token_keys]
    for k in per_sequence:
      out[k] = np.zeros((R, S) + arrays[k].shape[1:], arrays[k].dtype)
    r_N, s_N, o_N, n_N = placement.row_N, placement.slot_N, placement.offset_N, placement.length_N
    for j, i in enumerate(idx):
      r, s, o, n = int(r_N[j]), int(s_N[j]), int(o_N[j]), int(n_N[j])
      for k in self.token_keys:
        out[k][r, o : o + n] = arrays[k][i, :n]
      RowLayout.put(out, r, s, o, n)
    if len(idx):
      rows, slots = r_N[: len(idx)], s_N[: len(idx)]
      for k in per_sequence:
        out[k][rows, slots] = arrays[k][idx]
    return out

  def unpack(
    self, outputs: Mapping[str, np.ndarray], placement: Placement, token_outputs: Mapping[str, int]
  ) -> dict[str, np.ndarray]:
    """Per-sequence outputs (in the placed order) from packed ones: the keys of
    ``token_outputs`` (a length axis 1, e.g. NER's label ids) are cut from each sequence's
    positions back to [N, row_length] (padded like ``LengthBucketer.pad``); the rest are
    [R, S, ...] and taken at each sequence's slot."""
    result = {}
    r_N, s_N, o_N, n_N = placement.row_N, placement.slot_N, placement.offset_N, placement.length_N
    for key, x in outputs.items():
      if key in token_outputs:
        fill = np.finfo(x.dtype).min if np.issubdtype(x.dtype, np.floating) else 0
        y = np.full((len(r_N), self.row_length) + x.shape[2:], fill, x.dtype)
        for j in range(len(r_N)):
          r, o, n = int(r_N[j]), int(o_N[j]), int(n_N[j])
          y[j, :n] = x[r, o : o + n]
        result[key] = y
      else:
        result[key] = x[r_N, s_N]
    return result

  def batch_spec(self, spec: Mapping[str, jax.ShapeDtypeStruct]) -> dict:
    """A packed batch's shapes from the unpacked ``spec`` of the same number of rows."""
    out = {}
    for k, v in spec.items():
      if k == INPUT_MASK or k in self.token_keys:
        out[k] = v
      else:  # one per sequence slot
        out[k] = jax.ShapeDtypeStruct((v.shape[0], self.max_sequences) + v.shape[1:], v.dtype)
    rows, length = spec[INPUT_MASK].shape[:2]
    fields = RowLayout(length, self.max_sequences).spec(rows)
    out.update({k: v for k, v in fields.items() if k != INPUT_MASK})
    return out
