"""Example generation against the paper's procedure (appendix A.1/A.2 and google-research/bert's
create_pretraining_data.py), on the shared pre-training texts, for both engines: "original"
(`examples`, the original's random stream) and "fast" (`batch_instances`, in bulk).

Each statistic is checked against the value the procedure implies, with binomial bounds of
5 standard deviations (false-failure rate ~1e-6 per check), or exactly where it is exact.
"""

import math
import random

import numpy as np
import pytest

from bert_jax.data import batch_instances, corpus, examples, masking

SIGMAS = 5.0
ENGINES = ("original", "fast")


def make_instances(engine, documents, length, dupe, max_predictions, spec, whole_word, seed):
  """Instances of `documents` by either engine (short_seq_prob 0.1, masked_lm_prob 0.15)."""
  if engine == "original":
    return examples.instances_from_documents(
      documents, length, dupe, 0.1, 0.15, max_predictions, spec, whole_word, random.Random(seed)
    )
  arrays = batch_instances.instances_from_documents(
    documents, length, dupe, 0.1, 0.15, max_predictions, spec, whole_word, seed
  )
  return arrays.instances()


def within_binomial(successes: int, trials: int, p: float) -> bool:
  sd = math.sqrt(trials * p * (1 - p))
  return abs(successes - trials * p) <= SIGMAS * sd + 1


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
  from bert_jax.tokenize import load_tokenizer

  return load_tokenizer(minilm_dir / "vocab.txt", do_lower_case=True)


@pytest.fixture(scope="module")
def spec(tokenizer):
  return masking.MaskingSpec.from_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def documents(shared_data, tokenizer):
  """Tokenized documents: the original BERT sample text, two Shakespeare plays, the wiki dump."""
  pretrain = shared_data / "pretrain"
  stats = {}
  docs = list(corpus.read_original_format(str(pretrain / "bert_sample_text.txt"), stats))
  for play in ("hamlet_gut.txt", "tempest_gut.txt"):
    docs += list(corpus.read_plain_text(str(pretrain / "shakespeare" / play), stats))
  wiki = sorted((pretrain / "wiki").glob("*.bz2"))
  docs += list(corpus.read_wiki_dump(str(wiki[0]), stats))[:40]
  tokenized = [[ids for ids in tokenizer.encode_batch(d) if ids] for d in docs]
  return [d for d in tokenized if d]


def expected_num_masks(length, max_predictions):
  # The paper/original: min(max_predictions_per_seq, max(1, round(len(tokens) * 0.15))),
  # len(tokens) counting [CLS] and [SEP]; Python's round (half to even) as the original.
  return min(max_predictions, max(1, int(round(length * 0.15))))


@pytest.fixture(scope="module", params=ENGINES)
def instances_128(request, documents, spec):
  return make_instances(request.param, documents, 128, 2, 20, spec, False, seed=1)


def test_structure_and_lengths(instances_128, spec):
  assert len(instances_128) > 2000
  for inst in instances_128:
    ids, seg = inst.input_ids, inst.segment_ids
    assert 5 <= len(ids) <= 128
    assert ids[0] == spec.cls_id and ids[-1] == spec.sep_id
    # segment 0 covers [CLS] A [SEP], segment 1 covers B [SEP].
    boundary = seg.index(1)
    assert all(s == 0 for s in seg[:boundary]) and all(s == 1 for s in seg[boundary:])
    assert [i for i, t in enumerate(ids) if t == spec.sep_id] == [boundary - 1, len(ids) - 1]
    assert boundary >= 3 and len(ids) - boundary >= 2  # A and B both non-empty.


def test_cls_sep_never_masked_and_exact_mask_count(instances_128, spec):
  for inst in instances_128:
    assert inst.masked_positions == sorted(set(inst.masked_positions))
    assert len(inst.masked_positions) == expected_num_masks(len(inst.input_ids), 20)
    boundary = inst.segment_ids.index(1)
    forbidden = {0, boundary - 1, len(inst.input_ids) - 1}
    assert not forbidden & set(inst.masked_positions)
    assert spec.cls_id not in inst.masked_ids and spec.sep_id not in inst.masked_ids


