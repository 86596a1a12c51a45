"""The fast WordPiece path (bert_jax/tokenize/fast.py) against the reference.

References: bert_jax's WordPieceTokenizer (itself checked against transformers.BertTokenizer on
the same data and every code point by test_tokenize_reference.py / test_tokenize_unicode.py),
and transformers.BertTokenizer directly on the adversarial ASCII. MiniLM's vocabulary
(bert-base-uncased's), uncased and cased. Without tensorflow-text installed, load_tokenizer
falls back to the reference and the comparisons below hold trivially; the test named
test_fast_backend_is_active says which case ran.
"""

import bz2
import csv
import functools
import json
import pickle
import random
import unicodedata

import pytest
import transformers

from bert_jax.tokenize import FastWordPieceTokenizer, WordPieceTokenizer, fast, load_tokenizer

try:
  fast.import_tf_text()
  HAVE_TF_TEXT = True
except fast.FastUnavailable:
  HAVE_TF_TEXT = False


@functools.cache
def tokenizers(vocab: str, do_lower_case: bool, **kwargs):
  """(fast, reference) for the vocabulary; fast is the reference where tf-text is missing."""
  ref = WordPieceTokenizer.from_file(vocab, do_lower_case=do_lower_case, **kwargs)
  try:
    return FastWordPieceTokenizer.from_file(vocab, do_lower_case=do_lower_case, **kwargs), ref
  except fast.FastUnavailable:
    return ref, ref


@pytest.fixture(params=[True, False], ids=["uncased", "cased"])
def pair(request, minilm_dir):
  return tokenizers(str(minilm_dir / "vocab.txt"), request.param)


def assert_same(fast_tok, ref, texts, what):
  got, want = fast_tok.encode_batch(texts), ref.encode_batch(texts)
  assert len(got) == len(texts)
  bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
  assert not bad, f"{what}: {len(bad)}/{len(texts)} differ, first {texts[bad[0]]!r}"


def test_fast_backend_is_active(minilm_dir):
  tok = load_tokenizer(minilm_dir)
  assert isinstance(tok, WordPieceTokenizer)
  assert isinstance(tok, FastWordPieceTokenizer) == HAVE_TF_TEXT
  assert type(load_tokenizer(minilm_dir, backend="reference")) is WordPieceTokenizer
  with pytest.raises(ValueError, match="backend must be one of"):
    load_tokenizer(minilm_dir, backend="rust")


def test_falls_back_with_a_reason(minilm_dir, monkeypatch, caplog):
  def missing():
    raise fast.FastUnavailable("tensorflow-text is not importable (test)")

  monkeypatch.setattr(fast, "import_tf_text", missing)
  with caplog.at_level("INFO"):
    tok = load_tokenizer(minilm_dir, backend="fast")
  assert type(tok) is WordPieceTokenizer
  assert "tensorflow-text is not importable (test)" in caplog.text
  with pytest.raises(fast.FastUnavailable, match="split_special_tokens"):
    FastWordPieceTokenizer.from_file(minilm_dir / "vocab.txt", split_special_tokens=False)


# --- the shared data ---------------------------------------------------------------------------


def _lines(path, every=1):
  return path.read_text(encoding="utf-8-sig").splitlines()[::every]


@functools.cache
def corpora(data) -> dict[str, list[str]]:
  """Texts of every shared data set: GLUE rows (tab-separated, as read), CoNLL sentences, SQuAD
  contexts, questions and answers, SWAG, the pre-training text."""
  glue = {
    f"glue/{p.parent.name}/{p.name}": _lines(p) for p in sorted((data / "glue").glob("*/*.tsv"))
  }
  conll = []
  for name in ("train.txt", "dev.txt"):
    words = []
    for line in _lines(data / "conll2003" / name) + [""]:
      if line.strip():
        words.append(line.split()[0])
      elif words:
        conll.append(" ".join(words))
        words = []
  squad = []
  for p in sorted((data / "squad").glob("*.json")):
    for article in json.loads(p.read_text(encoding="utf-8"))["data"]:
      for par in article["paragraphs"]:
        squad.append(par["context"])
        for qa in par["qas"]:
          squad += [qa["question"]] + [a["text"] for a in qa.get("answers", [])]
  with open(data / "swag/sample.csv", encoding="utf-8", newline="") as f:
    swag = [" ".join(row) for row in csv.reader(f)]
  wiki = [
    line
    for p in sorted((data / "pretrain/wiki").glob("*.bz2"))
    for line in bz2.open(p, "rt", encoding="utf-8").read().splitlines()
  ]
  shakespeare = [
    line for p in sorted((data / "pretrain/shakespeare").glob("*.txt")) for line in _lines(p)
  ]
  return {
    **glue,
    "conll2003": conll,
    "ner_sci": _lines(data / "ner_sci/bert_paper.bio"),
    "squad": squad,
    "swag": swag,
    "bert_sample_text": _lines(data / "pretrain/bert_sample_text.txt"),
    "wiki": wiki,
    "shakespeare": shakespeare,
  }


