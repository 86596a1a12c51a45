"""BERT's WordPiece tokenizer from a ``vocab.txt``, run by Hugging Face ``tokenizers`` (Rust).

The pipeline is google-research/bert's ``FullTokenizer`` as Hugging Face's reference
``transformers.BertTokenizer`` runs it: text clean-up (drop NUL, U+FFFD and control characters,
map whitespace to " "), spaces around CJK ideographs, Unicode NFC, then when uncased
lower-casing and accent stripping (NFD, drop non-spacing marks), split on whitespace and
punctuation, then greedy longest-match-first pieces with the "##" prefix; a word longer than
100 characters, or one with no complete split into pieces, is a single [UNK].
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import unicodedata
from collections.abc import Sequence

from absl import logging
from tokenizers import AddedToken, Regex, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as RustTokenizer

from bert_jax.tokenize import base, charclasses, piece_cache

VOCAB_FILE = "vocab.txt"
CONTINUATION_PREFIX = "##"
MAX_INPUT_CHARS_PER_WORD = 100
_CLEAN_UP = (
  (" .", "."),
  (" ?", "?"),
  (" !", "!"),
  (" ,", ","),
  (" ' ", "'"),
  (" n't", "n't"),
  (" 'm", "'m"),
  (" 's", "'s"),
  (" 've", "'ve"),
  (" 're", "'re"),
)
_SURROGATES = re.compile("[\ud800-\udfff]")
# BERT's split of ASCII without whitespace or control characters: runs of letters and digits,
# and every other character alone (each printable ASCII character that is not a letter, digit
# or space is punctuation to the reference's _is_punctuation).
_ASCII_WORDS = re.compile("[A-Za-z0-9]+|[^A-Za-z0-9]")
_ASCII_CONTROL = re.compile("[\x00-\x1f\x7f]")


def read_vocab(path: str | os.PathLike) -> list[str]:
  """The tokens of a BERT ``vocab.txt`` (one per line, id = 0-based line number), checked.

  Raises ValueError naming the file and line for bytes that are not UTF-8, an empty line, or a
  token seen before (naming both lines).
  """
  path = pathlib.Path(path)
  try:
    data = path.read_bytes()
  except OSError as e:
    raise ValueError(f"{path}: cannot read the vocabulary: {e.strerror}") from None
  lines = data.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()  # the newline that ends the last line
  tokens: list[str] = []
  first_line: dict[str, int] = {}
  for lineno, raw in enumerate(lines, start=1):
    token = base.decode_line(raw.rstrip(b"\r"), path, lineno)
    if not token:
      raise ValueError(
        f"{path}:{lineno}: empty line in the vocabulary (every line is a token "
        f"whose id is its line number - 1)"
      )
    if token in first_line:
      raise ValueError(
        f"{path}:{lineno}: duplicate token {token!r} (already on line "
        f"{first_line[token]}); each token must appear once"
      )
    first_line[token] = lineno
    tokens.append(token)
  if not tokens:
    raise ValueError(f"{path}: the vocabulary is empty")
  return tokens


def write_vocab(tokens: Sequence[str], path: str | os.PathLike) -> str:
  """Writes tokens one per line (UTF-8, "\\n" line ends), the layout of BERT's vocab.txt."""
  with open(path, "w", encoding="utf-8", newline="\n") as f:
    for token in tokens:
      f.write(token + "\n")
  return str(path)


def _warn_on_case_mismatch(tokens: Sequence[str], do_lower_case: bool, source: str) -> None:
  """Logs a warning when the vocabulary's case does not fit do_lower_case (a common mistake:
  loading a cased vocabulary uncased, or the reverse, silently maps many words to other ids)."""
  words = [
    t for t in tokens if not (t.startswith("[") and t.endswith("]")) and any(c.isalpha() for c in t)
  ]
  upper = sum(1 for t in words if any(c.isupper() for c in t))
  if do_lower_case and upper > max(20, 0.02 * len(words)):
    logging.warning(
      "%s: %d of %d word tokens hold capitals (a cased vocabulary?) but do_lower_case=True: "
      "they can never match; pass do_lower_case=False or write tokenizer_config.json",
      source,
      upper,
      len(words),
    )
  elif not do_lower_case and len(words) > 1000 and upper < 0.001 * len(words):
    logging.warning(
      "%s: no word token holds capitals (an uncased vocabulary?) but do_lower_case=False: "
      "capitalised words will split badly; pass do_lower_case=True",
      source,
    )


