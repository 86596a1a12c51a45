"""WordPiece ids against Hugging Face's reference ``transformers.BertTokenizer`` (the slow one).

Uncased: the real MiniLM vocabulary (bert-base-uncased's). Cased: a vocabulary built here from the
shared text with bert_jax's own builder. CI compares every sentence of the shared CoLA and MRPC
train sets and bert_sample_text.txt, every 5th of SST-2 (13.5k of 67k) and every 20th line of
shakespeare/ and of the wiki/ XML (the slow reference spends about 7 s per vocabulary on that);
the ``slow`` test compares every line of all of them (302k texts, about a minute per
vocabulary on an idle core).
"""

import bz2
import functools
import pathlib

import pytest
import transformers

from bert_jax.tokenize import WordPieceTokenizer, load_tokenizer
from bert_jax.tokenize.vocab import build_wordpiece_vocab


def hf_reference(vocab_path, do_lower_case, split_special_tokens=True):
  """transformers.BertTokenizer; split_special_tokens=True reads "[MASK]" in text as text."""
  ref = transformers.BertTokenizer(
    str(vocab_path), do_lower_case=do_lower_case, split_special_tokens=split_special_tokens
  )
  if split_special_tokens:
    # transformers 4.57's tokenize() does not pass split_special_tokens on to
    # BertTokenizer._tokenize, whose BasicTokenizer then keeps a whitespace-delimited "[MASK]"
    # whole; forward the flag so the reference does what it documents.
    ref._tokenize = functools.partial(
      transformers.BertTokenizer._tokenize, ref, split_special_tokens=True
    )
  return ref


def reference_ids(ref, texts):
  return [ref.convert_tokens_to_ids(ref.tokenize(t)) for t in texts]


def assert_same_ids(ours, ref, texts, what):
  got = ours.encode_batch(texts)
  want = reference_ids(ref, texts)
  bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
  assert not bad, (
    f"{what}: {len(bad)}/{len(texts)} texts differ, first {texts[bad[0]]!r}: "
    f"ours {ours.tokenize(texts[bad[0]])} reference {ref.tokenize(texts[bad[0]])}"
  )
  assert len(got) == len(texts)


def _read(path, encoding="utf-8"):
  return pathlib.Path(path).read_text(encoding=encoding).splitlines()


@functools.lru_cache(maxsize=1)
def corpora(data: pathlib.Path) -> dict[str, list[str]]:
  """Every sentence or line of the shared train sets and pre-training texts."""
  glue = data / "glue"
  mrpc = [r.split("\t") for r in _read(glue / "MRPC/train.tsv", "utf-8-sig")[1:]]
  shakespeare = [
    line for f in sorted((data / "pretrain/shakespeare").glob("*.txt")) for line in _read(f)
  ]
  wiki = [
    line
    for f in sorted((data / "pretrain/wiki").glob("*.bz2"))
    for line in bz2.open(f, "rt", encoding="utf-8").read().splitlines()
  ]
  return {
    "CoLA": [r.split("\t")[3] for r in _read(glue / "CoLA/train.tsv")],
    "SST-2": [r.split("\t")[0] for r in _read(glue / "SST-2/train.tsv")[1:]],
    "MRPC": [r[3] for r in mrpc] + [r[4] for r in mrpc],
    "bert_sample_text": _read(data / "pretrain/bert_sample_text.txt"),
    "shakespeare": shakespeare,
    "wiki": wiki,
  }


# CI's deterministic sample: every n-th text of each set.
CI_EVERY = {"CoLA": 1, "MRPC": 1, "bert_sample_text": 1, "SST-2": 5, "shakespeare": 20, "wiki": 20}


@pytest.fixture(scope="module")
def uncased(minilm_dir):
  vocab = minilm_dir / "vocab.txt"
  return load_tokenizer(minilm_dir), hf_reference(vocab, do_lower_case=True)


@pytest.fixture(scope="module")
def cased(shared_data, tmp_path_factory):
  out = tmp_path_factory.mktemp("cased_vocab")
  files = [
    str(shared_data / "pretrain/bert_sample_text.txt"),
    str(shared_data / "glue/MRPC/train.tsv"),
    str(shared_data / "pretrain/shakespeare/hamlet_gut.txt"),
  ]
  built = build_wordpiece_vocab(files, out, vocab_size=6000, do_lower_case=False)
  ours = load_tokenizer(out)  # do_lower_case comes from the tokenizer_config.json written
  assert ours.do_lower_case is False and built.vocab_size == ours.vocab_size
  return ours, hf_reference(out / "vocab.txt", do_lower_case=False)


@pytest.fixture(params=["uncased", "cased"])
def pair(request):
  return request.getfixturevalue(request.param)


