"""BERT's tokenizers (WordPiece and SentencePiece) behind one interface, and vocab building.

``load_tokenizer(path)`` takes a ``vocab.txt``, a SentencePiece ``.model``, or a directory (a
bert_jax workdir or a Hugging Face model directory) holding either. For WordPiece, ``backend``
picks the reference or the fast path (bert_jax/tokenize/fast.py; same ids).
"""

from __future__ import annotations

import os
import pathlib

from absl import logging

from bert_jax.tokenize.base import (
  SPECIAL_TOKENS,
  TOKENIZER_CONFIG,
  Tokenizer,
  decode_line,
  iter_text_lines,
)
from bert_jax.tokenize.fast import (
  FastUnavailable,
  FastWordPieceTokenizer,
  tf_text_requirement,
)
from bert_jax.tokenize.sentencepiece import MODEL_FILE, SentencePieceTokenizer
from bert_jax.tokenize.wordpiece import VOCAB_FILE, WordPieceTokenizer

__all__ = [
  "BACKENDS",
  "SPECIAL_TOKENS",
  "TOKENIZER_CONFIG",
  "FastWordPieceTokenizer",
  "SentencePieceTokenizer",
  "Tokenizer",
  "WordPieceTokenizer",
  "decode_line",
  "find_tokenizer_file",
  "iter_text_lines",
  "load_tokenizer",
  "tf_text_requirement",
]

# "auto": the fast WordPiece path when its library is installed, else the reference (logged);
# "fast": the same, with a warning when it falls back; "reference": WordPieceTokenizer.
BACKENDS = ("auto", "fast", "reference")


def find_tokenizer_file(directory: str | os.PathLike) -> pathlib.Path:
  """The vocabulary file in ``directory``: vocab.txt, else sentencepiece.model, else the only
  *.model file; a clear error otherwise."""
  directory = pathlib.Path(directory)
  for name in (VOCAB_FILE, MODEL_FILE):
    if (directory / name).is_file():
      return directory / name
  models = sorted(directory.glob("*.model"))
  if len(models) == 1:
    return models[0]
  if models:
    names = ", ".join(m.name for m in models)
    raise ValueError(f"{directory}: several SentencePiece models ({names}); pass the one to use")
  raise ValueError(
    f"{directory}: no tokenizer found (looked for {VOCAB_FILE}, {MODEL_FILE} or a *.model file)"
  )


def _is_sentencepiece(path: pathlib.Path) -> bool:
  if path.suffix == ".model":
    return True
  if path.suffix == ".txt":
    return False
  with open(path, "rb") as f:
    head = f.read(4096)
  try:
    head.decode("utf-8")
    return False  # text: a vocab.txt under another name
  except UnicodeDecodeError as e:
    return e.start < len(head) - 4  # binary (a protobuf), not a multi-byte char cut at the end


def load_tokenizer(
  path: str | os.PathLike, do_lower_case: bool | None = None, backend: str = "auto"
) -> Tokenizer:
  """Loads the tokenizer of a vocab.txt, a SentencePiece .model, or a directory holding one.

  Args:
    path: the file, or a directory (see find_tokenizer_file).
    do_lower_case: None reads it from tokenizer_config.json beside the file when present, else
      True for WordPiece (as BERT-uncased) and False for SentencePiece.
    backend: for WordPiece, one of BACKENDS: "auto" (default) and "fast" give a
      FastWordPieceTokenizer (tensorflow-text on eligible texts of a batch; ids identical to
      the reference) when tensorflow-text is installed, else log why and give the reference
      WordPieceTokenizer; "reference" always gives the reference. SentencePiece ignores it.
  """
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
  path = pathlib.Path(path)
  if path.is_dir():
    path = find_tokenizer_file(path)
  elif not path.is_file():
    raise ValueError(f"{path}: no such tokenizer file or directory")
  if _is_sentencepiece(path):
    return SentencePieceTokenizer.from_file(path, do_lower_case=do_lower_case)
  if backend != "reference":
    try:
      return FastWordPieceTokenizer.from_file(path, do_lower_case=do_lower_case)
    except FastUnavailable as e:
      log = logging.warning if backend == "fast" else logging.info
      reason = str(e)
      log("%s: fast WordPiece unavailable, using the reference tokenizer: %s", path, reason)
  return WordPieceTokenizer.from_file(path, do_lower_case=do_lower_case)
