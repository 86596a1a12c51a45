"""Each whitespace-separated piece of text tokenized once: a bounded cache before a WordPiece.

BERT's WordPiece pipeline (google-research/bert's ``FullTokenizer``; Hugging Face's
``BertTokenizer``) works on each whitespace-separated piece of a text on its own: the clean-up
deletes or keeps one character at a time, CJK spacing, accent stripping, lower-casing and the
punctuation split happen inside a piece, and a word longer than the limit is one [UNK] on its
own. So a text's ids are its pieces' ids one after the other, and a corpus, whose pieces repeat
(Zipf: the 5 MB of Shakespeare hold about a million pieces, 74 thousand distinct), needs each
distinct piece tokenized once. The pieces come from ``str.split()`` (C, no regex), and each is
looked up in a dict; only pieces not seen before reach the tokenizer, all of a batch's in one
call.

The one difference between ``str.split()`` and BERT's idea of whitespace: Python also splits at
nine characters the reference deletes as control characters (or, for U+2028 / U+2029, keeps):
"a\\x1cb" is the one word "ab" to BERT. A text holding any of them is tokenized whole, uncached
(:data:`SPLIT_MISMATCH`). NFC cannot join characters across whitespace (no canonical
composition starts with a space). tests/test_tokenize_cache.py checks the ids against Hugging
Face's slow reference with every whitespace, control and format character between and inside
words, on random text mixing them, and with a cache emptied between batches; the tokenizer
tests (shared corpora, every code point) all run through the cache too.

Memory is bounded: at ``max_entries`` distinct pieces the cache starts again empty (about 50 MB
at the default; a corpus's frequent pieces come back within a batch or two).
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Sequence

from bert_jax.tokenize import base

MAX_ENTRIES = 1 << 18

EncodeFn = Callable[[list[str]], list[list[int]]]
# A piece -> the smaller pieces whose ids, one after the other, are its ids (or None).
SplitFn = Callable[[str], list[str] | None]


# The characters ``str.split()`` splits at and BERT's clean-up does not treat as whitespace (it
# deletes the C0/C1 controls among them and keeps U+2028 / U+2029); no character is the other
# way round. tests/test_tokenize_cache.py derives the set again from ``str.isspace`` and the
# reference's _is_whitespace over every code point.
SPLIT_MISMATCH = re.compile("[\x0b\x0c\x1c-\x1f\x85\u2028\u2029]")


class PieceCache:
  """Maps whitespace pieces to their ids, filling itself from a batch encoder.

  ``encode(texts, encode_fn)`` returns the ids ``encode_fn(texts)`` would, where ``encode_fn``
  is a WordPiece batch encoder (ids of each text, no special tokens). Thread-safe (one batch
  at a time); pickles empty.
  """

  def __init__(self, max_entries: int = MAX_ENTRIES):
    if max_entries < 1:
      raise ValueError(f"max_entries must be positive, got {max_entries}")
    self.max_entries = max_entries
    self._ids: dict[str, list[int]] = {}
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return len(self._ids)

  def clear(self) -> None:
    with self._lock:
      self._ids.clear()

  def __getstate__(self):
    return {"max_entries": self.max_entries}

  def __setstate__(self, state):
    self.__init__(state["max_entries"])

  def encode(
    self, texts: Sequence[str], encode_fn: EncodeFn, split_fn: SplitFn | None = None
  ) -> list[list[int]]:
    """The ids of each text. ``split_fn``, where given, splits a new piece further (e.g. "Hello,"
    into "hello" and ","), so that the encoder sees fewer distinct strings; its parts are cached
    too. It must keep the ids: a piece's ids are its parts' ids one after the other."""
    texts = list(texts)
    try:
      clean = SPLIT_MISMATCH.search("".join(texts)) is None  # also the type check: join takes str
    except TypeError:
      return encode_fn(texts)  # the encoder names the bad text
    if clean:
      return self._encode_split(texts, encode_fn, split_fn)
    split_idx, whole_idx = [], []
    for i, text in enumerate(texts):
      (whole_idx if SPLIT_MISMATCH.search(text) else split_idx).append(i)
    return base.in_batch_order(
      len(texts),
      (split_idx, self._encode_split([texts[i] for i in split_idx], encode_fn, split_fn)),
      (whole_idx, encode_fn([texts[i] for i in whole_idx])),
    )

  def _encode_split(
    self, texts: list[str], encode_fn: EncodeFn, split_fn: SplitFn | None
  ) -> list[list[int]]:
    chain = itertools.chain.from_iterable
    with base.gc_paused(), self._lock:  # many new lists of ints
      pieces = [t.split() for t in texts]
      get = self._ids.__getitem__
      rows: list = []
      append = rows.append
      redo = []  # the rows holding a piece not in the cache
      for p in pieces:
        try:
          append(list(chain(map(get, p))))
        except KeyError:
          redo.append(len(rows))
          append(None)
      if redo:
        needed = set(chain(pieces[i] for i in redo))
        self._add(needed.difference(self._ids), needed, encode_fn, split_fn)
        for i in redo:
          rows[i] = list(chain(map(get, pieces[i])))
      return rows

  def _add(
    self, new: set[str], needed: set[str], encode_fn: EncodeFn, split_fn: SplitFn | None
  ) -> None:
    """Caches the ids of the pieces ``new`` (none of them cached; the lock held). Where that
    would pass max_entries, the cache starts again empty with the pieces ``needed`` alone."""
    parts_of, direct = _plan(new, split_fn)
    direct = direct.difference(self._ids)  # walks `direct` (difference_update walks the cache)
    if len(self._ids) + len(direct) + len(parts_of) > self.max_entries:
      self._ids.clear()
      parts_of, direct = _plan(needed, split_fn)
    direct = list(direct)
    self._ids.update(zip(direct, encode_fn(direct)))
    get, chain = self._ids.__getitem__, itertools.chain.from_iterable
    self._ids.update({p: list(chain(map(get, parts))) for p, parts in parts_of.items()})


def _plan(pieces: set[str], split_fn: SplitFn | None) -> tuple[dict[str, list[str]], set[str]]:
  """({piece: its parts} for the pieces split_fn splits, the strings the encoder must see: the
  other pieces and every part)."""
  parts_of = {}
  if split_fn is not None:
    parts_of = {p: parts for p in pieces if (parts := split_fn(p)) is not None}
  direct = pieces.difference(parts_of)
  direct.update(itertools.chain.from_iterable(parts_of.values()))
  return parts_of, direct