def test_mask_rate_and_80_10_10(instances_128, spec, tokenizer):
  mask = kept = replaced = total = 0
  maskable = expected_masked = 0
  for inst in instances_128:
    maskable += len(inst.input_ids) - 3
    expected_masked += expected_num_masks(len(inst.input_ids), 20)
    for position, label in zip(inst.masked_positions, inst.masked_ids):
      total += 1
      token = inst.input_ids[position]
      if token == spec.mask_id:
        mask += 1
      elif token == label:
        kept += 1
      else:
        replaced += 1
        assert token not in (
          tokenizer.pad_id,
          tokenizer.cls_id,
          tokenizer.sep_id,
          tokenizer.mask_id,
        )
  assert total == expected_masked
  # ~15% of maskable tokens: the rounding makes it 0.15 up to one token per sequence.
  assert abs(total / maskable - 0.15) < 0.01
  assert within_binomial(mask, total, 0.8)
  # A random replacement equal to the original token counts as "kept" (p = 1/|R|).
  p_kept = 0.1 + 0.1 / len(spec.replacement_ids)
  assert within_binomial(kept, total, p_kept)
  assert within_binomial(replaced, total, 0.1 - 0.1 / len(spec.replacement_ids))


def test_next_sentence_balance(instances_128):
  # B is random whenever the chunk has a single sentence, else with probability 0.5.
  multi = [i for i in instances_128 if i.chunk_sentences >= 2]
  single = [i for i in instances_128 if i.chunk_sentences == 1]
  assert len(multi) > 1000
  assert within_binomial(sum(i.is_random_next for i in multi), len(multi), 0.5)
  assert all(i.is_random_next for i in single)


def test_short_target_share_fast(documents, spec):
  arrays = batch_instances.instances_from_documents(
    documents, 128, 8, 0.1, 0.15, 20, spec, False, 7
  )
  passes = {}
  for p, d, short in zip(arrays.pass_N, arrays.document_N, arrays.short_target_N):
    passes.setdefault((p, d), set()).add(bool(short))
  assert len(passes) > 300
  assert all(len(v) == 1 for v in passes.values())  # Drawn once per document pass.
  assert within_binomial(sum(v == {True} for v in passes.values()), len(passes), 0.1)


def test_short_target_share(documents, spec):
  rng = random.Random(7)
  short = passes = 0
  for _ in range(8):
    for index in range(len(documents)):
      got = examples.instances_from_document(documents, index, 128, 0.1, 0.15, 20, spec, False, rng)
      if got:
        passes += 1
        short += got[0].short_target
        assert len({i.short_target for i in got}) == 1  # Drawn once per document pass.
  assert passes > 300
  assert within_binomial(short, passes, 0.1)


def _restore(inst):
  ids = list(inst.input_ids)
  for p, label in zip(inst.masked_positions, inst.masked_ids):
    ids[p] = label
  return ids


def _find_run(haystack: bytes, needle: list[int]) -> bool:
  return np.asarray(needle, np.int32).tobytes() in haystack


@pytest.mark.parametrize("engine", ENGINES)
def test_segments_are_contiguous_text(engine, documents, spec):
  """A is a contiguous run of the document's tokens; a real-next B follows it in the same
  document (truncation may cut the end of A or the start of B, so not always adjacent)."""
  streams = [np.asarray([t for s in d for t in s], np.int32).tobytes() for d in documents]
  joined = b"\xff\xff\xff\xff".join(streams)
  if engine == "original":
    rng = random.Random(3)
    pairs = [
      (index, inst)
      for index in range(0, len(documents), 3)
      for inst in examples.instances_from_document(
        documents, index, 128, 0.1, 0.15, 20, spec, False, rng
      )
    ]
  else:
    arrays = batch_instances.instances_from_documents(
      documents, 128, 1, 0.1, 0.15, 20, spec, False, 3
    )
    pairs = list(zip(arrays.document_N.tolist(), arrays.instances()))[::3]
  checked = 0
  for index, inst in pairs:
    ids = _restore(inst)
    boundary = inst.segment_ids.index(1)
    a, b = ids[1 : boundary - 1], ids[boundary:-1]
    if inst.is_random_next:
      assert _find_run(streams[index], a)
      assert _find_run(joined, b)
    else:
      stream = streams[index]
      assert _find_run(stream, a) and _find_run(stream, b)
      a_at = stream.find(np.asarray(a, np.int32).tobytes())
      assert stream.find(np.asarray(b, np.int32).tobytes(), a_at + 4 * len(a)) >= 0
    checked += 1
  assert checked > 100


