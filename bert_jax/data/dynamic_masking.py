"""Dynamic masking: a fresh mask each time an example is read (RoBERTa-style), with the same rule
as the static masking of `masking.py` (see its docstring for the procedure), including its
`MaskRates` (what a chosen position becomes).

NumPy on whole batches ([B, L] arrays): a few dozen vector ops per batch, no Python per example.
The reader (`pipeline.PretrainInput`) parses batches in tf.data and masks each batch it hands
out with this, in the consumer's thread. Not in tf.data: `tf.math.top_k` and `tf.argsort` cost
~12 and ~20 µs per row of 512 on a CPU, NumPy's SIMD sort ~0.3, and NumPy called from a tf.data
map (`tf.numpy_function`) deadlocks when an iterator is dropped with such a call in flight (the
dropping thread holds the GIL the call waits for).

The random numbers of a batch come from one seed (the pipeline's: seed, host, and the epoch and
number of the batch's first example), so a resumed run (which restarts at a batch boundary with
the same batch size) draws exactly the masks it would have drawn. They are drawn first (`draw`),
then `apply` is a deterministic function of them: per row, the candidates (tokens, or whole words
scored by their first piece) are visited in the order of independent uniform scores, i.e. a
uniformly random order (ties: the lower position first), and taken while they fit, as
google-research/bert does with its shuffled candidate list; what each chosen position becomes is
drawn per prediction slot (the chosen positions in increasing order). Statically masked records
(any original-format file) are first restored to their original tokens from
`masked_lm_positions`/`masked_lm_ids`, so dynamic masking works on every file of the schema.
"""

import numpy as np

from bert_jax.data import masking

_MASKED_KEYS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")


def restore_static_masks(features: dict) -> np.ndarray:
  """input_ids [B, L] of a batch with its static masks undone (the original tokens)."""
  ids_BxL = np.array(features["input_ids"])
  rows_N, slots_N = np.nonzero(features["masked_lm_weights"] > 0)
  positions_N = features["masked_lm_positions"][rows_N, slots_N]
  outside_N = (positions_N < 0) | (positions_N >= ids_BxL.shape[1])
  if outside_N.any():
    i = int(np.argmax(outside_N))
    raise ValueError(
      f"masked_lm_positions holds {int(positions_N[i])} (row {int(rows_N[i])} of the batch, slot "
      f"{int(slots_N[i])}), outside [0, {ids_BxL.shape[1]}): not a position of the sequence"
    )
  ids_BxL[rows_N, positions_N] = features["masked_lm_ids"][rows_N, slots_N]
  return ids_BxL


def unmask(features: dict) -> dict:
  """A batch as original text: static masks undone, masked_lm_* all zero."""
  out = dict(features)
  out["input_ids"] = restore_static_masks(features)
  for key in _MASKED_KEYS:
    out[key] = np.zeros_like(features[key])
  return out


