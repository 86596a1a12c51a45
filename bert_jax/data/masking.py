"""Masked-LM masking (BERT appendix A.1): the rule, one instance at a time (`mask_tokens`), and
the vector selection steps the batched maskers share (static at generation, `batch_instances`;
dynamic in the reader, `dynamic_masking`): `lowest_scores`, `stable_argsort`, `greedy_take`.

Both follow google-research/bert's `create_masked_lm_predictions`:

* candidates are all tokens but [CLS] and [SEP] (and padding);
* number of predictions = min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob)))
  where len(tokens) counts [CLS] and [SEP] and round() is Python's (half to even);
* candidates are visited in a random order and taken while they fit; with whole-word masking a
  candidate is a whole word (a word-start piece and the continuation pieces after it, by
  `tokenizer.is_word_start`) and a word that would overflow the budget is skipped;
* each chosen token becomes [MASK] with p=`rates.mask` (0.8), stays unchanged with
  p=`rates.same` (0.1), becomes a random token with p=`rates.random` (0.1): one draw r1 < mask
  gives [MASK], else a second draw r2 < same / (same + random) keeps the token, else it is
  replaced (the original's `rng.random() < 0.5` at the defaults, so the default random stream is
  the original's). Other rates are the paper's Table 8 ablations (MASK/SAME/RND);
* positions are reported in increasing order.

Random replacement tokens are drawn uniformly from the vocabulary minus [PAD], [UNK], [CLS],
[SEP] and [MASK] (the original draws from the whole vocabulary, specials included).
"""

import dataclasses
import random

import numpy as np


@dataclasses.dataclass(frozen=True)
class MaskRates:
  """What a chosen position becomes: [MASK] (`mask`), itself (`same`), a random token (`random`).

  The paper's default is 80/10/10; Table 8 ablates it (e.g. 100/0/0, 80/0/20, 0/0/100).
  """

  mask: float = 0.8
  same: float = 0.1
  random: float = 0.1

  def __post_init__(self):
    values = {"mask": self.mask, "same": self.same, "random": self.random}
    for name, value in values.items():
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"mask rate {name} must be a number in [0, 1], got {value!r}")
    total = self.mask + self.same + self.random
    if abs(total - 1.0) > 1e-6:
      raise ValueError(
        f"mask rates must sum to 1: mask={self.mask} + same={self.same} + "
        f"random={self.random} = {total:g}"
      )

  @classmethod
  def parse(cls, value) -> "MaskRates":
    """A MaskRates, a (mask, same, random) sequence or a "0.8,0.1,0.1" string -> MaskRates."""
    if isinstance(value, cls):
      return value
    if isinstance(value, str):
      parts = [p.strip() for p in value.split(",")]
      try:
        value = [float(p) for p in parts]
      except ValueError:
        raise ValueError(
          f"mask rates must be three numbers mask,same,random, got {value!r}"
        ) from None
    value = tuple(value)
    if len(value) != 3:
      raise ValueError(f"mask rates must be three numbers (mask, same, random), got {value!r}")
    return cls(*(float(v) for v in value))

  def as_tuple(self) -> tuple[float, float, float]:
    return (self.mask, self.same, self.random)

  @property
  def same_share(self) -> float:
    """P(keep | not [MASK]): the threshold of the second draw (0 when nothing but [MASK])."""
    rest = self.same + self.random
    return self.same / rest if rest > 0 else 1.0


