"""BERT's tokenizers (WordPiece and SentencePiece) behind one interface, and vocab building.

``load_tokenizer(path)`` takes a ``vocab.txt``, a SentencePiece ``.model``, or a directory (a
bert_jax workdir or a Hugging Face model directory) holding either.
"""

from __future__ import annotations

import os
import pathlib

from bert_jax.tokenize.base import (
  SPECIAL_TOKENS,
  TOKENIZER_CONFIG,
  Tokenizer,
  decode_line,
  iter_text_lines,
)
from bert_jax.tokenize.sentencepiece import MODEL_FILE, SentencePieceTokenizer
from bert_jax.tokenize.wordpiece import VOCAB_FILE, WordPieceTokenizer

__all__ = [
  "SPECIAL_TOKENS",
  "TOKENIZER_CONFIG",
  "SentencePieceTokenizer",
  "Tokenizer",
  "WordPieceTokenizer",
  "decode_line",
  "find_tokenizer_file",
  "iter_text_lines",
  "load_tokenizer",
]


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


def load_tokenizer(path: str | os.PathLike, do_lower_case: bool | None = None) -> Tokenizer:
  """Loads the tokenizer of a vocab.txt, a SentencePiece .model, or a directory holding one.

  Args:
    path: the file, or a directory (see find_tokenizer_file).
    do_lower_case: None reads it from tokenizer_config.json beside the file when present, else
      True for WordPiece (as BERT-uncased) and False for SentencePiece.
  """
  path = pathlib.Path(path)
  if path.is_dir():
    path = find_tokenizer_file(path)
  elif not path.is_file():
    raise ValueError(f"{path}: no such tokenizer file or directory")
  if _is_sentencepiece(path):
    return SentencePieceTokenizer.from_file(path, do_lower_case=do_lower_case)
  return WordPieceTokenizer.from_file(path, do_lower_case=do_lower_case)
