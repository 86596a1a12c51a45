"""Random pre-training batches with the real keys and a resumable position (benchmarks, tests).

``SyntheticPretrainInput`` behaves like ``bert_jax.data.pipeline.PretrainInput``: an endless
iterator of this host's batches of numpy arrays, with ``get_state()``/``set_state()``. Batch i
is this host's rows of global batch i, a pure function of (seed, i) -- so any number of
processes together see the same global batches: random tokens, a random real length per row,
random masked positions inside it (sorted, the masked tokens replaced by [MASK] as in BERT).
"""

from __future__ import annotations

import numpy as np


class SyntheticPretrainInput:
  def __init__(
    self,
    batch_size: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    vocab_size: int,
    *,
    seed: int = 0,
    process_index: int = 0,
    process_count: int = 1,
    mask_id: int = 4,
    min_length: int | None = None,
  ):
    self.batch_size = batch_size
    self.max_seq_length = max_seq_length
    self.max_predictions_per_seq = max_predictions_per_seq
    self.vocab_size = vocab_size
    self.seed = seed
    self.process_index = process_index
    self.process_count = process_count
    self.mask_id = mask_id
    self.min_length = min_length or max(max_seq_length // 2, max_predictions_per_seq + 3)
    self._position = 0

  def get_state(self) -> dict:
    return {"position": self._position}

  def set_state(self, state: dict) -> None:
    self._position = int(state["position"])

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, self._position])
    self._position += 1
    b, l, p = (
      self.batch_size * self.process_count,
      self.max_seq_length,
      self.max_predictions_per_seq,
    )
    lengths = rng.integers(self.min_length, l + 1, size=b)
    ids = rng.integers(5, self.vocab_size, size=(b, l)).astype(np.int32)
    mask = (np.arange(l)[None, :] < lengths[:, None]).astype(np.int32)
    ids *= mask
    segment = ((np.arange(l)[None, :] >= lengths[:, None] // 2) * mask).astype(np.int32)
    positions = np.zeros((b, p), np.int32)
    weights = np.zeros((b, p), np.float32)
    labels = np.zeros((b, p), np.int32)
    for r in range(b):
      n = min(p, max(1, int(round(lengths[r] * 0.15))))
      pos = np.sort(rng.choice(np.arange(1, lengths[r] - 1), size=n, replace=False))
      positions[r, :n] = pos
      labels[r, :n] = ids[r, pos]
      weights[r, :n] = 1.0
      ids[r, pos] = self.mask_id
    batch = dict(
      input_ids=ids,
      input_mask=mask,
      segment_ids=segment,
      masked_lm_positions=positions,
      masked_lm_ids=labels,
      masked_lm_weights=weights,
      next_sentence_labels=rng.integers(0, 2, size=b).astype(np.int32),
    )
    rows = slice(self.process_index * self.batch_size, (self.process_index + 1) * self.batch_size)
    return {k: v[rows] for k, v in batch.items()}