@dataclasses.dataclass(frozen=True)
class MaskingSpec:
  """What masking needs from the tokenizer (picklable; no tokenizer object in workers)."""

  cls_id: int
  sep_id: int
  mask_id: int
  pad_id: int
  vocab_size: int
  continuation_V: np.ndarray  # bool [vocab]: True for word-continuation pieces ("##ing").
  replacement_ids: np.ndarray  # int32 [R]: ids a masked token may be replaced with at random.

  @classmethod
  def from_tokenizer(cls, tokenizer) -> "MaskingSpec":
    tokens = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
    continuation = np.array(
      [tok is not None and not tokenizer.is_word_start(tok) for tok in tokens], dtype=bool
    )
    special = {
      tokenizer.pad_id,
      tokenizer.unk_id,
      tokenizer.cls_id,
      tokenizer.sep_id,
      tokenizer.mask_id,
    }
    # Special tokens are never continuations.
    for i in special:
      if i is not None and 0 <= i < len(continuation):
        continuation[i] = False
    replacement = np.array(
      [i for i in range(tokenizer.vocab_size) if i not in special], dtype=np.int32
    )
    return cls(
      cls_id=tokenizer.cls_id,
      sep_id=tokenizer.sep_id,
      mask_id=tokenizer.mask_id,
      pad_id=tokenizer.pad_id,
      vocab_size=tokenizer.vocab_size,
      continuation_V=continuation,
      replacement_ids=replacement,
    )


def num_to_predict(num_tokens: int, masked_lm_prob: float, max_predictions_per_seq: int) -> int:
  """The paper's/original's number of masked positions for a sequence of `num_tokens` tokens."""
  return min(max_predictions_per_seq, max(1, int(round(num_tokens * masked_lm_prob))))


def candidate_groups(ids: list[int], spec: MaskingSpec, whole_word: bool) -> list[list[int]]:
  """Positions that may be masked, grouped into whole words when `whole_word`."""
  groups: list[list[int]] = []
  previous = -2
  for i, token_id in enumerate(ids):
    if token_id in (spec.cls_id, spec.sep_id, spec.pad_id):
      continue
    if whole_word and groups and previous == i - 1 and spec.continuation_V[token_id]:
      groups[-1].append(i)
    else:
      groups.append([i])
    previous = i
  return groups


def mask_tokens(
  ids: list[int],
  spec: MaskingSpec,
  masked_lm_prob: float,
  max_predictions_per_seq: int,
  whole_word: bool,
  rng: random.Random,
  rates: MaskRates = MaskRates(),
) -> tuple[list[int], list[int], list[int]]:
  """Static masking of one instance. Returns (masked ids, positions ascending, original ids)."""
  groups = candidate_groups(ids, spec, whole_word)
  rng.shuffle(groups)
  budget = num_to_predict(len(ids), masked_lm_prob, max_predictions_per_seq)
  output = list(ids)
  same_share = rates.same_share
  chosen: list[int] = []
  for group in groups:
    if len(chosen) >= budget:
      break
    if len(chosen) + len(group) > budget:
      continue
    for index in group:
      if rng.random() < rates.mask:
        output[index] = spec.mask_id
      elif rng.random() < same_share:
        pass  # Keep the original token.
      else:
        output[index] = int(spec.replacement_ids[rng.randrange(len(spec.replacement_ids))])
      chosen.append(index)
  chosen.sort()
  return output, chosen, [ids[i] for i in chosen]


def budgets(num_tokens_B, masked_lm_prob: float, max_predictions_per_seq: int) -> np.ndarray:
  """`num_to_predict` for a batch of sequence lengths (int64; np.rint rounds half to even, as
  Python's round)."""
  budget_B = np.rint(np.asarray(num_tokens_B, np.float64) * masked_lm_prob)
  return np.minimum(max_predictions_per_seq, np.maximum(1, budget_B)).astype(np.int64)


def chosen_slots(chosen_BxL, num_slots: int) -> tuple[np.ndarray, np.ndarray]:
  """Each row's chosen positions in increasing order in its first slots: (positions [B, S]
  int32, then 0; used [B, S] bool). A row must choose at most `num_slots` positions."""
  rows, length = chosen_BxL.shape
  row_N, position_N = np.divmod(np.flatnonzero(chosen_BxL), length)  # Row-major: ascending.
  count_B = np.bincount(row_N, minlength=rows)
  if count_B.max(initial=0) > num_slots:
    raise ValueError(f"a row chose {count_B.max()} positions, more than its {num_slots} slots")
  slot_N = np.arange(len(row_N)) - np.repeat(np.cumsum(count_B) - count_B, count_B)
  positions_BxS = np.zeros((rows, num_slots), np.int32)
  positions_BxS.reshape(-1)[row_N * num_slots + slot_N] = position_N
  return positions_BxS, np.arange(num_slots) < count_B[:, None]