@pytest.mark.parametrize("engine", ENGINES)
def test_512_uses_80_predictions(engine, documents, spec):
  insts = make_instances(engine, documents[:30], 512, 1, 80, spec, False, seed=5)
  assert max(len(i.input_ids) for i in insts) == 512
  for inst in insts:
    assert len(inst.input_ids) <= 512
    assert len(inst.masked_positions) == expected_num_masks(len(inst.input_ids), 80)


@pytest.mark.parametrize("engine", ENGINES)
def test_whole_word_masking_never_splits_words(engine, documents, spec, tokenizer):
  insts = make_instances(engine, documents[:60], 128, 1, 20, spec, True, seed=11)
  words_checked = 0
  for inst in insts:
    ids = _restore(inst)
    tokens = tokenizer.convert_ids_to_tokens(ids)
    masked = set(inst.masked_positions)
    assert len(masked) <= expected_num_masks(len(ids), 20)
    # Group pieces into words independently: a "##" piece continues the previous token.
    words, current = [], []
    for i, tok in enumerate(tokens):
      if tok in ("[CLS]", "[SEP]"):
        if current:
          words.append(current)
        current = []
        continue
      if tok.startswith("##") and current:
        current.append(i)
      else:
        if current:
          words.append(current)
        current = [i]
    if current:
      words.append(current)
    for word in words:
      hit = [i in masked for i in word]
      assert all(hit) or not any(hit), (tokens, word)
      words_checked += any(hit) and len(word) > 1
  assert words_checked > 50  # Multi-piece words were actually masked whole.


def test_truncation_drops_from_both_ends_of_the_longer_segment():
  rng = random.Random(0)
  fronts = 0
  trials = 400
  for _ in range(trials):
    a, b = examples._truncate_pair(list(range(100)), list(range(100, 130)), 100, rng)
    assert len(a) + len(b) == 100 and b == list(range(100, 130))  # Only the longer one shrinks.
    assert a == list(range(a[0], a[0] + len(a)))  # Still contiguous.
    fronts += a[0]
  # Each of the 30 removed tokens comes off the front with probability 0.5.
  assert within_binomial(fronts, trials * 30, 0.5)


@pytest.mark.parametrize("engine", ENGINES)
def test_one_sentence_documents_and_overlong_sentences(engine, spec):
  docs = [
    [[1000 + i for i in range(700)]],  # one sentence far over max_seq_length
    [[2000, 2001, 2002]],  # one short sentence
    [[3000 + i for i in range(5)], [3100 + i for i in range(7)]],
  ]
  insts = make_instances(engine, docs, 64, 3, 10, spec, False, seed=2)
  assert insts
  for inst in insts:
    assert len(inst.input_ids) <= 64
    if inst.chunk_sentences == 1:
      assert inst.is_random_next  # A single sentence can only pair with a random B.


def _truncate_seq_pair_lengths(len_a, len_b, max_num_tokens):
  """google-research/bert's truncate_seq_pair, lengths only: one token at a time from A while it
  is strictly longer, else from B."""
  while len_a + len_b > max_num_tokens:
    if len_a > len_b:
      len_a -= 1
    else:
      len_b -= 1
  return len_a, len_b