class WordPieceTokenizer(base.Tokenizer):
  """BERT's WordPiece: ids identical to ``transformers.BertTokenizer`` (the slow reference).

  Args:
    tokens: the vocabulary; id i is ``tokens[i]``.
    do_lower_case: lower-case (and by default strip accents) before splitting, as for the
      "uncased" BERT models.
    strip_accents: None follows do_lower_case (BERT's rule); True/False force it.
    tokenize_chinese_chars: put spaces around CJK ideographs so each is a word.
    max_input_chars_per_word: a longer word is one [UNK].
    split_special_tokens: True (the default, as google-research/bert) treats "[MASK]" etc. in
      the text as text ("[", "mask", "]"), so no corpus can inject special ids; False maps
      them to their ids, as Hugging Face's tokenizers do by default (e.g. a fill-mask prompt).
    source: where the vocabulary came from, named in error messages.
  """

  kind = "wordpiece"

  def __init__(
    self,
    tokens: Sequence[str],
    do_lower_case: bool = True,
    strip_accents: bool | None = None,
    tokenize_chinese_chars: bool = True,
    max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD,
    split_special_tokens: bool = True,
    source: str = "<vocab>",
  ):
    super().__init__(tokens, do_lower_case, source)
    self.strip_accents = strip_accents
    self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
    strip = self.do_lower_case if strip_accents is None else bool(strip_accents)
    model = models.WordPiece(
      vocab=dict(self._ids),
      unk_token=base.UNK,
      continuing_subword_prefix=CONTINUATION_PREFIX,
      max_input_chars_per_word=max_input_chars_per_word,
    )
    self._model, self._strip = model, strip
    self.split_special_tokens = bool(split_special_tokens)
    # ASCII text (most of an English corpus; str.isascii() is O(1)) needs none of the Unicode
    # corrections: a leaner pipeline, exact on ASCII, encodes it. The full one (`_rust`) is
    # built when the first other text arrives.
    ascii_rust = RustTokenizer(model)
    ascii_rust.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=False, strip_accents=False, lowercase=self.do_lower_case
    )
    ascii_rust.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    self._ascii_rust = self._with_special_tokens(ascii_rust)
    # Batches are tokenized a distinct whitespace piece at a time (piece_cache.py).
    self._piece_cache = piece_cache.PieceCache()
    _warn_on_case_mismatch(self._tokens, self.do_lower_case, source)

  @functools.cached_property
  def _rust(self) -> RustTokenizer:
    """The full pipeline, for text that is not all ASCII; built on first use (deriving its
    character classes from unicodedata takes about a second)."""
    rust = RustTokenizer(self._model)
    rust.normalizer = self._normalizer(self._strip)
    # Rust's split on whitespace and punctuation, then also on what the reference counts as
    # punctuation or CJK (Unicode added some since Rust's tables).
    split_class = charclasses.reference_classes()[
      "punct_cjk" if self.tokenize_chinese_chars else "punct"
    ]
    rust.pre_tokenizer = pre_tokenizers.Sequence(
      [
        pre_tokenizers.BertPreTokenizer(),
        pre_tokenizers.Split(Regex(split_class), behavior="isolated"),
      ]
    )
    return self._with_special_tokens(rust)

  def _with_special_tokens(self, rust: RustTokenizer) -> RustTokenizer:
    if not self.split_special_tokens:
      # Matched in the raw text, case-sensitively, before normalization (as the reference).
      rust.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in base.SPECIAL_TOKENS]
      )
    return rust

  def _normalizer(self, strip: bool) -> normalizers.Normalizer:
    """The reference's steps in its order: clean-up and CJK spacing, NFC, case and accents."""
    classes = charclasses.reference_classes()
    steps = [normalizers.Replace(Regex(classes["control"]), "")]  # what Rust's tables keep
    placeholder = next(
      (
        c
        for c in charclasses.PLACEHOLDER_CANDIDATES
        if c not in self._ids and CONTINUATION_PREFIX + c not in self._ids
      ),
      None,
    )
    for char in charclasses.RECLASSIFIED_WORD_CHARS:
      is_mark = unicodedata.category(char) == "Mn"
      in_vocab = char in self._ids or CONTINUATION_PREFIX + char in self._ids
      if placeholder and not in_vocab and not (strip and is_mark):
        steps.append(normalizers.Replace(char, placeholder))
    steps += [
      normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=self.tokenize_chinese_chars,
        strip_accents=False,
        lowercase=False,
      ),
      normalizers.NFC(),
      normalizers.BertNormalizer(
        clean_text=False,
        handle_chinese_chars=False,
        strip_accents=strip,
        lowercase=self.do_lower_case,
      ),
    ]
    if strip:
      steps.append(normalizers.Replace(Regex(classes["mark"]), ""))
    return normalizers.Sequence(steps)

  @classmethod
  def from_file(
    cls, path: str | os.PathLike, do_lower_case: bool | None = None, **kwargs
  ) -> WordPieceTokenizer:
    """Reads ``vocab.txt``; do_lower_case None -> tokenizer_config.json beside it, else True."""
    path = pathlib.Path(path)
    config = base.read_tokenizer_config(path.parent)
    if do_lower_case is None:
      do_lower_case = config.get("do_lower_case", True)
    # Hugging Face's tokenizer_config.json keys (null strip_accents: follow do_lower_case).
    if "strip_accents" in config:
      kwargs.setdefault("strip_accents", config["strip_accents"])
    if config.get("tokenize_chinese_chars") is not None:
      kwargs.setdefault("tokenize_chinese_chars", bool(config["tokenize_chinese_chars"]))
    return cls(read_vocab(path), do_lower_case=do_lower_case, source=str(path), **kwargs)

  def _encode(self, texts: list[str], fast: bool) -> list:
    texts = [base.check_text(t) for t in texts]
    ascii_idx = [i for i, t in enumerate(texts) if t.isascii()]
    if len(ascii_idx) == len(texts):
      return self._run(self._ascii_rust, texts, fast)
    if not ascii_idx:
      return self._run(self._rust, texts, fast)
    is_ascii = set(ascii_idx)
    other_idx = [i for i in range(len(texts)) if i not in is_ascii]
    return base.in_batch_order(
      len(texts),
      *(
        (idx, self._run(rust, [texts[i] for i in idx], fast))
        for idx, rust in ((ascii_idx, self._ascii_rust), (other_idx, self._rust))
      ),
    )

  @staticmethod
  def _run(rust: RustTokenizer, texts: list[str], fast: bool) -> list:
    # encode_batch_fast skips offset tracking (and so fills no token strings): ids only.
    encode = getattr(rust, "encode_batch_fast", rust.encode_batch) if fast else rust.encode_batch
    try:
      return encode(texts, add_special_tokens=False)
    except TypeError:
      # Lone surrogates (a str from bytes decoded with "surrogateescape") cannot cross into
      # Rust; the reference deletes them as control characters, and so do we.
      return encode([_SURROGATES.sub("", t) for t in texts], add_special_tokens=False)

  def tokenize(self, text: str) -> list[str]:
    return self._encode([text], fast=False)[0].tokens

  def encode(self, text: str) -> list[int]:
    return self._encode([text], fast=True)[0].ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """The ids of each text; each distinct whitespace piece is tokenized once per cache
    lifetime (piece_cache.py: the same ids as tokenizing each text whole)."""
    split = self._ascii_words if self.split_special_tokens else None
    return self._piece_cache.encode(texts, self._encode_uncached, split)

  def tokenize_batch(self, texts: Sequence[str]) -> list[list[str]]:
    vocab = self._tokens
    return [[vocab[i] for i in ids] for ids in self.encode_batch(texts)]

  def clear_cache(self) -> None:
    """Empties the cache of tokenized pieces that encode_batch keeps (bounded in size)."""
    self._piece_cache.clear()

  def _ascii_words(self, piece: str) -> list[str] | None:
    """The words BERT splits a whitespace-free piece of ASCII into, lower-cased when uncased
    (all that normalization does to ASCII); None for a piece with a non-ASCII or control
    character. The cache then tokenizes "Hello," and "hello" as "hello" and "," (fewer
    distinct strings through the pipeline; the same ids). Not with split_special_tokens=False,
    where "[MASK]" must stay whole."""
    if not piece.isascii() or _ASCII_CONTROL.search(piece):
      return None
    return _ASCII_WORDS.findall(piece.lower() if self.do_lower_case else piece)

  def _encode_uncached(self, texts: list[str]) -> list[list[int]]:
    """The ids of each text, tokenized whole (what the cache is filled from)."""
    return [e.ids for e in self._encode(texts, fast=True)]

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Ids -> text: pieces joined with spaces, "##" pieces glued on, then the spaces before
    punctuation and English clitics removed (the clean-up of transformers' decode)."""
    tokens = self.convert_ids_to_tokens(ids)
    if skip_special_tokens:
      special = set(self.special_ids)
      tokens = [t for t, i in zip(tokens, ids) if int(i) not in special]
    text = " ".join(tokens).replace(" " + CONTINUATION_PREFIX, "").strip()
    for before, after in _CLEAN_UP:
      text = text.replace(before, after)
    return text

  def is_word_start(self, token: str) -> bool:
    return not token.startswith(CONTINUATION_PREFIX)

  def save(self, directory: str | os.PathLike) -> list[str]:
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    extra = {}
    if self.strip_accents is not None:
      extra["strip_accents"] = bool(self.strip_accents)
    if not self.tokenize_chinese_chars:
      extra["tokenize_chinese_chars"] = False
    return [write_vocab(self._tokens, directory / VOCAB_FILE), self._write_config(directory, extra)]
