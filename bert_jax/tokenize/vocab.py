"""Building vocabularies from a corpus: WordPiece ``vocab.txt`` or a SentencePiece model.

Corpora are UTF-8 text files (``.gz`` and ``.bz2`` are read compressed), one sentence or
paragraph per line; blank lines are skipped. Bytes that are not UTF-8 raise an error naming the
file and line unless ``decode_errors="replace"``.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import os
import pathlib
from collections.abc import Iterable, Iterator, Sequence

import sentencepiece as spm
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import models, trainers

from bert_jax.tokenize import base, wordpiece_trainer
from bert_jax.tokenize.sentencepiece import SentencePieceTokenizer
from bert_jax.tokenize.wordpiece import (
  CONTINUATION_PREFIX,
  VOCAB_FILE,
  WordPieceTokenizer,
  write_vocab,
)

MODEL_TYPES = ("unigram", "bpe")
# "deterministic": bert_jax/tokenize/wordpiece_trainer.py (the same bytes in any process);
# "tokenizers": Hugging Face's WordPieceTrainer (multi-threaded; ties broken in hash order).
WORDPIECE_TRAINERS = ("deterministic", "tokenizers")


def expand_files(files: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
  """Paths and glob patterns (one, or a list; a string may hold several separated by commas)
  -> the sorted, de-duplicated files they name; a pattern that matches nothing is an error."""
  if isinstance(files, (str, os.PathLike)):
    files = [p for p in str(files).split(",") if p]
  out: list[str] = []
  for pattern in files:
    pattern = os.path.expanduser(str(pattern))
    matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not matches:
      raise ValueError(f"input {pattern!r} matches no file")
    out.extend(m for m in matches if m not in out)
  return out


def _open(path: str):
  if path.endswith(".gz"):
    return gzip.open(path, "rb")
  if path.endswith(".bz2"):
    return bz2.open(path, "rb")
  return open(path, "rb")


def iter_corpus(
  files: Sequence[str], decode_errors: str = "strict", lower: bool = False
) -> Iterator[str]:
  """The non-blank lines of ``files``, decoded by base.decode_line, optionally lower-cased."""
  for path in files:
    with _open(path) as f:
      for lineno, raw in enumerate(f, start=1):
        line = base.decode_line(raw.rstrip(b"\r\n"), path, lineno, decode_errors).strip()
        if line:
          yield line.lower() if lower else line


def _check_not_empty(paths: Sequence[str], decode_errors: str) -> None:
  """A corpus with no non-blank line is an error (it would build only the special tokens)."""
  for _ in iter_corpus(paths, decode_errors):
    return
  shown = ", ".join(paths[:3]) + (", ..." if len(paths) > 3 else "")
  raise ValueError(
    f"the corpus ({len(paths)} file(s): {shown}) has no non-blank line: nothing to build a "
    "vocabulary from"
  )


def _check_overwrite(path: pathlib.Path, overwrite: bool) -> None:
  if path.exists() and not overwrite:
    raise ValueError(f"{path} exists; pass overwrite=True (--overwrite) to replace it")


def corpus_stats(
  tokenizer: base.Tokenizer, files, max_lines: int = 20_000, decode_errors: str = "strict"
) -> dict:
  """How a tokenizer splits the first ``max_lines`` non-blank lines of a corpus: lines, words
  (whitespace-separated), tokens, tokens per word and the share of [UNK] tokens."""
  lines = []
  for line in iter_corpus(expand_files(files), decode_errors):
    lines.append(line)
    if len(lines) >= max_lines:
      break
  ids = tokenizer.encode_batch(lines)
  tokens = sum(map(len, ids))
  words = sum(len(line.split()) for line in lines)
  unk = sum(row.count(tokenizer.unk_id) for row in ids)
  return {
    "lines": len(lines),
    "words": words,
    "tokens": tokens,
    "tokens_per_word": tokens / max(words, 1),
    "unk_share": unk / max(tokens, 1),
  }


def _specials(num_unused: int) -> list[str]:
  if num_unused < 0:
    raise ValueError(f"num_unused must be >= 0, got {num_unused}")
  return list(base.SPECIAL_TOKENS) + [f"[unused{i}]" for i in range(num_unused)]


def _word_splitter(rust: RustTokenizer):
  """text -> its words under ``rust``'s normalizer and pre-tokenizer."""
  normalizer, pre_tokenizer = rust.normalizer, rust.pre_tokenizer

  def split(text: str) -> list[str]:
    return [word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]

  return split