def test_fast_truncation_keeps_the_originals_lengths():
  grid = [(a, b, m) for a in range(1, 40) for b in range(1, 40) for m in (2, 5, 17, 30, 61)]
  a, b, m = (np.array(x) for x in zip(*grid))
  for max_num_tokens in (2, 5, 17, 30, 61):
    rows = m == max_num_tokens
    got_a, got_b = batch_instances.truncated_lengths(a[rows], b[rows], max_num_tokens)
    want = [_truncate_seq_pair_lengths(x, y, max_num_tokens) for x, y in zip(a[rows], b[rows])]
    assert list(zip(got_a.tolist(), got_b.tolist())) == want


def test_fast_truncation_drops_from_both_ends_of_the_longer_segment(spec):
  """A one-sentence document of 100 consecutive ids pairs with a random B of 5 ids; at
  max_seq_length 64 (61 tokens) A loses 44, each from the front with probability 1/2."""
  long_doc = [list(range(1000, 1100))]
  short_doc = [[5000, 5001, 5002, 5003, 5004]]
  arrays = batch_instances.instances_from_documents(
    [long_doc, short_doc], 64, 400, 0.0, 0.15, 10, spec, False, 0
  )
  fronts = drops = 0
  for inst in arrays.instances():
    ids = _restore(inst)
    boundary = inst.segment_ids.index(1)
    a = ids[1 : boundary - 1]
    if a[0] < 1000 or ids[boundary] != 5000:  # The short document's pass; or (p = 2^-10
      continue  # per instance) ten draws of the other document all hit A's own.
    assert ids[boundary:-1] == [5000, 5001, 5002, 5003, 5004] and len(a) == 56
    assert a == list(range(a[0], a[0] + 56))  # Still contiguous.
    fronts += a[0] - 1000
    drops += 44
  assert drops >= 390 * 44
  assert within_binomial(fronts, drops, 0.5)


class _KeysThenRandom:
  """A generator whose first `random` call returns the given keys, the rest a real stream."""

  def __init__(self, keys_BxL, seed):
    self.keys_BxL, self.rng = keys_BxL, np.random.default_rng(seed)

  def random(self, shape, dtype=np.float64):
    if self.keys_BxL is not None:
      keys, self.keys_BxL = self.keys_BxL, None
      return keys
    return self.rng.random(shape, dtype=dtype)

  def integers(self, *args):
    return self.rng.integers(*args)


@pytest.mark.parametrize("whole_word", [False, True])
def test_fast_masking_walks_candidates_in_key_order_ties_to_the_lower_position(
  documents, spec, whole_word
):
  # google-research/bert's walk (masking.candidate_groups, then take each group that fits),
  # visiting the groups by their first position's key, equal keys by position; coarse keys tie.
  rows = [d[0] + d[1] for d in documents if len(d) > 1 and len(d[0] + d[1]) <= 120][:300]
  B, L = len(rows), 128
  ids_BxL = np.full((B, L), spec.pad_id, np.int32)
  lengths_B = np.array([len(r) + 3 for r in rows], np.int32)
  for i, r in enumerate(rows):
    ids_BxL[i, : len(r) + 3] = [spec.cls_id, *r[: len(r) // 2], spec.sep_id, *r[len(r) // 2 :]] + [
      spec.sep_id
    ]
  keys_BxL = (np.random.default_rng(0).integers(0, 6, (B, L)) / 8).astype(np.float32)
  got = batch_instances.mask_batch(
    ids_BxL,
    lengths_B,
    spec,
    0.15,
    20,
    whole_word,
    masking.MaskRates(),
    _KeysThenRandom(keys_BxL, 1),
  )
  tied = 0
  for i in range(B):
    n = int(lengths_B[i])
    groups = masking.candidate_groups(ids_BxL[i, :n].tolist(), spec, whole_word)
    groups.sort(key=lambda g: (keys_BxL[i, g[0]], g[0]))
    budget = expected_num_masks(n, 20)
    chosen = []
    for g in groups:
      if len(chosen) + len(g) <= budget:
        chosen += g
    tied += len({keys_BxL[i, g[0]] for g in groups}) < len(groups)
    assert got[1][i, : got[3][i]].tolist() == sorted(chosen), i
    assert got[2][i, : got[3][i]].tolist() == ids_BxL[i, sorted(chosen)].tolist()
  assert tied > B // 2
