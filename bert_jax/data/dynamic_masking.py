"""Dynamic masking in tf.data: a fresh mask each time an example is read (RoBERTa-style), with
the same rule as the static masking of `masking.py` (see its docstring for the procedure),
including its `MaskRates` (what a chosen position becomes).

Everything works on whole parsed batches ([B, L] tensors), a few dozen vector ops per batch
instead of per example, so the reader's cost per example is close to that of reading static
masks. The masks of a batch are drawn with stateless random ops from one seed pair (the
pipeline's: seed, host, and the epoch and number of the batch's first example), so a resumed
run (which restarts at a batch boundary with the same batch size) draws exactly the masks it
would have drawn. Statically masked records (any original-format file) are first restored to
their original tokens from `masked_lm_positions`/`masked_lm_ids`, so dynamic masking works on
every file of the schema.

The random numbers a batch uses are drawn first (`draw`), then `apply` is a deterministic
function of them: per row, the candidates (tokens, or whole words scored by their first piece)
are visited in the order of independent uniform scores, i.e. a uniformly random order, and
taken while they fit, as google-research/bert does with its shuffled candidate list.
"""

import tensorflow as tf

from bert_jax.data import masking


def _greedy_take(length_BxW, budget_B):
  """Which words to take, per row visiting them in order and taking each one that still fits.

  The sequential rule (skip a word that would overflow, keep going) computed in a few vector
  steps: a word longer than the remaining budget can never be taken later (the budget only
  shrinks), so each step drops those, takes the longest prefix of the rest that fits, and
  repeats with the smaller budget. Each step takes at least one word of every unfinished row or
  finishes it. Accepts an unbatched [W] / scalar pair too.
  """
  if length_BxW.shape.rank == 1:
    return _greedy_take(length_BxW[None], tf.reshape(budget_B, [1]))[0]
  zeros_BxW = tf.zeros_like(length_BxW, tf.bool)

  def unfinished(remaining_B, decided_BxW):
    return (remaining_B > 0) & ~tf.reduce_all(decided_BxW, axis=1)

  def cond(remaining_B, decided_BxW, taken_BxW):
    return tf.reduce_any(unfinished(remaining_B, decided_BxW))

  def body(remaining_B, decided_BxW, taken_BxW):
    active_Bx1 = unfinished(remaining_B, decided_BxW)[:, None]
    remaining_Bx1 = remaining_B[:, None]
    candidate_BxW = active_Bx1 & ~decided_BxW & (length_BxW <= remaining_Bx1)
    decided_BxW = decided_BxW | (active_Bx1 & (length_BxW > remaining_Bx1))
    cumulative_BxW = tf.cumsum(tf.where(candidate_BxW, length_BxW, 0), axis=1)
    take_BxW = candidate_BxW & (cumulative_BxW <= remaining_Bx1)
    remaining_B -= tf.reduce_sum(tf.where(take_BxW, length_BxW, 0), axis=1)
    return remaining_B, decided_BxW | take_BxW, taken_BxW | take_BxW

  _, _, taken_BxW = tf.while_loop(cond, body, (budget_B, zeros_BxW, zeros_BxW))
  return taken_BxW


def restore_static_masks(features: dict) -> tf.Tensor:
  """input_ids [B, L] of a parsed batch with its static masks undone (the original tokens)."""
  slot_Nx2 = tf.where(features["masked_lm_weights"] > 0)
  positions_N = tf.gather_nd(features["masked_lm_positions"], slot_Nx2)
  ids_N = tf.gather_nd(features["masked_lm_ids"], slot_Nx2)
  index_Nx2 = tf.stack([tf.cast(slot_Nx2[:, 0], positions_N.dtype), positions_N], axis=1)
  return tf.tensor_scatter_nd_update(features["input_ids"], index_Nx2, ids_N)


def unmask(features: dict) -> dict:
  """A parsed batch as original text: static masks undone, masked_lm_* all zero."""
  out = dict(features)
  out["input_ids"] = restore_static_masks(features)
  for key in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
    out[key] = tf.zeros_like(features[key])
  return out


