"""BERT's character classes, taken from Python's ``unicodedata``, as regexes for ``tokenizers``.

The reference tokenizer (google-research/bert, and ``transformers.BertTokenizer`` after it)
classifies characters with Python's ``unicodedata``; ``tokenizers``' Rust BertNormalizer and
BertPreTokenizer use older Unicode tables. A sweep over every code point (tests/
test_tokenize_unicode.py) finds them apart on about 830k characters: code points unassigned in
Python's tables (the reference deletes them as "control"; Rust keeps them), marks, punctuation
and CJK ideographs added to Unicode since, and three characters whose category changed. The
WordPiece pipeline closes the gap with the classes built here, so its ids equal the reference's
on all of Unicode.
"""

from __future__ import annotations

import functools
import unicodedata

# The CJK ideograph blocks BERT spaces out (the reference's _is_chinese_char), inclusive.
CJK_RANGES = (
  (0x4E00, 0x9FFF),
  (0x3400, 0x4DBF),
  (0x20000, 0x2A6DF),
  (0x2A700, 0x2B73F),
  (0x2B740, 0x2B81F),
  (0x2B820, 0x2CEAF),
  (0xF900, 0xFAFF),
  (0x2F800, 0x2FA1F),
)

# Characters the reference treats as word characters (or, for U+111C9, a mark) but tokenizers'
# tables as punctuation or a non-spacing mark: found by the sweep with tokenizers 0.22 and
# Python 3.11 (Unicode 14). The classes above follow whatever Python runs; this list is fixed, and
# the slow sweep test shows if another pairing of versions needs more. Rust sees these as a
# PLACEHOLDER_CANDIDATES character instead.
RECLASSIFIED_WORD_CHARS = ("\u166d", "\u1734", "\U000111c9")
# Unassigned code points Rust's tables see as ordinary characters; one not in the vocabulary
# stands in for a RECLASSIFIED_WORD_CHARS character (a word holding either is [UNK] the same).
PLACEHOLDER_CANDIDATES = ("\u0378", "\u0379", "\u0380", "\u0381", "\u0382", "\u0383")


def _ranges_to_class(codepoints: list[int]) -> str:
  """Sorted code points -> a regex character class such as [\\x{378}-\\x{379}\\x{380}]."""
  parts, i = [], 0
  while i < len(codepoints):
    j = i
    while j + 1 < len(codepoints) and codepoints[j + 1] == codepoints[j] + 1:
      j += 1
    lo, hi = codepoints[i], codepoints[j]
    parts.append(f"\\x{{{lo:X}}}" if lo == hi else f"\\x{{{lo:X}}}-\\x{{{hi:X}}}")
    i = j + 1
  return "[" + "".join(parts) + "]"


@functools.cache
def reference_classes() -> dict[str, str]:
  """Regex classes of the non-ASCII characters the reference deletes ("control": NUL, U+FFFD,
  every category C* but tab, newline and carriage return), splits off ("punct": category P*),
  strips when removing accents ("mark": Mn), and splits off or spaces out ("punct_cjk"). ASCII
  is left out: both sides agree on it. Built once per process (about half a second)."""
  control, punct, mark = [], [], []
  for cp in range(0x80, 0x110000):
    if 0xD800 <= cp <= 0xDFFF:
      continue  # surrogates never reach Rust (see wordpiece.py)
    cat = unicodedata.category(chr(cp))
    if cat[0] == "C" or cp == 0xFFFD:
      control.append(cp)
    elif cat[0] == "P":
      punct.append(cp)
    elif cat == "Mn":
      mark.append(cp)
  cjk = {cp for lo, hi in CJK_RANGES for cp in range(lo, hi + 1)}
  return {
    "control": _ranges_to_class(control),
    "punct": _ranges_to_class(punct),
    "mark": _ranges_to_class(mark),
    "punct_cjk": _ranges_to_class(sorted(cjk.union(punct))),
  }
