"""Dynamic masking in tf.data: a fresh mask each time an example is read (RoBERTa-style), with
the same rule as the static masking of `masking.py` (see its docstring for the procedure),
including its `MaskRates` (what a chosen position becomes).

Masks are drawn with stateless random ops seeded by (seed, host, epoch, index of the example in
the epoch), so a resumed run draws exactly the masks it would have drawn. Statically masked
records (any original-format file) are first restored to their original tokens from
`masked_lm_positions`/`masked_lm_ids`, so dynamic masking works on every file of the schema.
"""

import tensorflow as tf

from bert_jax.data import masking


def _greedy_take(length_W, budget):
  """Which words to take, visiting them in order and taking each one that still fits.

  The sequential rule (skip a word that would overflow, keep going) computed in a few vector
  steps: a word longer than the remaining budget can never be taken later (the budget only
  shrinks), so each step drops those, takes the longest prefix of the rest that fits, and
  repeats with the smaller budget. Each step takes at least one word or finishes.
  """
  num_words = tf.shape(length_W)[0]

  def cond(remaining, decided_W, taken_W):
    return (remaining > 0) & ~tf.reduce_all(decided_W)

  def body(remaining, decided_W, taken_W):
    candidate_W = ~decided_W & (length_W <= remaining)
    decided_W = decided_W | (length_W > remaining)
    cumulative_W = tf.cumsum(tf.where(candidate_W, length_W, 0))
    take_W = candidate_W & (cumulative_W <= remaining)
    remaining -= tf.reduce_sum(tf.where(take_W, length_W, 0))
    return remaining, decided_W | take_W, taken_W | take_W

  _, _, taken_W = tf.while_loop(
    cond, body, (budget, tf.zeros([num_words], tf.bool), tf.zeros([num_words], tf.bool))
  )
  return taken_W


def restore_static_masks(features: dict) -> tf.Tensor:
  """input_ids [L] of one parsed example with its static masks undone (the original tokens)."""
  mask_weight_P = features["masked_lm_weights"] > 0
  restore_positions = tf.boolean_mask(features["masked_lm_positions"], mask_weight_P)
  restore_ids = tf.boolean_mask(features["masked_lm_ids"], mask_weight_P)
  return tf.tensor_scatter_nd_update(features["input_ids"], restore_positions[:, None], restore_ids)


def unmask(features: dict) -> dict:
  """One parsed example as original text: static masks undone, masked_lm_* all zero."""
  out = dict(features)
  out["input_ids"] = restore_static_masks(features)
  for key in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
    out[key] = tf.zeros_like(features[key])
  return out


class DynamicMasker:
  """Callable on one parsed example (int32/float32 tensors, unbatched) plus a seed pair."""

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

  def _select_tokens(self, ids_L, valid_L, budget, seed):
    """Boolean [L]: the positions chosen (tokens or whole words, in random order, while they fit)."""
    length = tf.shape(ids_L)[0]
    if not self.whole_word_mask:
      score_L = tf.where(valid_L, tf.random.stateless_uniform([length], seed), 2.0)
      rank_L = tf.argsort(tf.argsort(score_L))
      return valid_L & (rank_L < budget)
    prev_valid_L = tf.concat([[False], valid_L[:-1]], axis=0)
    continuation_L = tf.gather(self._continuation_V, ids_L)
    word_start_L = valid_L & (~continuation_L | ~prev_valid_L)
    word_L = tf.where(valid_L, tf.cumsum(tf.cast(word_start_L, tf.int32)) - 1, length)
    num_words = tf.reduce_sum(tf.cast(word_start_L, tf.int32))
    word_len_W = tf.math.unsorted_segment_sum(tf.cast(valid_L, tf.int32), word_L, length + 1)[
      :num_words
    ]
    order_W = tf.argsort(tf.random.stateless_uniform([num_words], seed))
    take_W = tf.scatter_nd(
      order_W[:, None], _greedy_take(tf.gather(word_len_W, order_W), budget), [num_words]
    )
    take_W = tf.concat([take_W, [False]], axis=0)  # The slot of invalid positions.
    return valid_L & tf.gather(take_W, tf.minimum(word_L, num_words))

  def __call__(self, features: dict, seed) -> dict:
    spec = self.spec
    ids_L = restore_static_masks(features)

    length = tf.shape(ids_L)[0]
    in_seq_L = features["input_mask"] > 0
    valid_L = in_seq_L & (ids_L != spec.cls_id) & (ids_L != spec.sep_id)
    num_tokens = tf.reduce_sum(tf.cast(in_seq_L, tf.float64))
    budget = tf.cast(tf.round(num_tokens * self.masked_lm_prob), tf.int32)  # Half to even.
    budget = tf.minimum(self.max_predictions_per_seq, tf.maximum(1, budget))

    seeds = [tf.random.experimental.stateless_fold_in(seed, k) for k in range(4)]
    selected_L = self._select_tokens(ids_L, valid_L, budget, seeds[0])
    r1_L = tf.random.stateless_uniform([length], seeds[1])
    r2_L = tf.random.stateless_uniform([length], seeds[2])
    random_L = tf.gather(
      self._replacement_R,
      tf.random.stateless_uniform(
        [length], seeds[3], minval=0, maxval=tf.shape(self._replacement_R)[0], dtype=tf.int32
      ),
    )
    # r1 < mask: [MASK]; else r2 >= same / (same + random): a random token; else kept.
    is_mask_L = r1_L < self.rates.mask
    masked_L = tf.where(
      selected_L & is_mask_L,
      spec.mask_id,
      tf.where(selected_L & ~is_mask_L & (r2_L >= self.rates.same_share), random_L, ids_L),
    )

    positions = tf.cast(tf.where(selected_L)[:, 0], tf.int32)[: self.max_predictions_per_seq]
    labels = tf.gather(ids_L, positions)
    pad = self.max_predictions_per_seq - tf.shape(positions)[0]
    out = dict(features)
    out["input_ids"] = masked_L
    out["masked_lm_positions"] = tf.pad(positions, [[0, pad]])
    out["masked_lm_ids"] = tf.pad(labels, [[0, pad]])
    out["masked_lm_weights"] = tf.pad(tf.ones_like(positions, tf.float32), [[0, pad]])
    for key in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
      out[key] = tf.ensure_shape(out[key], [self.max_predictions_per_seq])
    return out