class DynamicMasker:
  """Callable on a parsed batch (int32/float32 tensors, [B, L] and [B, P]) plus a seed pair."""

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
    self._continuation_V = tf.constant(spec.continuation_V, dtype=tf.bool)
    self._replacement_R = tf.constant(spec.replacement_ids, dtype=tf.int32)

  def draw(self, shape_2, seed) -> dict:
    """The random numbers of one batch of `shape_2` = [B, L]: score (order of the candidates),
    r1 and r2 (what a chosen position becomes), replacement (a random token per position)."""
    seeds = [tf.random.experimental.stateless_fold_in(seed, k) for k in range(4)]
    num_replacements = tf.shape(self._replacement_R)[0]
    return {
      "score": tf.random.stateless_uniform(shape_2, seeds[0]),
      "r1": tf.random.stateless_uniform(shape_2, seeds[1]),
      "r2": tf.random.stateless_uniform(shape_2, seeds[2]),
      "replacement": tf.gather(
        self._replacement_R,
        tf.random.stateless_uniform(
          shape_2, seeds[3], minval=0, maxval=num_replacements, dtype=tf.int32
        ),
      ),
    }

  def _select(self, ids_BxL, valid_BxL, budget_B, score_BxL):
    """Boolean [B, L]: the positions chosen (tokens or whole words, in the order of increasing
    score, each taken while it fits). A word's score is its first piece's."""
    length = tf.shape(ids_BxL)[1]
    if not self.whole_word_mask:
      # The `budget` lowest-scored positions (ties: the lower position first, as a stable sort).
      k = min(self.max_predictions_per_seq, ids_BxL.shape[1])
      _, lowest_BxK = tf.math.top_k(-tf.where(valid_BxL, score_BxL, 2.0), k=k)
      take_BxK = tf.range(k)[None] < budget_B[:, None]
      row_BxK = tf.broadcast_to(tf.range(tf.shape(ids_BxL)[0])[:, None], tf.shape(lowest_BxK))
      index_Nx2 = tf.boolean_mask(tf.stack([row_BxK, lowest_BxK], axis=2), take_BxK)
      chosen_BxL = tf.scatter_nd(
        index_Nx2, tf.ones(tf.shape(index_Nx2)[:1], tf.bool), tf.shape(ids_BxL)
      )
      return valid_BxL & chosen_BxL
    prev_valid_BxL = tf.pad(valid_BxL[:, :-1], [[0, 0], [1, 0]])
    continuation_BxL = tf.gather(self._continuation_V, ids_BxL)
    word_start_BxL = valid_BxL & (~continuation_BxL | ~prev_valid_BxL)
    # Word w of a row is its w-th word start; positions outside words map to slot `length`.
    word_BxL = tf.where(valid_BxL, tf.cumsum(tf.cast(word_start_BxL, tf.int32), axis=1) - 1, length)
    num_words_B = tf.reduce_sum(tf.cast(word_start_BxL, tf.int32), axis=1)
    rows = tf.shape(ids_BxL)[0]
    row_BxL = tf.broadcast_to(tf.range(rows)[:, None], tf.shape(ids_BxL))
    word_len_BxW = tf.reshape(
      tf.math.unsorted_segment_sum(
        tf.cast(valid_BxL, tf.int32), row_BxL * (length + 1) + word_BxL, rows * (length + 1)
      ),
      [rows, length + 1],
    )[:, :length]
    # A word's score is the score of its start piece, placed at its slot.
    slot_Nx2 = tf.where(word_start_BxL)
    word_score_BxW = tf.tensor_scatter_nd_update(
      tf.fill(tf.shape(ids_BxL), 2.0),
      tf.stack([slot_Nx2[:, 0], tf.cast(tf.gather_nd(word_BxL, slot_Nx2), tf.int64)], axis=1),
      tf.gather_nd(score_BxL, slot_Nx2),
    )
    order_BxW = tf.argsort(word_score_BxW, axis=1)  # Real words first, by score.
    take_sorted_BxW = _greedy_take(tf.gather(word_len_BxW, order_BxW, batch_dims=1), budget_B)
    take_BxW = tf.scatter_nd(  # Back from score order to word order (a permutation).
      tf.stack([row_BxL, order_BxW], axis=2), take_sorted_BxW, tf.shape(order_BxW)
    )
    take_BxW = take_BxW & (tf.range(length)[None] < num_words_B[:, None])
    take_BxW = tf.pad(take_BxW, [[0, 0], [0, 1]])  # The slot of positions outside words.
    return valid_BxL & tf.gather(take_BxW, word_BxL, batch_dims=1)

  def apply(self, features: dict, randoms: dict) -> dict:
    """The batch masked with the given random numbers (see `draw`)."""
    spec = self.spec
    ids_BxL = restore_static_masks(features)
    in_seq_BxL = features["input_mask"] > 0
    valid_BxL = in_seq_BxL & (ids_BxL != spec.cls_id) & (ids_BxL != spec.sep_id)
    num_tokens_B = tf.reduce_sum(tf.cast(in_seq_BxL, tf.float64), axis=1)
    budget_B = tf.cast(tf.round(num_tokens_B * self.masked_lm_prob), tf.int32)  # Half to even.
    budget_B = tf.minimum(self.max_predictions_per_seq, tf.maximum(1, budget_B))

    selected_BxL = self._select(ids_BxL, valid_BxL, budget_B, randoms["score"])
    # r1 < mask: [MASK]; else r2 >= same / (same + random): a random token; else kept.
    is_mask_BxL = randoms["r1"] < self.rates.mask
    is_random_BxL = ~is_mask_BxL & (randoms["r2"] >= self.rates.same_share)
    masked_BxL = tf.where(
      selected_BxL & is_mask_BxL,
      spec.mask_id,
      tf.where(selected_BxL & is_random_BxL, randoms["replacement"], ids_BxL),
    )

    predictions = self.max_predictions_per_seq
    # Chosen positions in increasing order (at most `predictions` per row: the budget), then
    # int32.max. tf.where lists a row's positions in increasing order: no sort needed.
    slot_Nx2 = tf.where(selected_BxL)
    sorted_BxP = tf.RaggedTensor.from_value_rowids(
      tf.cast(slot_Nx2[:, 1], tf.int32), slot_Nx2[:, 0], nrows=tf.shape(ids_BxL, tf.int64)[0]
    ).to_tensor(default_value=tf.int32.max, shape=[None, predictions])
    weight_BxP = sorted_BxP < tf.int32.max
    positions_BxP = tf.where(weight_BxP, sorted_BxP, 0)
    out = dict(features)
    out["input_ids"] = masked_BxL
    out["masked_lm_positions"] = positions_BxP
    out["masked_lm_ids"] = tf.where(weight_BxP, tf.gather(ids_BxL, positions_BxP, batch_dims=1), 0)
    out["masked_lm_weights"] = tf.cast(weight_BxP, tf.float32)
    return out

  def __call__(self, features: dict, seed) -> dict:
    return self.apply(features, self.draw(tf.shape(features["input_ids"]), seed))