def test_corpora_match_reference(pair, shared_data):
  ours, ref = pair
  for name, texts in corpora(shared_data).items():
    assert texts, name
    assert_same_ids(ours, ref, texts[:: CI_EVERY[name]], name)


@pytest.mark.slow
def test_full_corpora_match_reference(pair, shared_data):
  ours, ref = pair
  for name, texts in corpora(shared_data).items():
    assert_same_ids(ours, ref, texts, name)


EDGE_TEXTS = [
  "",
  "   ",
  "\t\n\r\n",
  "Hello, World!",
  "unaffable",
  "don't stop",
  "U.S.A. $3.50/hr 100%",
  "https://example.com/a_b?c=d&e=f#g",
  "naïve café Ångström résumé",
  "Straße ẞ",
  "İstanbul ıi",
  "ΟΔΟΣ ΟΔΟΣ. Σ σς",
  "中文字符 and 日本語テキスト 한국어",
  "Ｆｕｌｌ ｗｉｄｔｈ ﬁ ligature",
  "control\x00\x01\x1b\x7f\x85 chars",
  "zero\u200bwidth\u200djoiner\ufeffbom",
  "\ufffd bad",
  "\u00a0nbsp\u3000ideographic\u2028line\u2029para",
  "e\u0301 vs \u00e9, x\u0301\u0327",
  "emoji 🤗🥺 👩‍👩‍👧 ok",
  "math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ℌ",
  "﷽ عربي",
  "lone \ud800 surrogate",
  "a" * 100,
  "a" * 101,
  "\u00e9" * 100,
  "e\u0301" * 60,
  "word " * 200,
  "[MASK] [CLS][SEP] x[PAD]y [UNK] [unused1] [mask]",
  "a [MASK] b",
  "[[MASK]]",
  "\u166d\u1734\U000111c9 \u0378 \U0002b820",
  "中\u0301文",
  "TeSt CaSe ÉCOLE",
]


def test_edge_cases_match_reference(pair):
  ours, ref = pair
  assert_same_ids(ours, ref, EDGE_TEXTS, "edge cases")
  for text in EDGE_TEXTS:  # the one-text path too
    assert ours.encode(text) == reference_ids(ref, [text])[0], repr(text)
    assert ours.tokenize(text) == ref.tokenize(text), repr(text)


def test_special_tokens_in_text_as_hugging_face(minilm_dir):
  """split_special_tokens=False: "[MASK]" in text is the mask id, as transformers' default."""
  ours = WordPieceTokenizer.from_file(minilm_dir / "vocab.txt", split_special_tokens=False)
  ref = hf_reference(minilm_dir / "vocab.txt", do_lower_case=True, split_special_tokens=False)
  assert_same_ids(ours, ref, EDGE_TEXTS, "edge cases, special tokens matched")
  assert ours.encode("a [MASK] b") == [
    ours.convert_tokens_to_ids(["a"])[0],
    ours.mask_id,
    ours.convert_tokens_to_ids(["b"])[0],
  ]
  default = load_tokenizer(minilm_dir)  # google-research/bert: text stays text
  assert ours.mask_id not in default.encode("a [MASK] b")


def test_special_ids_match_reference(uncased):
  ours, ref = uncased
  assert ours.vocab_size == len(ref.vocab) == 30522
  assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (
    ref.pad_token_id,
    ref.unk_token_id,
    ref.cls_token_id,
    ref.sep_token_id,
    ref.mask_token_id,
  )
  ids = list(range(0, ours.vocab_size, 97))
  assert ours.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)
  tokens = ["hello", "##ing", "[MASK]", "not-in-vocab"]
  assert ours.convert_tokens_to_ids(tokens) == ref.convert_tokens_to_ids(tokens)


def test_word_starts_are_the_reference_words(pair, shared_data):
  """Each word of the reference's BasicTokenizer yields exactly one word-start piece."""
  ours, ref = pair
  basic = transformers.models.bert.tokenization_bert.BasicTokenizer(
    do_lower_case=ours.do_lower_case
  )
  texts = corpora(shared_data)["wiki"][::40] + EDGE_TEXTS[3:20]
  for text, tokens in zip(texts, ours.tokenize_batch(texts)):
    assert sum(map(ours.is_word_start, tokens)) == len(basic.tokenize(text)), repr(text)


def test_decode_matches_reference(uncased):
  ours, ref = uncased
  text = "Hello, World! The unaffable [MASK] didn't go."
  ids = ours.encode(text)
  assert ours.decode(ids) == ref.decode(ids)
  with_specials = [ours.cls_id] + ids + [ours.sep_id]
  assert ours.decode(with_specials) == ref.decode(with_specials, skip_special_tokens=True)
