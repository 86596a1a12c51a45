"""Rule-based English sentence splitting for plain-text corpora.

The rule (documented in docs/pretraining_data.md): a sentence ends at ".", "!" or "?" (optionally
followed by closing quotes or brackets) when the next non-space character starts a new sentence:
an upper-case letter, a digit, or an opening quote/bracket. It does NOT end there when

* the word before the "." is a known abbreviation ("Mr.", "e.g.", "etc.", "Fig.", "vs.", ...),
* the word before the "." is a single letter (initials such as "J. R. R. Tolkien", "4 A. M."),
* the "." belongs to a number ("3.14") or an ellipsis mid-sentence is followed by lower case.

This is the classic punkt-style heuristic without the learned parameters; it is deterministic,
has no dependencies and is what the original BERT data (one sentence per line) was roughly made
with. Text that needs a better splitter can be split beforehand and fed in the original format.
"""

import re

# Lower-cased, without the final period.
_ABBREVIATIONS = frozenset(
  """
mr mrs ms dr prof sr jr st mt rev gen col lt sgt capt cmdr gov sen rep pres hon messrs mme mlle
e.g i.e etc vs cf al approx fig figs eq eqs no nos vol vols ch sec secs pp pg ed eds repr trans
jan feb mar apr jun jul aug sep sept oct nov dec inc ltd co corp dept univ est ca viz resp
""".split()
)

_END_RE = re.compile(
  r"""[.!?]+["'\u201d\u2019)\]]*(?=\s+["'\u201c\u2018(\[]*[A-Z0-9\u00C0-\u024F])"""
)


def _is_false_end(text: str, end: int) -> bool:
  """Whether the terminator match ending at `end` is an abbreviation or an initial."""
  match_text = text[:end].rstrip("\"'\u201d\u2019)]")
  if not match_text.endswith("."):
    return False  # "!" and "?" always end a sentence.
  # The word before the final period.
  start = max(match_text.rfind(" ", 0, len(match_text) - 1), match_text.rfind("\n"))
  word = match_text[start + 1 : -1].lstrip("\"'\u201c\u2018([")
  if not word:
    return False
  if len(word) == 1 and word.isalpha():
    return True  # an initial: "J. Smith", "4 A. M."
  return word.lower() in _ABBREVIATIONS


def split_sentences(paragraph: str) -> list[str]:
  """Splits one paragraph (newlines are treated as spaces) into sentences by the rule above."""
  text = " ".join(paragraph.split())
  if not text:
    return []
  sentences = []
  start = 0
  for match in _END_RE.finditer(text):
    if _is_false_end(text, match.end()):
      continue
    sentence = text[start : match.end()].strip()
    if sentence:
      sentences.append(sentence)
    start = match.end()
  tail = text[start:].strip()
  if tail:
    sentences.append(tail)
  return sentences