def _check_corpora(pair, shared_data, every):
  fast_tok, ref = pair
  total = eligible = 0
  for name, texts in corpora(shared_data).items():
    texts = texts[::every] if name in ("wiki", "shakespeare", "glue/SST-2/train.tsv") else texts
    assert texts, name
    assert_same(fast_tok, ref, texts, name)
    total += len(texts)
    eligible += len(fast.split_eligible(texts)[0])
  assert total > (350_000 if every == 1 else 60_000)
  assert eligible > 0.9 * total  # the fast path did the work (when installed)


def test_shared_data_identical(pair, shared_data):
  _check_corpora(pair, shared_data, every=16)


@pytest.mark.slow
def test_all_shared_data_identical(pair, shared_data):
  _check_corpora(pair, shared_data, every=1)


# --- adversarial text --------------------------------------------------------------------------

PRINTABLE = [chr(c) for c in range(32, 127)] + ["\t", "\n", "\r"]


def adversarial_ascii() -> list[str]:
  rng = random.Random(18)
  texts = [c * n for c in "aZ9.#-" for n in (1, 2, 99, 100, 101, 102, 200, 1000)]
  texts += ["", " ", "\t\r\n", "##", "a##b", "##ing", "[MASK] [CLS][SEP] x[PAD]y [unused1]"]
  texts += ["unaffable " * 50, "x" * 100 + " y", "ab" * 50 + "!" + "c" * 101, "The " * 3000]
  texts += [a + b for a in PRINTABLE for b in PRINTABLE]  # every pair, alone and in a word
  texts += [f"q{a}{b}z" for a in PRINTABLE for b in PRINTABLE]
  weights = [1] * len(PRINTABLE)
  weights[PRINTABLE.index(" ")] = 15
  texts += ["".join(rng.choices(PRINTABLE, weights, k=rng.randint(0, 300))) for _ in range(3000)]
  # Control characters (routed to the reference) mixed in.
  controls = [chr(c) for c in (*range(0, 9), 11, 12, *range(14, 32), 127)]
  texts += ["".join(rng.choices(PRINTABLE + controls, k=rng.randint(1, 60))) for _ in range(500)]
  return texts


def test_adversarial_ascii_identical(pair):
  fast_tok, ref = pair
  texts = adversarial_ascii()
  assert_same(fast_tok, ref, texts, "adversarial ASCII")
  assert fast_tok.tokenize_batch(texts) == ref.tokenize_batch(texts)


def test_adversarial_ascii_against_transformers(minilm_dir):
  """The independent slow reference on a sample (it tokenizes ~1 MB/s)."""
  texts = adversarial_ascii()[::15]
  for lower in (True, False):
    fast_tok, _ = tokenizers(str(minilm_dir / "vocab.txt"), lower)
    slow = transformers.BertTokenizer(str(minilm_dir / "vocab.txt"), do_lower_case=lower)
    got = fast_tok.encode_batch(texts)
    for text, ids in zip(texts, got):
      assert ids == slow.convert_tokens_to_ids(slow.tokenize(text)), repr(text)