def _train_with_tokenizers(
  rust: RustTokenizer,
  lines: Iterable[str],
  vocab_size: int,
  specials: list[str],
  min_frequency: int,
  limit_alphabet: int,
) -> list[str]:
  """``tokenizers``' WordPieceTrainer on ``rust``'s normalizer and pre-tokenizer."""
  model = RustTokenizer(
    models.WordPiece(unk_token=base.UNK, continuing_subword_prefix=CONTINUATION_PREFIX)
  )
  model.normalizer = rust.normalizer
  model.pre_tokenizer = rust.pre_tokenizer
  trainer = trainers.WordPieceTrainer(
    vocab_size=vocab_size,
    min_frequency=min_frequency,
    special_tokens=specials,
    limit_alphabet=limit_alphabet,
    continuing_subword_prefix=CONTINUATION_PREFIX,
    show_progress=False,
  )
  model.train_from_iterator(lines, trainer=trainer)
  vocab = model.get_vocab()
  return sorted(vocab, key=vocab.__getitem__)


def build_wordpiece_vocab(
  files,
  out_path: str | os.PathLike,
  vocab_size: int,
  do_lower_case: bool = True,
  *,
  min_frequency: int = 2,
  limit_alphabet: int = 1000,
  num_unused: int = 0,
  decode_errors: str = "strict",
  overwrite: bool = False,
  trainer: str = "deterministic",
) -> WordPieceTokenizer:
  """Trains a WordPiece vocabulary with BERT's text pipeline; by default the same bytes from the
  same corpus and arguments in any process (bert_jax/tokenize/wordpiece_trainer.py).

  The vocabulary has BERT's layout: one token per line, [PAD] [UNK] [CLS] [SEP] [MASK] at ids
  0..4, then ``num_unused`` "[unusedN]" slots (room for tokens added later without resizing the
  embeddings), then the single characters and the "##" characters (by code point; "tokenizers"
  orders the latter by hash), then whole-word pieces and "##" pieces (which continue a word) in
  the order they were learned. ``tokenizer_config.json`` with do_lower_case is written beside
  the file.

  Args:
    files: corpus files or glob patterns (see expand_files).
    out_path: the file to write (a name ending in .txt), or a directory (existing, or any other
      name) to write vocab.txt into.
    vocab_size: the target size, special tokens included (the result is smaller when the corpus
      has fewer distinct pieces).
    do_lower_case: build an uncased vocabulary (lower-case, strip accents), as BERT-uncased.
    min_frequency: pieces seen fewer times are not merged into the vocabulary.
    limit_alphabet: keep at most this many distinct characters (the most frequent).
    num_unused: number of "[unusedN]" tokens after the special ones.
    decode_errors: "strict" or "replace" for bytes that are not UTF-8 (base.decode_line).
    overwrite: replace an existing vocabulary file (else it is an error).
    trainer: one of WORDPIECE_TRAINERS: "deterministic" (default), or "tokenizers" for
      Hugging Face's WordPieceTrainer (multi-threaded, faster on large corpora, but ties between
      equally frequent pieces are broken in hash order, so two builds can differ).

  Returns:
    the tokenizer that loads the written vocabulary.
  """
  if trainer not in WORDPIECE_TRAINERS:
    raise ValueError(f"trainer must be one of {WORDPIECE_TRAINERS}, got {trainer!r}")
  paths = expand_files(files)
  specials = _specials(num_unused)
  if vocab_size <= len(specials):
    raise ValueError(
      f"vocab_size {vocab_size} leaves no room beyond {len(specials)} special tokens"
    )
  out_path = pathlib.Path(out_path)
  if out_path.is_dir() or (not out_path.exists() and out_path.suffix != ".txt"):
    out_path = out_path / VOCAB_FILE
  _check_overwrite(out_path, overwrite)
  _check_not_empty(paths, decode_errors)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  # The same normalizer and pre-tokenizer as the tokenizer that will use the vocabulary.
  shell = WordPieceTokenizer(list(base.SPECIAL_TOKENS), do_lower_case=do_lower_case)
  lines = iter_corpus(paths, decode_errors)
  if trainer == "deterministic":
    tokens = wordpiece_trainer.train_wordpiece(
      wordpiece_trainer.count_words(lines, _word_splitter(shell._rust)),
      vocab_size,
      special_tokens=specials,
      min_frequency=min_frequency,
      limit_alphabet=limit_alphabet,
    )
  else:
    tokens = _train_with_tokenizers(
      shell._rust, lines, vocab_size, specials, min_frequency, limit_alphabet
    )
  if tokens[: len(specials)] != specials:
    raise RuntimeError(f"the trainer did not put {specials} first: {tokens[: len(specials)]}")
  if len(tokens) == len(specials):
    raise ValueError(
      f"no token learned from the corpus ({len(paths)} file(s): {paths[0]}, ...): every piece "
      f"is rarer than min_frequency={min_frequency}"
    )
  # Write next to the target, then rename: a failed build never leaves half a vocabulary.
  tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
  try:
    write_vocab(tokens, tmp)
    os.replace(tmp, out_path)
  finally:
    tmp.unlink(missing_ok=True)
  tokenizer = WordPieceTokenizer(tokens, do_lower_case=do_lower_case, source=str(out_path))
  tokenizer._write_config(out_path.parent)
  return tokenizer


