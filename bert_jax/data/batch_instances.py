"""Pre-training instances made in bulk with numpy: `examples`' procedure, its own random stream.

The same procedure as `examples.instances_from_documents` (google-research/bert's
create_instances_from_document; see that module's docstring), drawn differently so that no
Python runs per token:

* the pairs are planned per instance, not per token: documents' sentences are laid end to end
  in one token array, so A, a real B and a random B are each one slice of it, found by bisection
  on the sentences' end offsets (a Python loop over instances: target length, chunk end, A's
  end, the coin, the random document and start);
* truncation is exact in closed form: the pair loses tokens from its longer segment (B on
  ties) until it fits, so the lengths that remain follow from the two lengths alone; each lost
  token leaves from the front or the back with probability 1/2, so the tokens lost from the front
  are Binomial(lost, 1/2);
* masking: the budget is the original's (min(max_predictions, max(1, round(n * prob))), round
  half to even); a uniform random subset of that many candidates is the candidates with the
  lowest uniform keys (the original shuffles and takes the first ones: the same distribution);
  with whole-word masking a group's key orders the groups and the original's greedy walk (a
  group that would overflow the budget is skipped) runs over group ranks for every row at once;
  [MASK] / same / random as `MaskRates` with one draw per chosen position for each decision;
* without sentence pairs, packing (`examples.packed_instances`) walks the sentences (not the
  tokens) of a stream of the documents with a [SEP] after each, so a segment is one slice of it.

Random draws come from `random.Random(seed)` (per-instance decisions) and
`numpy.random.default_rng(seed)` (per-token ones): the files differ from the original engine's
for the same seed, with the same statistics (tests/test_data_generation.py runs every check on
both, and the packing checks of tests/test_data_ablations.py too).
"""

import bisect
import dataclasses
import itertools
import random

import numpy as np

from bert_jax.data import masking
from bert_jax.data.examples import Instance

# Rows assembled and masked at a time: bounds the [rows, L] temporaries whatever the shard size.
BLOCK_ROWS = 8192


@dataclasses.dataclass
class InstanceArrays:
  """N instances, padded: input ids with [PAD], everything else with 0."""

  input_ids_NxL: np.ndarray  # int32
  segment_ids_NxL: np.ndarray  # int8
  lengths_N: np.ndarray  # int32: tokens ([CLS] A [SEP] B [SEP], or packed [CLS] A [SEP])
  masked_positions_NxP: np.ndarray  # int32, ascending, then 0
  masked_ids_NxP: np.ndarray  # int32: the original ids at those positions, then 0
  num_masked_N: np.ndarray  # int32
  is_random_next_N: np.ndarray  # bool
  short_target_N: np.ndarray  # bool: its document pass drew a short target length
  chunk_sentences_N: np.ndarray  # int32: sentences of the chunk A (and a real B) came from
  document_N: np.ndarray  # int32: the index in `documents` (as given) of A's document
  pass_N: np.ndarray  # int32: which of the dupe_factor passes
  target_length_N: np.ndarray  # int32: packed segments' target length (0 for pairs)

  def __len__(self) -> int:
    return len(self.lengths_N)

  def instances(self) -> list[Instance]:
    """As `examples.Instance` objects (for checks written against that engine's output)."""
    out = []
    for i in range(len(self)):
      n, k = int(self.lengths_N[i]), int(self.num_masked_N[i])
      out.append(
        Instance(
          self.input_ids_NxL[i, :n].tolist(),
          self.segment_ids_NxL[i, :n].tolist(),
          self.masked_positions_NxP[i, :k].tolist(),
          self.masked_ids_NxP[i, :k].tolist(),
          bool(self.is_random_next_N[i]),
          bool(self.short_target_N[i]),
          int(self.chunk_sentences_N[i]),
          int(self.target_length_N[i]),
        )
      )
    return out