class DynamicMasker:
  """Callable on a batch (NumPy int32 / float32 arrays, [B, L] and [B, P]) plus a seed."""

  def __init__(
    self,
    spec: masking.MaskingSpec,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    whole_word_mask: bool,
    rates: masking.MaskRates = masking.MaskRates(),
  ):
    self.spec = spec
    self.rates = masking.MaskRates.parse(rates)
    self.masked_lm_prob = masked_lm_prob
    self.max_predictions_per_seq = max_predictions_per_seq
    self.whole_word_mask = whole_word_mask
    self._continuation_V = np.asarray(spec.continuation_V, bool)
    self._replacement_R = np.asarray(spec.replacement_ids, np.int32)

  def draw(self, shape_2, seed) -> dict:
    """The random numbers of one batch of `shape_2` = (B, L), from `seed` (an int or a sequence
    of non-negative ints): score [B, L] (the order of the candidates), and per prediction slot
    [B, P] r1 and r2 (what the position becomes) and replacement (its random token)."""
    rng = np.random.default_rng(seed)
    slots_2 = (shape_2[0], self.max_predictions_per_seq)
    return {
      "score": rng.random(tuple(shape_2), np.float32),
      "r1": rng.random(slots_2, np.float32),
      "r2": rng.random(slots_2, np.float32),
      "replacement": self._replacement_R[rng.integers(0, len(self._replacement_R), slots_2)],
    }

  def _select_words(self, ids_BxL, valid_BxL, budget_B, score_BxL):
    """Boolean [B, L]: the positions of the whole words chosen (in the order of increasing
    score, each taken while it fits). A word's score is its first piece's."""
    rows, length = ids_BxL.shape
    prev_valid_BxL = np.pad(valid_BxL[:, :-1], ((0, 0), (1, 0)))
    word_start_BxL = valid_BxL & (~self._continuation_V[ids_BxL] | ~prev_valid_BxL)
    # Word w of a row is its w-th word start; positions outside words map to slot `length`.
    word_BxL = np.where(valid_BxL, np.cumsum(word_start_BxL, axis=1) - 1, length)
    num_words_B = word_start_BxL.sum(axis=1)
    flat_BxL = np.arange(rows)[:, None] * (length + 1) + word_BxL
    word_len_BxW = np.bincount(flat_BxL[valid_BxL], minlength=rows * (length + 1))
    word_len_BxW = word_len_BxW.reshape(rows, length + 1)[:, :length]
    # A word's score is the score of its start piece, placed at its slot; real words first.
    word_score_BxW = np.full((rows, length), np.inf, np.float32)
    start_rows_N, start_cols_N = np.nonzero(word_start_BxL)
    word_score_BxW[start_rows_N, word_BxL[start_rows_N, start_cols_N]] = score_BxL[
      start_rows_N, start_cols_N
    ]
    order_BxW = masking.stable_argsort(word_score_BxW)
    take_sorted_BxW = masking.greedy_take(
      np.take_along_axis(word_len_BxW, order_BxW, axis=1), budget_B
    )
    take_BxW = np.zeros((rows, length + 1), bool)  # The last slot: positions outside words.
    np.put_along_axis(take_BxW, order_BxW, take_sorted_BxW, axis=1)  # Back to word order.
    take_BxW[:, :length] &= np.arange(length) < num_words_B[:, None]
    return valid_BxL & np.take_along_axis(take_BxW, word_BxL, axis=1)

  def apply(self, features: dict, randoms: dict) -> dict:
    """The batch masked with the given random numbers (see `draw`)."""
    spec = self.spec
    ids_BxL = restore_static_masks(features)
    predictions = self.max_predictions_per_seq
    in_seq_BxL = features["input_mask"] > 0
    valid_BxL = in_seq_BxL & (ids_BxL != spec.cls_id) & (ids_BxL != spec.sep_id)
    budget_B = masking.budgets(in_seq_BxL.sum(axis=1), self.masked_lm_prob, predictions)
    if self.whole_word_mask:
      chosen_BxL = self._select_words(ids_BxL, valid_BxL, budget_B, randoms["score"])
    else:
      chosen_BxL = masking.lowest_scores(randoms["score"], valid_BxL, budget_B)

    # Prediction slots: a row's chosen positions in increasing order (at most the budget <= P).
    positions_BxP, weight_BxP = masking.chosen_slots(chosen_BxL, predictions)
    positions_BxP = positions_BxP.astype(features["masked_lm_positions"].dtype)
    labels_BxP = np.where(weight_BxP, np.take_along_axis(ids_BxL, positions_BxP, axis=1), 0)
    # Per slot: r1 < mask: [MASK]; else r2 >= same / (same + random): a random token; else kept.
    is_mask_BxP = randoms["r1"] < np.float32(self.rates.mask)
    is_random_BxP = randoms["r2"] >= np.float32(self.rates.same_share)
    token_BxP = np.where(
      is_mask_BxP,
      ids_BxL.dtype.type(spec.mask_id),
      np.where(is_random_BxP, randoms["replacement"], labels_BxP),
    ).astype(ids_BxL.dtype)
    masked_BxL = ids_BxL  # A copy of the batch's ids (restore_static_masks).
    masked_BxL[np.nonzero(weight_BxP)[0], positions_BxP[weight_BxP]] = token_BxP[weight_BxP]

    out = dict(features)
    out["input_ids"] = masked_BxL
    out["masked_lm_positions"] = positions_BxP
    out["masked_lm_ids"] = labels_BxP.astype(ids_BxL.dtype)
    out["masked_lm_weights"] = weight_BxP.astype(np.float32)
    return out

  def __call__(self, features: dict, seed) -> dict:
    return self.apply(features, self.draw(features["input_ids"].shape, seed))
