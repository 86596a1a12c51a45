"""The cache of tokenized whitespace pieces (bert_jax/tokenize/piece_cache.py).

Reference: Hugging Face's slow ``transformers.BertTokenizer`` (google-research/bert's pipeline in
Python), which tokenizes each text whole. The cache splits texts with ``str.split()``; the texts
here put every character that Python or BERT treats as whitespace, and every control and format
character, between and inside words and before combining marks, so any place where the split
and BERT disagree shows. MiniLM's vocabulary (bert-base-uncased's), uncased and cased.
"""

import pickle
import random
import re
import threading
import unicodedata

import pytest
from test_tokenize_reference import hf_reference, reference_ids

from bert_jax.tokenize import WordPieceTokenizer, piece_cache


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def pair(request, minilm_dir):
  vocab = minilm_dir / "vocab.txt"
  ours = WordPieceTokenizer.from_file(vocab, do_lower_case=request.param)
  return ours, hf_reference(vocab, do_lower_case=request.param)


def separators() -> list[str]:
  """Every character either side may split or delete at: Python's whitespace, Unicode's Z*
  categories, control (Cc) and format (Cf) characters."""
  out = []
  for cp in range(0x110000):
    c = chr(cp)
    if 0xD800 <= cp <= 0xDFFF:
      continue
    if c.isspace() or unicodedata.category(c) in ("Zs", "Zl", "Zp", "Cc", "Cf"):
      out.append(c)
  return out


def assert_same(ours, ref, texts, what):
  got = ours.encode_batch(texts)
  want = reference_ids(ref, texts)
  bad = [t for t, g, w in zip(texts, got, want) if g != w]
  assert not bad, f"{what}: {len(bad)}/{len(texts)} differ, first {bad[0]!r}"
  return got


def test_split_mismatch_is_where_python_and_bert_disagree():
  """Every code point where str.isspace() and google-research/bert's _is_whitespace differ."""

  def bert_whitespace(c):
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"

  disagree = {c for c in map(chr, range(0x110000)) if c.isspace() != bert_whitespace(c)}
  matched = {c for c in separators() if piece_cache.SPLIT_MISMATCH.search(c)}
  assert matched == disagree
  assert len(disagree) == 9


def test_separators_in_context_match_reference(pair):
  ours, ref = pair
  ours.clear_cache()
  texts = []
  for c in separators():
    texts += [f"ab{c}cd", f"ab {c} cd", f"{c}e\u0301x", f"e{c}\u0301 e\u0301{c}", f"{c}{c}Zz{c}"]
  assert_same(ours, ref, texts, "separators")
  assert_same(ours, ref, texts, "separators, cached")  # the second pass reads the cache


def random_texts_match(ours, ref):
  """Words from a small pool (so pieces repeat) joined by random separators, many batches."""
  ours.clear_cache()
  rng = random.Random(0)
  seps = separators()
  words = ["The", "café", "DON'T", "x,y", "中文", "e\u0301", "ΟΔΟΣ", "[MASK]", "a" * 101, "naïve."]
  words += ["x[SEP]y", "[CLS]", "Hello,", "(a)."]
  for batch in range(6):
    texts = []
    for _ in range(200):
      parts = []
      for _ in range(rng.randint(0, 8)):
        parts.append(rng.choice(words))
        parts.append(rng.choice(seps) if rng.random() < 0.2 else " " * rng.randint(1, 2))
      texts.append("".join(parts))
    assert_same(ours, ref, texts, f"batch {batch}")


def test_random_texts_match_reference(pair):
  random_texts_match(*pair)


def test_random_texts_with_special_tokens_matched(minilm_dir):
  """split_special_tokens=False ("[MASK]" in text is the mask id): pieces are cached whole."""
  vocab = minilm_dir / "vocab.txt"
  ours = WordPieceTokenizer.from_file(vocab, split_special_tokens=False)
  random_texts_match(ours, hf_reference(vocab, do_lower_case=True, split_special_tokens=False))
  assert ours.mask_id in ours.encode_batch(["a [MASK] b"])[0]


def test_eviction_keeps_ids_and_bounds_memory(pair, shared_data):
  ours, ref = pair
  small = WordPieceTokenizer(
    ours.convert_ids_to_tokens(range(ours.vocab_size)), do_lower_case=ours.do_lower_case
  )
  small._piece_cache = piece_cache.PieceCache(max_entries=100)
  lines = (shared_data / "pretrain/bert_sample_text.txt").read_text(encoding="utf-8").splitlines()
  seen = set()
  for start in range(0, 60, 3):
    batch = lines[start : start + 3]
    assert_same(small, ref, batch, f"lines {start}+")
    distinct = {p for t in batch for p in t.split()}
    seen |= distinct
    # At most the limit, or one batch's distinct pieces and their words (BERT's split of
    # ASCII: letters and digits, or one other character) where those alone pass it.
    words = {
      w
      for p in distinct
      for q in (p, p.lower())
      for w in re.findall("[A-Za-z0-9]+|[^A-Za-z0-9]", q)
    }
    assert len(small._piece_cache) <= max(100, len(distinct) + len(words))
  assert len(seen) > 300  # the cache was emptied several times on the way
  with pytest.raises(ValueError, match="max_entries"):
    piece_cache.PieceCache(max_entries=0)


def test_tokens_and_one_text_paths_agree(pair):
  ours, ref = pair
  texts = ["Hello, World!", "naïve\u2028café", "x\x1cy z"]
  assert ours.tokenize_batch(texts) == [ref.tokenize(t) for t in texts]
  assert [ours.encode(t) for t in texts] == ours.encode_batch(texts)


def test_pickles_empty_and_works(pair):
  ours, _ = pair
  ours.encode_batch(["some words to cache"])
  copy = pickle.loads(pickle.dumps(ours))
  assert len(copy._piece_cache) == 0
  assert copy.encode_batch(["some words to cache"]) == ours.encode_batch(["some words to cache"])


def test_threads_share_one_cache(pair, shared_data):
  ours, _ = pair
  lines = (shared_data / "pretrain/bert_sample_text.txt").read_text(encoding="utf-8").splitlines()
  want = ours._encode_uncached(lines)
  tok = WordPieceTokenizer(
    ours.convert_ids_to_tokens(range(ours.vocab_size)), do_lower_case=ours.do_lower_case
  )
  tok._piece_cache = piece_cache.PieceCache(max_entries=300)  # evicts while others read
  results = {}

  def work(k):
    results[k] = [
      row for i in range(0, len(lines), 16) for row in tok.encode_batch(lines[i : i + 16])
    ]

  threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert all(results[k] == want for k in range(4))


def test_bytes_are_refused_with_the_decode_hint(pair):
  ours, _ = pair
  with pytest.raises(TypeError, match="decode first"):
    ours.encode_batch(["fine", b"bytes"])
