"""WordPiece against the reference ``transformers.BertTokenizer`` on every Unicode code point.

Each code point c is tokenized as "a{c}b {c}" (inside a word and alone), uncased and cased, so
its class (deleted, whitespace, punctuation, CJK, accent, case) shows. Python's ``unicodedata``
(the reference's) and tokenizers' Rust tables disagree on ~830k code points; see
bert_jax/tokenize/charclasses.py. CI checks every assigned code point outside the big ideograph
and syllable blocks and the private-use planes, every 37th inside them and every 101st
unassigned one (~51k); ``slow`` checks all 1,112,064.
"""

import functools
import unicodedata

import pytest
import transformers

from bert_jax.tokenize import WordPieceTokenizer

_BIG_BLOCKS = (
  "CJK UNIFIED IDEOGRAPH-",
  "CJK COMPATIBILITY IDEOGRAPH-",
  "HANGUL SYLLABLE ",
  "TANGUT ",
  "KHITAN ",
  "NUSHU ",
  "YI SYLLABLE ",
  "EGYPTIAN HIEROGLYPH ",
)


@functools.cache
def code_points(sample: bool) -> list[int]:
  out = []
  for cp in range(0x110000):
    if 0xD800 <= cp <= 0xDFFF:
      continue
    if not sample:
      out.append(cp)
      continue
    category = unicodedata.category(chr(cp))
    if category == "Cn":
      keep = cp % 101 == 0
    elif category == "Co" or unicodedata.name(chr(cp), "").startswith(_BIG_BLOCKS):
      keep = cp % 37 == 0
    else:
      keep = True
    if keep:
      out.append(cp)
  return out


@functools.cache
def pipelines(vocab_path: str, do_lower_case: bool):
  ours = WordPieceTokenizer.from_file(vocab_path, do_lower_case=do_lower_case)
  ref = transformers.BertTokenizer(vocab_path, do_lower_case=do_lower_case)
  return ours, ref


def check(minilm_dir, do_lower_case, sample):
  ours, ref = pipelines(str(minilm_dir / "vocab.txt"), do_lower_case)
  cps = code_points(sample)
  texts = [f"a{chr(cp)}b {chr(cp)}" for cp in cps]
  got = ours.tokenize_batch(texts)
  bad = []
  for cp, text, tokens in zip(cps, texts, got):
    want = ref.tokenize(text)
    if tokens != want:
      bad.append(
        f"U+{cp:04X} {unicodedata.category(chr(cp))} "
        f"{unicodedata.name(chr(cp), '?')}: ours {tokens} reference {want}"
      )
  assert not bad, f"{len(bad)} of {len(cps)} code points differ:\n" + "\n".join(bad[:20])


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_code_points_sample(minilm_dir, do_lower_case):
  check(minilm_dir, do_lower_case, sample=True)


@pytest.mark.slow
@pytest.mark.parametrize("do_lower_case", [True, False])
def test_every_code_point(minilm_dir, do_lower_case):
  check(minilm_dir, do_lower_case, sample=False)
