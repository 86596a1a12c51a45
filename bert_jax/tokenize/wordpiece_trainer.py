"""A deterministic WordPiece vocabulary trainer: the same corpus and arguments give the same
vocabulary, byte for byte, in any process (no hash order anywhere).

The algorithm is the one of ``tokenizers``' WordPieceTrainer (BPE with a continuation prefix):

1. words: each line normalized and pre-tokenized by the caller (BERT's pipeline), counted;
2. alphabet: the ``limit_alphabet`` most frequent characters (count over all word occurrences,
   ties broken by the character); characters outside it are dropped from the words;
3. initial symbols: a word's first character as is, each later one as "##" + character;
4. merges: repeatedly the most frequent adjacent pair of symbols (summed over word occurrences;
   at least ``min_frequency``) becomes one symbol, the second part losing its "##", until the
   vocabulary reaches ``vocab_size``. A merge whose result is already a token (two pairs can
   spell the same string) adds no token.

Token ids are a function of the strings alone: the given special tokens, the alphabet's
characters by code point, the "##" characters by code point, then the merged tokens in merge
order (the output order). Ties between pairs of equal count go to the pair of smaller ids (the
first part's, then the second's), as in ``tokenizers``, whose ids for the "##" characters follow
hash order instead (hence its builds differ from run to run near ties, and from this one).

Pair counts are kept incrementally: an index pair -> words holding it (stale entries are
skipped) and a max-heap with lazy deletion (an entry whose count is out of date is re-pushed
with the current one when it surfaces).
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Callable, Iterable, Sequence

from bert_jax.tokenize.piece_cache import SPLIT_MISMATCH
from bert_jax.tokenize.wordpiece import CONTINUATION_PREFIX


def count_words(lines: Iterable[str], split: Callable[[str], Sequence[str]]) -> dict[str, int]:
  """Occurrences of each word of ``split(line)`` over ``lines``, where ``split`` is BERT's
  normalizer and pre-tokenizer: each distinct whitespace piece is split once (the pipeline acts
  within a piece; piece_cache.py), a line holding a character where ``str.split()`` and BERT
  disagree (piece_cache.SPLIT_MISMATCH) whole."""
  pieces: collections.Counter[str] = collections.Counter()
  counts: collections.Counter[str] = collections.Counter()
  for line in lines:
    if SPLIT_MISMATCH.search(line):
      counts.update(split(line))
    else:
      pieces.update(line.split())
  for piece, n in pieces.items():
    for word in split(piece):
      counts[word] += n
  counts.pop("", None)
  return dict(counts)


def alphabet(word_counts: dict[str, int], limit_alphabet: int | None) -> list[str]:
  """The kept characters sorted by code point: the ``limit_alphabet`` most frequent (ties: the
  smaller character first), all when the limit is None."""
  char_counts: collections.Counter[str] = collections.Counter()
  for word, count in word_counts.items():
    for char, n in collections.Counter(word).items():
      char_counts[char] += n * count
  chars = sorted(char_counts, key=lambda c: (-char_counts[c], c))
  if limit_alphabet is not None:
    chars = chars[: max(limit_alphabet, 0)]
  return sorted(chars)


def _pairs(symbols: list[int]) -> list[tuple[int, int]]:
  return list(zip(symbols, symbols[1:]))


def _merge_word(symbols: list[int], a: int, b: int, new: int) -> list[int]:
  """``symbols`` with every occurrence of (a, b), left to right without overlap, replaced."""
  out: list[int] = []
  i, n = 0, len(symbols)
  while i < n:
    if i + 1 < n and symbols[i] == a and symbols[i + 1] == b:
      out.append(new)
      i += 2
    else:
      out.append(symbols[i])
      i += 1
  return out


def train_wordpiece(
  word_counts: dict[str, int],
  vocab_size: int,
  *,
  special_tokens: Sequence[str] = (),
  min_frequency: int = 0,
  limit_alphabet: int | None = None,
  prefix: str = CONTINUATION_PREFIX,
) -> list[str]:
  """The vocabulary (tokens in id order) learned from ``word_counts`` (word -> occurrences).

  Everything the initial symbols need is kept even when it exceeds ``vocab_size`` (as
  ``tokenizers``); merges then stop at ``vocab_size`` tokens or when no pair occurs at least
  ``min_frequency`` (and at least once).
  """
  tokens: list[str] = []
  ids: dict[str, int] = {}

  def add(token: str) -> int:
    if token not in ids:
      ids[token] = len(tokens)
      tokens.append(token)
    return ids[token]

  for token in special_tokens:
    add(token)
  chars = alphabet(word_counts, limit_alphabet)
  for char in chars:
    add(char)
  kept = set(chars)
  # Words in sorted order: symbol lists and counts are indexed deterministically.
  spelled = []
  continued = set()
  for word in sorted(word_counts):
    kept_chars = [c for c in word if c in kept]
    if kept_chars:
      spelled.append((kept_chars, word_counts[word]))
      continued.update(kept_chars[1:])
  for char in sorted(continued):
    add(prefix + char)
  words = [[ids[c[0]]] + [ids[prefix + ch] for ch in c[1:]] for c, _ in spelled]
  counts = [count for _, count in spelled]

  pair_counts: collections.defaultdict[tuple[int, int], int] = collections.defaultdict(int)
  where: collections.defaultdict[tuple[int, int], set[int]] = collections.defaultdict(set)
  for w, symbols in enumerate(words):
    for pair in _pairs(symbols):
      pair_counts[pair] += counts[w]
      where[pair].add(w)
  heap = [(-n, a, b) for (a, b), n in pair_counts.items()]
  heapq.heapify(heap)
  min_count = max(min_frequency, 1)
  while len(tokens) < vocab_size and heap:
    neg, a, b = heapq.heappop(heap)
    count = pair_counts.get((a, b), 0)
    if count != -neg:  # out of date: re-queue with the current count
      if count > 0:
        heapq.heappush(heap, (-count, a, b))
      continue
    if count < min_count:
      break
    second = tokens[b]
    new = add(tokens[a] + (second[len(prefix) :] if second.startswith(prefix) else second))
    changed: collections.Counter[tuple[int, int]] = collections.Counter()
    for w in where.pop((a, b), ()):
      symbols = words[w]
      merged = _merge_word(symbols, a, b, new)
      if len(merged) == len(symbols):
        continue  # a stale index entry: the pair left this word in an earlier merge
      for pair in _pairs(symbols):
        changed[pair] -= counts[w]
      for pair in _pairs(merged):
        changed[pair] += counts[w]
        where[pair].add(w)
      words[w] = merged
    for pair, delta in changed.items():
      if delta == 0:
        continue
      pair_counts[pair] += delta
      if pair_counts[pair] <= 0:
        del pair_counts[pair]
      elif delta > 0:
        heapq.heappush(heap, (-pair_counts[pair], *pair))
  return tokens
