"""SentencePiece (unigram or BPE) models behind BERT's tokenizer interface.

Models bert_jax builds put BERT's special tokens at fixed ids: [PAD]=0, [UNK]=1, [CLS]=2,
[SEP]=3, [MASK]=4 ([PAD] and [UNK] as SentencePiece's pad and unknown pieces, the other three
as control symbols, which text can never produce). Other models load too when they have
"[CLS]", "[SEP]" and "[MASK]" pieces (ALBERT's do); their own pad and unknown pieces serve as
[PAD] and [UNK].
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

import sentencepiece as spm

from bert_jax.tokenize import base

MODEL_FILE = "sentencepiece.model"
WORD_START = "\u2581"  # "▁": SentencePiece's mark of a piece that begins after a space


class SentencePieceTokenizer(base.Tokenizer):
  """A SentencePiece model; do_lower_case lower-cases text (Python ``str.lower``) first."""

  kind = "sentencepiece"

  def __init__(
    self, model_proto: bytes, do_lower_case: bool = False, source: str = "<sentencepiece>"
  ):
    sp = spm.SentencePieceProcessor()
    try:
      sp.LoadFromSerializedProto(model_proto)
    except (RuntimeError, OSError) as e:
      raise ValueError(f"{source}: not a SentencePiece model ({e})") from None
    self._sp = sp
    self._proto = bytes(model_proto)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    # The model's own unknown (and pad, where it has one) stand in for [UNK] and [PAD].
    aliases = {base.UNK: sp.unk_id()}
    if base.PAD not in pieces and sp.pad_id() >= 0:
      aliases[base.PAD] = sp.pad_id()
    super().__init__(pieces, do_lower_case, source, aliases=aliases)
    self._special = {i for i in self.special_ids}
    self._num_threads = max(1, min(os.cpu_count() or 1, 16))

  @classmethod
  def from_file(
    cls, path: str | os.PathLike, do_lower_case: bool | None = None
  ) -> SentencePieceTokenizer:
    """Reads a ``.model``; do_lower_case None -> tokenizer_config.json beside it, else False."""
    path = pathlib.Path(path)
    try:
      proto = path.read_bytes()
    except OSError as e:
      raise ValueError(f"{path}: cannot read the SentencePiece model: {e.strerror}") from None
    if do_lower_case is None:
      do_lower_case = base.read_tokenizer_config(path.parent).get("do_lower_case", False)
    return cls(proto, do_lower_case=do_lower_case, source=str(path))

  def _prepare(self, text: str) -> str:
    text = base.check_text(text)
    return text.lower() if self.do_lower_case else text

  def tokenize(self, text: str) -> list[str]:
    return self._sp.encode(self._prepare(text), out_type=str)

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(self._prepare(text), out_type=int)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    texts = [self._prepare(t) for t in texts]
    return self._sp.encode(texts, out_type=int, num_threads=self._num_threads)

  def tokenize_batch(self, texts: Sequence[str]) -> list[list[str]]:
    texts = [self._prepare(t) for t in texts]
    return self._sp.encode(texts, out_type=str, num_threads=self._num_threads)

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    ids = [int(i) for i in ids]
    self.convert_ids_to_tokens(ids)  # range check with a clear error
    if skip_special_tokens:
      return self._sp.decode([i for i in ids if i not in self._special])
    parts, run = [], []
    for i in ids:
      if i in self._special:
        if run:
          parts.append(self._sp.decode(run))
          run = []
        parts.append(self._tokens[i])
      else:
        run.append(i)
    if run:
      parts.append(self._sp.decode(run))
    return " ".join(parts)

  def is_word_start(self, token: str) -> bool:
    if token in self._ids and self._ids[token] in self._special:
      return True
    return token.startswith(WORD_START)

  def save(self, directory: str | os.PathLike) -> list[str]:
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MODEL_FILE
    path.write_bytes(self._proto)
    return [str(path), self._write_config(directory)]
