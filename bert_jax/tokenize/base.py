"""The one tokenizer interface every bert_jax pipeline uses, and the text-decoding policy.

Both kinds of vocabulary (WordPiece ``vocab.txt`` and SentencePiece ``.model``) sit behind
:class:`Tokenizer`. Tokenizers take ``str``: readers decode bytes themselves, with
:func:`decode_line` when they want the project's policy (strict UTF-8, errors name the file and
line; or ``errors="replace"``, which turns bad bytes into U+FFFD, a character BERT's text
clean-up then deletes).
"""

from __future__ import annotations

import abc
import contextlib
import gc
import json
import os
import pathlib
from collections.abc import Iterable, Sequence

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# BERT's special tokens in the order of the fixed ids of vocabularies bert_jax builds (0..4).
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, CLS, SEP, MASK)
TOKENIZER_CONFIG = "tokenizer_config.json"
DECODE_ERRORS = ("strict", "replace")


def decode_line(data: bytes, path: str | os.PathLike, lineno: int, errors: str = "strict") -> str:
  """Decodes one line of a UTF-8 text file (the project's policy for bytes read from corpora).

  Args:
    data: the raw bytes of the line.
    path: the file it came from, for the error message.
    lineno: its 1-based line number, for the error message.
    errors: "strict" raises ValueError naming ``path:lineno`` and the byte offset; "replace"
      puts U+FFFD for each bad sequence (BERT's clean-up then drops U+FFFD, so the rest of the
      line is kept and tokenized as if the bad bytes were absent).
  """
  if errors not in DECODE_ERRORS:
    raise ValueError(f"errors must be one of {DECODE_ERRORS}, got {errors!r}")
  try:
    return data.decode("utf-8", errors=errors)
  except UnicodeDecodeError as e:
    bad = data[e.start : e.end]
    raise ValueError(
      f"{path}:{lineno}: not valid UTF-8 (bytes {bad!r} at byte {e.start} of the line); fix "
      f"the file or decode with errors='replace'"
    ) from None


def iter_text_lines(path: str | os.PathLike, errors: str = "strict") -> Iterable[str]:
  """Yields the lines of a UTF-8 text file without their line ends, decoded by decode_line."""
  with open(path, "rb") as f:
    for lineno, raw in enumerate(f, start=1):
      yield decode_line(raw.rstrip(b"\r\n"), path, lineno, errors)


def read_tokenizer_config(directory: str | os.PathLike) -> dict:
  """The JSON object in ``directory/tokenizer_config.json``, or {} where there is none."""
  path = pathlib.Path(directory) / TOKENIZER_CONFIG
  if not path.is_file():
    return {}
  try:
    config = json.loads(path.read_text(encoding="utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: not a valid JSON file: {e}") from None
  if not isinstance(config, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
  if "do_lower_case" in config and not isinstance(config["do_lower_case"], bool):
    raise ValueError(
      f"{path}: key 'do_lower_case' must be true or false, got {config['do_lower_case']!r}"
    )
  return config


def in_batch_order(count: int, *parts) -> list:
  """Results computed for parts of a batch, put back in the batch's order. Each part is
  (indices into the batch, one result per index); together the parts cover ``count`` items."""
  out: list = [None] * count
  for indices, results in parts:
    for i, result in zip(indices, results):
      out[i] = result
  return out


@contextlib.contextmanager
def gc_paused():
  """The cyclic garbage collector off while a batch's many small lists of ints are built (its
  passes over them are wasted work), as it was after."""
  enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if enabled:
      gc.enable()


def check_text(text) -> str:
  if isinstance(text, str):
    return text
  if isinstance(text, (bytes, bytearray)):
    raise TypeError(
      "tokenizers take str, got bytes: decode first, e.g. with "
      "bert_jax.tokenize.decode_line(data, path, lineno)"
    )
  raise TypeError(f"tokenizers take str, got {type(text).__name__}")


class Tokenizer(abc.ABC):
  """A BERT tokenizer: text -> tokens -> ids, with BERT's five special tokens.

  ``encode`` never adds special tokens and never produces them from text: a literal "[MASK]" in
  the input is text like any other (as in google-research/bert), so data cannot inject ids.
  """

  kind: str  # "wordpiece" or "sentencepiece"

  def __init__(
    self,
    tokens: Sequence[str],
    do_lower_case: bool,
    source: str,
    aliases: dict[str, int] | None = None,
  ):
    """``aliases`` gives the id of a special token spelled otherwise (e.g. SentencePiece's
    "<unk>" serving as [UNK])."""
    self._tokens = list(tokens)
    self._ids = {t: i for i, t in enumerate(self._tokens)}
    self.do_lower_case = bool(do_lower_case)
    self.source = source
    special = {t: self._ids[t] for t in SPECIAL_TOKENS if t in self._ids}
    special.update(aliases or {})
    missing = [t for t in SPECIAL_TOKENS if t not in special]
    if missing:
      raise ValueError(
        f"{source}: vocabulary lacks BERT special token(s) {', '.join(missing)} "
        f"(a BERT vocabulary needs all of {', '.join(SPECIAL_TOKENS)})"
      )
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
      special[t] for t in SPECIAL_TOKENS
    )

  @property
  def vocab_size(self) -> int:
    return len(self._tokens)

  @property
  def special_ids(self) -> tuple[int, ...]:
    """Ids of [PAD], [UNK], [CLS], [SEP], [MASK] in that order."""
    return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)

  def get_vocab(self) -> dict[str, int]:
    """A copy of the token -> id mapping."""
    return dict(self._ids)

  @abc.abstractmethod
  def tokenize(self, text: str) -> list[str]:
    """Text -> tokens (no special tokens added)."""

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Text -> ids (no special tokens added); "" -> []."""

  @abc.abstractmethod
  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Many texts -> ids, in parallel where the backend can."""

  @abc.abstractmethod
  def tokenize_batch(self, texts: Sequence[str]) -> list[list[str]]:
    """Many texts -> tokens, in parallel where the backend can."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Ids -> text (WordPiece joins "##" pieces; SentencePiece detokenizes exactly)."""

  @abc.abstractmethod
  def is_word_start(self, token: str) -> bool:
    """Whether ``token`` begins a word (whole-word masking groups a start with what follows)."""

  @abc.abstractmethod
  def save(self, directory: str | os.PathLike) -> list[str]:
    """Writes the vocabulary file and tokenizer_config.json into ``directory``; returns paths."""

  def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
    """Tokens -> ids; a token not in the vocabulary maps to unk_id."""
    get, unk = self._ids.get, self.unk_id
    return [get(t, unk) for t in tokens]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    """Ids -> tokens; an id outside [0, vocab_size) raises ValueError."""
    out = []
    n = len(self._tokens)
    for i in ids:
      i = int(i)
      if not 0 <= i < n:
        raise ValueError(f"token id {i} is outside the vocabulary [0, {n}) of {self.source}")
      out.append(self._tokens[i])
    return out

  def _write_config(self, directory: pathlib.Path, extra: dict | None = None) -> str:
    config = {"do_lower_case": self.do_lower_case, "tokenizer_kind": self.kind}
    config.update(extra or {})
    path = directory / TOKENIZER_CONFIG
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return str(path)

  def __repr__(self) -> str:
    return (
      f"{type(self).__name__}(vocab_size={self.vocab_size}, "
      f"do_lower_case={self.do_lower_case}, source={self.source!r})"
    )