def truncated_lengths(
  len_a: np.ndarray, len_b: np.ndarray, max_num_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
  """The lengths google-research/bert's truncate_seq_pair leaves: it removes one token at a time
  from A while A is strictly longer, else from B, until the pair has max_num_tokens."""
  a = np.asarray(len_a, np.int64)
  b = np.asarray(len_b, np.int64)
  excess = np.maximum(a + b - max_num_tokens, 0)
  a_longer = a > b
  # First the longer one shrinks until the two are level (B until it is one shorter than A);
  # then they alternate, starting with B when A led (a tie goes to B), else with A.
  first = np.minimum(excess, np.where(a_longer, a - b, b - a + 1))
  rest = excess - first
  from_a = np.where(a_longer, first + rest // 2, (rest + 1) // 2)
  from_b = excess - from_a
  return a - from_a, b - from_b


def _plan_pairs(sent_start, sent_end, doc_first, doc_last, max_num_tokens, short_seq_prob, rng):
  """One pass over the documents: per instance (A start, A length, B start, B length, random
  next, short target, chunk sentences, document, 0). Offsets index the flat token array."""
  # A uniform integer in [lo, hi] is lo + int(random() * (hi - lo + 1)): one 53-bit draw, bias
  # below (hi - lo + 1) / 2**53 (randint's rejection sampling was this loop's largest cost).
  uniform = rng.random
  rows = []
  num_docs = len(doc_first)
  for d in range(num_docs):
    first, last = doc_first[d], doc_last[d]
    target = max_num_tokens
    short = uniform() < short_seq_prob
    if short:
      target = 2 + int(uniform() * (max_num_tokens - 1))
    i = first
    while i <= last:
      # The chunk: sentences i..j, j the first to bring it to the target (or the document end).
      j = bisect.bisect_left(sent_end, sent_start[i] + target, i, last)
      count = j - i + 1
      a_end = i + (1 + int(uniform() * (count - 1)) if count >= 2 else 1)  # After A's last.
      a_start, a_len = sent_start[i], sent_end[a_end - 1] - sent_start[i]
      if count == 1 or uniform() < 0.5:
        r = d
        for _ in range(10):
          r = int(uniform() * num_docs)
          if r != d:
            break
        s = doc_first[r] + int(uniform() * (doc_last[r] - doc_first[r] + 1))
        # Sentences from s until B reaches the target's rest (at least one sentence).
        k = bisect.bisect_left(sent_end, sent_start[s] + target - a_len, s, doc_last[r])
        rows.append(
          (a_start, a_len, sent_start[s], sent_end[k] - sent_start[s], 1, short, count, d, 0)
        )
        i = a_end  # The chunk's unused sentences are read again.
      else:
        b_len = sent_end[j] - sent_start[a_end]
        rows.append((a_start, a_len, sent_start[a_end], b_len, 0, short, count, d, 0))
        i = j + 1
  return rows


def _plan_packed(sent_start, sent_len, doc_first, doc_last, max_num_tokens, short_seq_prob, rng):
  """One pass packing the documents in order into single segments (`examples.packed_instances`):
  per segment (start, length, 0, 0, 0, short target, pieces, document, target). Offsets index
  the stream of the documents' tokens with a [SEP] after each document, so every segment is
  one slice of it (a separator that would start a segment is skipped)."""
  uniform = rng.random
  rows = []
  start = length = pieces = 0
  first_doc = 0

  def new_target():
    short = uniform() < short_seq_prob
    return short, (2 + int(uniform() * (max_num_tokens - 1)) if short else max_num_tokens)

  short, target = new_target()
  for d in range(len(doc_first)):
    if d and length:  # The separator after the previous document.
      if length < target:
        length += 1
      else:
        rows.append((start, length, 0, 0, 0, short, pieces, first_doc, target))
        length = pieces = 0
        short, target = new_target()
    for k in range(doc_first[d], doc_last[d] + 1):
      offset, rest = sent_start[k], sent_len[k]
      while rest:
        room = target - length
        if rest <= room or not length:
          take = min(rest, room)  # Longer than a whole segment: a segment-sized piece.
          if not length:
            start, first_doc = offset, d
          length += take
          pieces += 1
          offset += take
          rest -= take
          if rest == 0:
            continue
        rows.append((start, length, 0, 0, 0, short, pieces, first_doc, target))
        length = pieces = 0
        short, target = new_target()
  if length:
    rows.append((start, length, 0, 0, 0, short, pieces, first_doc, target))
  return rows


def instances_from_documents(
  documents: list[list[list[int]]],
  max_seq_length: int,
  dupe_factor: int,
  short_seq_prob: float,
  masked_lm_prob: float,
  max_predictions_per_seq: int,
  spec: masking.MaskingSpec,
  whole_word_mask: bool,
  seed: int,
  rates: masking.MaskRates = masking.MaskRates(),
  sentence_pairs: bool = True,
  shuffle: bool = True,
) -> InstanceArrays:
  """`examples.instances_from_documents` in bulk: shuffle the documents, `dupe_factor` passes
  (NSP pairs, or with `sentence_pairs=False` packed single segments), shuffle the instances;
  the random stream is this module's. `shuffle=False` keeps the documents' and the instances'
  order (tests compare a pass with the stream it packs)."""
  if max_seq_length < 5:
    raise ValueError(
      f"max_seq_length must be >= 5 (room for [CLS] A [SEP] B [SEP]), got {max_seq_length}"
    )
  rng = random.Random(seed)
  np_rng = np.random.default_rng(seed)
  given = [i for i, d in enumerate(documents) if d]
  if shuffle:
    rng.shuffle(given)
  documents = [documents[i] for i in given]
  sentences = [s for d in documents for s in d]
  lengths = np.fromiter(map(len, sentences), np.int64, len(sentences))
  counts = np.fromiter(map(len, documents), np.int64, len(documents))
  doc_last = np.cumsum(counts) - 1
  ends = np.cumsum(lengths)
  if not sentence_pairs:  # One [SEP] after each document's tokens in the stream.
    ends += np.repeat(np.arange(len(documents)), counts)
  sent_start = (ends - lengths).tolist()
  doc_first = (doc_last + 1 - counts).tolist()
  doc_last = doc_last.tolist()
  tokens = np.fromiter(itertools.chain.from_iterable(sentences), np.int32, int(lengths.sum()))
  if not sentence_pairs:  # Each token moves up by the separators before it (its document's).
    stream = np.full(len(tokens) + len(documents), spec.sep_id, np.int32)
    document_of_token = np.repeat(np.repeat(np.arange(len(documents)), counts), lengths)
    stream[np.arange(len(tokens)) + document_of_token] = tokens
    tokens = stream
  tokens = np.append(tokens, np.int32(spec.pad_id))  # Read by `_assemble` at padding.

  rows, passes = [], []
  for p in range(dupe_factor):
    if sentence_pairs:
      planned = _plan_pairs(
        sent_start, ends.tolist(), doc_first, doc_last, max_seq_length - 3, short_seq_prob, rng
      )
    else:
      planned = _plan_packed(
        sent_start, lengths.tolist(), doc_first, doc_last, max_seq_length - 2, short_seq_prob, rng
      )
    rows += planned
    passes += [p] * len(planned)
  if not rows:
    return _empty(max_seq_length, max_predictions_per_seq)
  plan = np.asarray(rows, np.int64)
  a0, la, b0, lb = plan[:, 0], plan[:, 1], plan[:, 2], plan[:, 3]
  if sentence_pairs:
    la2, lb2 = truncated_lengths(la, lb, max_seq_length - 3)
    a0 = a0 + np_rng.binomial(la - la2, 0.5)
    b0 = b0 + np_rng.binomial(lb - lb2, 0.5)
    keep = np.flatnonzero((la2 > 0) & (lb2 > 0))
    lengths_N = la2 + lb2 + 3
  else:
    la2, lb2, keep, lengths_N = la, lb, np.arange(len(plan)), la + 2
  order = keep[np_rng.permutation(len(keep))] if shuffle else keep
  n = len(order)
  L, P = max_seq_length, max_predictions_per_seq
  out = InstanceArrays(
    input_ids_NxL=np.empty((n, L), np.int32),
    segment_ids_NxL=np.empty((n, L), np.int8),
    lengths_N=lengths_N[order].astype(np.int32),
    masked_positions_NxP=np.zeros((n, P), np.int32),
    masked_ids_NxP=np.zeros((n, P), np.int32),
    num_masked_N=np.empty(n, np.int32),
    is_random_next_N=plan[order, 4].astype(bool),
    short_target_N=plan[order, 5].astype(bool),
    chunk_sentences_N=plan[order, 6].astype(np.int32),
    document_N=np.asarray(given, np.int32)[plan[order, 7]],
    pass_N=np.asarray(passes, np.int32)[order],
    target_length_N=plan[order, 8].astype(np.int32),
  )
  for lo in range(0, n, BLOCK_ROWS):
    rows_B = order[lo : lo + BLOCK_ROWS]
    block = slice(lo, lo + len(rows_B))
    ids_BxL, out.segment_ids_NxL[block] = _assemble(
      tokens, a0[rows_B], la2[rows_B], b0[rows_B], lb2[rows_B], L, spec, sentence_pairs
    )
    masked = mask_batch(
      ids_BxL, out.lengths_N[block], spec, masked_lm_prob, P, whole_word_mask, rates, np_rng
    )
    out.input_ids_NxL[block] = masked[0]
    out.masked_positions_NxP[block], out.masked_ids_NxP[block] = masked[1], masked[2]
    out.num_masked_N[block] = masked[3]
  return out


def _empty(L: int, P: int) -> InstanceArrays:
  z = np.zeros
  return InstanceArrays(
    z((0, L), np.int32), z((0, L), np.int8), z(0, np.int32), z((0, P), np.int32),
    z((0, P), np.int32), z(0, np.int32), z(0, bool), z(0, bool), z(0, np.int32),
    z(0, np.int32), z(0, np.int32), z(0, np.int32),
  )  # fmt: skip


def _assemble(tokens_T, a0, la, b0, lb, L, spec, pairs=True):
  """[CLS] A [SEP] B [SEP] (or without pairs [CLS] A [SEP]) [PAD]... and segment ids, for B
  rows at once. ``tokens_T`` ends with one [PAD], which the padding positions read."""
  rows_B = np.arange(len(la))
  p_1xL = np.arange(L, dtype=np.int64)[None]
  la_Bx1 = la[:, None].astype(np.int64)
  if pairs:  # Position p reads A's token p - 1, or B's token p - la - 2 (offsets into tokens).
    b_start_Bx1 = la_Bx1 + 2
    end_Bx1 = b_start_Bx1 + lb[:, None]  # The final [SEP]'s position.
    src_BxL = np.where(p_1xL < b_start_Bx1, a0[:, None] - 1, b0[:, None] - b_start_Bx1)
  else:
    end_Bx1 = la_Bx1 + 1
    src_BxL = np.broadcast_to(a0[:, None] - 1, (len(la), L)).astype(np.int64)
  src_BxL += p_1xL
  src_BxL[p_1xL > end_Bx1] = len(tokens_T) - 1
  ids = tokens_T.take(src_BxL)  # [CLS] and [SEP] positions read anything; set below.
  ids[:, 0] = spec.cls_id
  ids[rows_B, la + 1] = spec.sep_id
  ids[rows_B, end_Bx1[:, 0]] = spec.sep_id
  if not pairs:
    return ids, np.zeros(ids.shape, np.int8)
  return ids, ((p_1xL >= b_start_Bx1) & (p_1xL <= end_Bx1)).view(np.int8)


def mask_batch(ids_BxL, lengths_B, spec, masked_lm_prob, max_predictions, whole_word, rates, rng):
  """Static masking of B padded rows (see the module docstring). Returns (masked ids, positions
  [B, P] ascending then 0, original ids there then 0, count per row)."""
  B, L = ids_BxL.shape
  candidate = np.arange(L)[None] < lengths_B[:, None]
  for special in (spec.cls_id, spec.sep_id, spec.pad_id):
    candidate &= ids_BxL != special
  budget_B = masking.budgets(lengths_B, masked_lm_prob, max_predictions)
  keys = rng.random((B, L), dtype=np.float32)
  if whole_word:
    chosen = _choose_whole_words(ids_BxL, candidate, keys, budget_B, spec)
  else:  # The lowest keys (ties: the lower position); the original shuffles and takes a prefix.
    chosen = masking.lowest_scores(keys, candidate, budget_B)
  positions, used = masking.chosen_slots(chosen, max_predictions)
  flat = (np.arange(B)[:, None] * L + positions)[used]  # Row by row, ascending: slot order.
  labels = np.zeros((B, max_predictions), np.int32)
  labels[used] = ids_BxL.reshape(-1)[flat]
  masked = ids_BxL.copy()
  k = len(flat)
  to_mask = rng.random(k) < rates.mask
  replace = ~to_mask & (rng.random(k) >= rates.same_share)
  masked.reshape(-1)[flat[to_mask]] = spec.mask_id
  pick = rng.integers(0, len(spec.replacement_ids), int(replace.sum()))
  masked.reshape(-1)[flat[replace]] = spec.replacement_ids[pick]
  return masked, positions, labels, used.sum(axis=1).astype(np.int32)


def _choose_whole_words(ids_BxL, candidate, keys, budget_B, spec):
  """The original's walk over shuffled whole words, every row at once: groups in key order
  (ties: the lower position), each taken if it still fits the budget (one that would overflow
  is skipped)."""
  B, L = ids_BxL.shape
  previous = np.zeros_like(candidate)
  previous[:, 1:] = candidate[:, :-1]
  starts = candidate & ~(previous & spec.continuation_V[ids_BxL])
  p_BxL = np.broadcast_to(np.arange(L), (B, L))
  group_start = np.maximum.accumulate(np.where(starts, p_BxL, 0), axis=1)
  flat_start = (np.arange(B)[:, None] * L + group_start)[candidate]
  size_BxL = np.bincount(flat_start, minlength=B * L).reshape(B, L)
  order = masking.stable_argsort(np.where(starts, keys, np.float32(2.0)))
  take_sorted = masking.greedy_take(np.take_along_axis(size_BxL, order, axis=1), budget_B)
  taken = np.zeros((B, L), bool)
  np.put_along_axis(taken, order, take_sorted, axis=1)
  return candidate & np.take_along_axis(taken, group_start, axis=1)