def build_sentencepiece_model(
  files,
  out_prefix: str | os.PathLike,
  vocab_size: int,
  model_type: str = "unigram",
  *,
  do_lower_case: bool = False,
  character_coverage: float = 0.9995,
  input_sentence_size: int = 10_000_000,
  decode_errors: str = "strict",
  seed: int = 0,
  overwrite: bool = False,
) -> SentencePieceTokenizer:
  """Trains a SentencePiece model with BERT's special tokens at fixed ids.

  [PAD]=0 and [UNK]=1 are SentencePiece's pad and unknown pieces; [CLS]=2, [SEP]=3, [MASK]=4
  are control symbols (never produced from text); no BOS/EOS pieces. Writes
  ``out_prefix.model`` and ``out_prefix.vocab`` (SentencePiece's own formats) and
  ``tokenizer_config.json`` beside them.

  Args:
    files: corpus files or glob patterns (see expand_files).
    out_prefix: path without extension, e.g. "workdir/sentencepiece".
    vocab_size: exact size, special tokens included.
    model_type: "unigram" or "bpe".
    do_lower_case: lower-case the corpus for training and every text at encode time.
    character_coverage: share of characters covered by the alphabet (rest -> [UNK]).
    input_sentence_size: sample at most this many lines (SentencePiece keeps them in memory).
    decode_errors: "strict" or "replace" for bytes that are not UTF-8.
    seed: the seed of SentencePiece's sampling of input lines.
    overwrite: replace an existing model (else it is an error).
  """
  if model_type not in MODEL_TYPES:
    raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
  if vocab_size <= len(base.SPECIAL_TOKENS):
    raise ValueError(f"vocab_size {vocab_size} leaves no room beyond the special tokens")
  paths = expand_files(files)
  out_prefix = pathlib.Path(out_prefix)
  _check_overwrite(pathlib.Path(f"{out_prefix}.model"), overwrite)
  _check_not_empty(paths, decode_errors)
  out_prefix.parent.mkdir(parents=True, exist_ok=True)
  spm.set_random_generator_seed(seed)
  try:
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter_corpus(paths, decode_errors, lower=do_lower_case),
      model_prefix=str(out_prefix),
      vocab_size=vocab_size,
      model_type=model_type,
      character_coverage=character_coverage,
      input_sentence_size=input_sentence_size,
      shuffle_input_sentence=True,
      pad_id=0,
      pad_piece=base.PAD,
      unk_id=1,
      unk_piece=base.UNK,
      bos_id=-1,
      eos_id=-1,
      control_symbols=list(base.SPECIAL_TOKENS[2:]),
      num_threads=max(1, min(os.cpu_count() or 1, 16)),
      minloglevel=2,
    )
  except RuntimeError as e:
    raise ValueError(
      f"SentencePiece training on {len(paths)} file(s) ({paths[0]}, ...) failed: {e}"
    ) from None
  tokenizer = SentencePieceTokenizer.from_file(f"{out_prefix}.model", do_lower_case=do_lower_case)
  tokenizer._write_config(out_prefix.parent)
  return tokenizer


def build_vocabulary(
  files,
  output_dir: str | os.PathLike,
  *,
  kind: str = "wordpiece",
  vocab_size: int = 30522,
  do_lower_case: bool = True,
  model_type: str = "unigram",
  min_frequency: int = 2,
  num_unused: int = 0,
  character_coverage: float = 0.9995,
  decode_errors: str = "strict",
  overwrite: bool = False,
  stats_lines: int = 20_000,
) -> dict:
  """Builds either kind into ``output_dir`` (a workdir's tokenizer layout) and returns a summary
  with corpus_stats over the first ``stats_lines`` lines (what bert_jax.build_vocab prints)."""
  if kind == "wordpiece":
    tokenizer = build_wordpiece_vocab(
      files,
      pathlib.Path(output_dir) / VOCAB_FILE,
      vocab_size,
      do_lower_case=do_lower_case,
      min_frequency=min_frequency,
      num_unused=num_unused,
      decode_errors=decode_errors,
      overwrite=overwrite,
    )
  elif kind == "sentencepiece":
    tokenizer = build_sentencepiece_model(
      files,
      pathlib.Path(output_dir) / "sentencepiece",
      vocab_size,
      model_type,
      do_lower_case=do_lower_case,
      character_coverage=character_coverage,
      decode_errors=decode_errors,
      overwrite=overwrite,
    )
  else:
    raise ValueError(f"kind must be 'wordpiece' or 'sentencepiece', got {kind!r}")
  stats = corpus_stats(tokenizer, files, max_lines=stats_lines, decode_errors=decode_errors)
  return {
    "vocabulary": tokenizer.source,
    "kind": kind,
    "vocab_size": tokenizer.vocab_size,
    "do_lower_case": tokenizer.do_lower_case,
    **stats,
  }
