"""Masked-LM masking (BERT appendix A.1), static (numpy/python, at generation) and dynamic (tf).

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
