"""One packed-row layout for every task (bert_jax.data.packing.RowLayout): pre-training's packed
rows (first fit over a stream) and fine-tuning's (best fit over a step's rows) have the same
fields with the same shapes, dtypes and meaning, and the abstract batches each task declares
for packed runs agree with it."""

import numpy as np

from bert_jax.data.packing import (
  CLS_POSITIONS,
  INPUT_MASK,
  POSITION_IDS,
  SEQUENCE_IDS,
  SEQUENCE_WEIGHTS,
  PackedPretrainInput,
  Packer,
  RowLayout,
)
from bert_jax.tasks.pretraining.synthetic_input import SyntheticPretrainInput

R, L, S = 4, 64, 4


def _pretraining_rows():
  """Packed pre-training rows of synthetic instances of 8..32 tokens."""
  instances = SyntheticPretrainInput(16, 32, 5, 100, seed=3, min_length=8)
  return next(PackedPretrainInput(instances, R, L, S, 16))


def _finetuning_rows():
  """GLUE-like rows (one [CLS] A [SEP] B [SEP] each, a label per row) packed best fit."""
  rng = np.random.default_rng(0)
  n = 9
  length_N = rng.integers(5, 30, n)
  real_NxL = np.arange(L) < length_N[:, None]
  arrays = {
    "input_ids": (rng.integers(5, 100, (n, L)) * real_NxL).astype(np.int32),
    INPUT_MASK: real_NxL.astype(np.int32),
    "segment_ids": (rng.integers(0, 2, (n, L)) * real_NxL).astype(np.int32),
    "label": rng.integers(0, 3, n).astype(np.int32),
  }
  packer = Packer(L, S, ("input_ids", "segment_ids"))
  placement = packer.place(packer.lengths(arrays))
  assert placement.num_rows <= R
  return packer.pack(arrays, np.arange(n), placement, R)


def _check_layout_meaning(rows):
  """The fields say the same thing in any packed batch: the mask is the tokens of some
  sequence, positions restart at each sequence's [CLS], the weights mark the used slots."""
  seq_RxL = rows[SEQUENCE_IDS]
  np.testing.assert_array_equal(rows[INPUT_MASK], (seq_RxL > 0).astype(np.int32))
  for r in range(seq_RxL.shape[0]):
    count = int(seq_RxL[r].max())
    np.testing.assert_array_equal(rows[SEQUENCE_WEIGHTS][r], np.arange(S) < count)
    for s in range(1, count + 1):
      (where,) = np.nonzero(seq_RxL[r] == s)
      assert rows[CLS_POSITIONS][r, s - 1] == where[0]
      np.testing.assert_array_equal(rows[POSITION_IDS][r, where], np.arange(len(where)))


def test_pretraining_and_finetuning_rows_share_the_layout():
  layout = RowLayout(L, S)
  pre, fine = _pretraining_rows(), _finetuning_rows()
  for rows in (pre, fine):
    for key, shape in layout.shapes(R).items():
      assert rows[key].shape == shape, key
      assert rows[key].dtype == RowLayout.DTYPES[key], key
    _check_layout_meaning(rows)
  common = set(pre) & set(fine)
  assert common == set(layout.shapes(R)) | {"input_ids", "segment_ids"}
  for key in common:
    assert (pre[key].shape, pre[key].dtype) == (fine[key].shape, fine[key].dtype), key
  # Per-sequence targets sit at their sequence's slot in both: NSP labels and GLUE labels.
  assert pre["next_sentence_labels"].shape == fine["label"].shape == (R, S)
  # Not vacuous: both batches hold several sequences a row.
  assert pre[SEQUENCE_WEIGHTS].sum() > R and fine[SEQUENCE_WEIGHTS].sum() > R


def test_packed_batch_specs_follow_the_layout():
  """The abstract packed batches (compiled before any data is read) have the layout's fields:
  fine-tuning's from Packer.batch_spec, pre-training's from its task's batch_spec, and the
  pre-training input passes all of them on (batch_keys)."""
  import jax

  from bert_jax.runs.pretraining.runner import batch_spec
  from bert_jax.tasks.pretraining.data import batch_keys

  want = {k: (v.shape, v.dtype) for k, v in RowLayout(L, S).spec(R).items()}
  unpacked = {
    "input_ids": jax.ShapeDtypeStruct((R, L), np.int32),
    INPUT_MASK: jax.ShapeDtypeStruct((R, L), np.int32),
    "segment_ids": jax.ShapeDtypeStruct((R, L), np.int32),
    "label": jax.ShapeDtypeStruct((R,), np.int32),
  }
  fine = Packer(L, S, ("input_ids", "segment_ids")).batch_spec(unpacked)
  pre = batch_spec(R, L, 16, "mlm_nsp", sequences=S)
  for spec in (fine, pre):
    assert {k: (spec[k].shape, spec[k].dtype) for k in want} == want
  assert set(want) <= set(batch_keys("mlm_nsp", packed=True))
  for objective in ("mlm", "ltr"):  # no per-sequence head: the token fields only
    keys = set(batch_keys(objective, packed=True))
    assert set(RowLayout.TOKEN_FIELDS) <= keys and not keys & set(RowLayout.SEQUENCE_FIELDS)