def greedy_take(length_BxW, budget_B):
  """Which words to take, per row visiting them in order and taking each one that still fits.

  The sequential rule (skip a word that would overflow, keep going) computed in a few vector
  steps: a word longer than the remaining budget can never be taken later (the budget only
  shrinks), so each step drops those, takes the longest prefix of the rest that fits, and
  repeats with the smaller budget. Each step takes at least one word of every unfinished row or
  finishes it. Accepts an unbatched [W] / scalar pair too.
  """
  length_BxW, budget_B = np.asarray(length_BxW), np.asarray(budget_B)
  if length_BxW.ndim == 1:
    return greedy_take(length_BxW[None], budget_B.reshape(1))[0]
  remaining_B = budget_B.astype(np.int64)
  decided_BxW = np.zeros(length_BxW.shape, bool)
  taken_BxW = np.zeros(length_BxW.shape, bool)
  while True:
    active_B = (remaining_B > 0) & ~decided_BxW.all(axis=1)
    if not active_B.any():
      return taken_BxW
    active_Bx1, remaining_Bx1 = active_B[:, None], remaining_B[:, None]
    candidate_BxW = active_Bx1 & ~decided_BxW & (length_BxW <= remaining_Bx1)
    decided_BxW |= active_Bx1 & (length_BxW > remaining_Bx1)
    cumulative_BxW = np.cumsum(np.where(candidate_BxW, length_BxW, 0), axis=1)
    take_BxW = candidate_BxW & (cumulative_BxW <= remaining_Bx1)
    remaining_B -= np.where(take_BxW, length_BxW, 0).sum(axis=1)
    decided_BxW |= take_BxW
    taken_BxW |= take_BxW


def lowest_scores(score_BxL, valid_BxL, budget_B):
  """Boolean [B, L]: per row the `budget` valid positions of lowest score, ties broken by the
  lower position (the order of a stable sort)."""
  score_BxL = np.where(valid_BxL, score_BxL, np.inf)
  budget_B = np.minimum(budget_B, score_BxL.shape[1])
  rows_B = np.arange(score_BxL.shape[0])
  threshold_Bx1 = np.sort(score_BxL, axis=1)[rows_B, budget_B - 1][:, None]
  chosen_BxL = valid_BxL & (score_BxL <= threshold_Bx1)
  tied_R = np.flatnonzero(chosen_BxL.sum(axis=1) > budget_B)
  if tied_R.size:  # Of the positions scored at the threshold, the first ones the budget leaves.
    below_RxL = score_BxL[tied_R] < threshold_Bx1[tied_R]
    tie_RxL = chosen_BxL[tied_R] & ~below_RxL
    left_Rx1 = (budget_B[tied_R] - below_RxL.sum(axis=1))[:, None]
    chosen_BxL[tied_R] = below_RxL | (tie_RxL & (np.cumsum(tie_RxL, axis=1) <= left_Rx1))
  return chosen_BxL


def stable_argsort(score_BxW):
  """np.argsort(score_BxW, axis=1, kind="stable") for float32 scores >= 0, ~10x faster: such a
  float's bits, read as an integer, order as the float does; with the column index appended
  below them the keys are distinct, and NumPy sorts 64-bit integers with SIMD."""
  bits_BxW = score_BxW.view(np.int32).astype(np.int64)
  if (bits_BxW < 0).any():  # A negative score (or -0.0): the general sort.
    return np.argsort(score_BxW, axis=1, kind="stable")
  shift = max(1, (score_BxW.shape[1] - 1).bit_length())
  keys_BxW = (bits_BxW << shift) | np.arange(score_BxW.shape[1])
  return (np.sort(keys_BxW, axis=1) & ((1 << shift) - 1)).astype(np.intp)