def _check_code_points(minilm_dir, lower, every):
  """Each code point alone and inside a word ("a{c}b {c}"), in batches of 65,536 mixed with
  ASCII text, through the fast tokenizer (every ``every``-th code point); and for all of them,
  raw tensorflow-text is only ever sent a text where its ids are the reference's."""
  fast_tok, ref = tokenizers(str(minilm_dir / "vocab.txt"), lower)
  cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
  assert len(cps) == 1_112_064
  eligible = [f"a{chr(c)}b {chr(c)}" for c in cps if fast.is_fast_eligible(chr(c))]
  assert len(eligible) == 98  # printable ASCII, tab, newline, carriage return
  if HAVE_TF_TEXT:
    assert fast_tok._fast_ids(eligible) == ref.encode_batch(eligible)
    # ... and is needed: raw tensorflow-text differs on these (control characters, CJK,
    # unassigned code points, accents when cased, a recent mark).
    others = ["a\x01b", "a\x7fb", "\u4e2d\u6587", "a\u0378b", "e\u0301", "\U0002b820x", "a\u0897b"]
    raw = fast_tok._fast_ids(others)
    assert sum(r != w for r, w in zip(raw, ref.encode_batch(others))) >= 3
  sample = cps[::every]
  for start in range(0, len(sample), 65536):
    chunk = sample[start : start + 65536]
    texts = [f"a{chr(c)}b {chr(c)}" if c % 3 else f"Word {c}" for c in chunk]
    got, want = fast_tok.encode_batch(texts), ref.encode_batch(texts)
    bad = [i for i in range(len(texts)) if got[i] != want[i]]
    assert not bad, [f"U+{chunk[i]:04X} {unicodedata.name(chr(chunk[i]), '?')}" for i in bad[:10]]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_code_points(minilm_dir, lower):
  _check_code_points(minilm_dir, lower, every=13)


@pytest.mark.slow
@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_every_code_point(minilm_dir, lower):
  _check_code_points(minilm_dir, lower, every=1)


# --- the batch machinery -----------------------------------------------------------------------


def test_mixed_batches_keep_order(pair, monkeypatch):
  fast_tok, ref = pair
  monkeypatch.setattr(fast, "CHUNK", 100)  # several tensorflow-text calls per batch
  rng = random.Random(0)
  pool = ["Hello, World!", "naïve café", "中文 text", "a\x01b", "", "don't stop", "ΟΔΟΣ"]
  pool += [f"plain ascii line number {i}" for i in range(20)]
  for n in (0, 1, 63, 64, 65, 250, 1000):
    texts = [rng.choice(pool) for _ in range(n)]
    assert_same(fast_tok, ref, texts, f"{n} texts")
    assert fast_tok.tokenize_batch(texts) == ref.tokenize_batch(texts)
  assert fast_tok.encode("Hello, World!") == ref.encode("Hello, World!")
  with pytest.raises(TypeError, match="take str, got bytes"):
    fast_tok.encode_batch([b"bytes"] * 100)


@pytest.mark.parametrize(
  "kwargs",
  [
    {"max_input_chars_per_word": 8},
    {"strip_accents": True},
    {"strip_accents": False},
    {"tokenize_chinese_chars": False},
  ],
)
def test_options_identical(minilm_dir, kwargs):
  texts = adversarial_ascii()[::5] + ["naïve Café 中文", "antidisestablishmentarianism"] * 40
  for lower in (True, False):
    fast_tok, ref = tokenizers(str(minilm_dir / "vocab.txt"), lower, **kwargs)
    assert_same(fast_tok, ref, texts, f"{kwargs}, lower={lower}")


def test_pickles(minilm_dir):
  fast_tok, ref = tokenizers(str(minilm_dir / "vocab.txt"), True)
  copy = pickle.loads(pickle.dumps(fast_tok))
  assert type(copy) is type(fast_tok)
  texts = ["Hello, World!"] * 100
  assert copy.encode_batch(texts) == ref.encode_batch(texts)


def test_tokens_the_reference_cannot_produce(tmp_path):
  """tensorflow-text folds the split into its matcher: a vocabulary token holding a space made
  it read "x y" as one token before fast.tf_text_vocab; punctuation inside, "##" alone, control
  and non-ASCII characters, special tokens."""
  odd = ["x y", "x\ty", "don't", "a.b", ".a", "##.", "##", "#", "a\x01", "é", "##é", "[unused0]"]
  letters = ["a", "b", "d", "o", "n", "t", "x", "y", ".", "'", "!"]
  tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *odd, *letters, "don", "##t", "##o"]
  tokens += [f"##{c}" for c in "abdnxy"]
  path = tmp_path / "vocab.txt"
  path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
  rng = random.Random(1)
  alphabet = list("abdontxy.'#! \t[]UNK") + ["\x01"]
  texts = ["x y", "x  y", "x\ty", "don't", "a.b", ".a", "##", "[UNK]", "x[UNK]y"] * 8
  texts += ["".join(rng.choices(alphabet, k=rng.randint(0, 30))) for _ in range(3000)]
  for lower in (True, False):
    fast_tok, ref = tokenizers(str(path), lower)
    assert_same(fast_tok, ref, texts, f"odd vocabulary, lower={lower}")
