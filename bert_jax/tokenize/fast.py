"""A faster WordPiece for bulk text: tensorflow-text's FastBertTokenizer where its ids are the
reference's, bert_jax's own WordPieceTokenizer (the reference) everywhere else.

tensorflow-text's ``FastBertTokenizer`` (Google's C++ "LinMaxMatch" WordPiece with BERT's
normalization and split) is 6-7 times as fast per core as the Rust ``tokenizers`` pipeline the
reference runs (benchmarks/speed/tokenizer.py; docs/tokenizers.md). It is not identical to the
reference on all text: it replaces control characters with a space (the reference deletes them),
counts a word's length in bytes (the reference in characters), has no CJK spacing, no NFC, and
older Unicode tables; a sweep of every code point finds its ids different on ~967k of 1,112,064
(mostly unassigned and private-use ones, but also hundreds of letters, symbols and marks). On
printable ASCII (plus tab, newline and carriage return) it is identical, cased and uncased:
bytes are characters there and none of those differences can arise. So batches are split: each
text that is ASCII and holds no ASCII control character other than tab/newline/carriage return
goes to tensorflow-text, every other text (any non-ASCII character, a control character) to the
reference. English corpora are almost all of the first kind. tensorflow-text is given only the
vocabulary tokens the reference can produce (tf_text_vocab). tests/test_tokenize_fast.py checks
the ids against the reference on the shared data, random and adversarial ASCII, and every code
point.

Only the batch methods (``encode_batch``, ``tokenize_batch``) take the fast path, for batches
with at least ``MIN_FAST_BATCH`` eligible texts; ``encode``/``tokenize`` of one text, and
``split_special_tokens=False`` tokenizers, always run the reference (a TensorFlow call costs
more than a short text's tokenization).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Sequence

from bert_jax.tokenize import base, wordpiece

TF_TEXT_PACKAGE = "tensorflow-text"
MIN_FAST_BATCH = 64
# Texts per tensorflow-text call: bounds the tensors a huge batch would need at once.
CHUNK = 16384
# ASCII characters tensorflow-text treats otherwise than the reference (which deletes them; it
# puts a space): every ASCII control character but tab, newline and carriage return.
_ASCII_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# What the reference's split makes of ASCII: words of letters and digits, single punctuation.
_ASCII_PUNCT = frozenset(
  chr(c) for c in (*range(33, 48), *range(58, 65), *range(91, 97), *range(123, 127))
)
_ASCII_WORD = re.compile("[A-Za-z0-9]+")


class FastUnavailable(Exception):
  """Why the fast path cannot be built here (load_tokenizer logs it and uses the reference)."""


# The distributions TensorFlow is installed as (tensorflow-text is released once for each of
# TensorFlow's minor versions, and the nightlies as tensorflow-text-nightly).
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos")
TF_NIGHTLY_DISTRIBUTIONS = ("tf-nightly", "tf-nightly-cpu")


def tf_text_requirement() -> str:
  """The pip requirement of the tensorflow-text release that matches the installed TensorFlow:
  ``tensorflow-text==2.21.*`` for TensorFlow (or tensorflow-cpu) 2.21.x, the nightly for a
  nightly; plain ``tensorflow-text`` where no TensorFlow is installed."""
  for name in TF_NIGHTLY_DISTRIBUTIONS:
    try:
      importlib.metadata.version(name)
      return f"{TF_TEXT_PACKAGE}-nightly"
    except importlib.metadata.PackageNotFoundError:
      pass
  for name in TF_DISTRIBUTIONS:
    try:
      version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      continue
    match = re.match(r"(\d+)\.(\d+)", version)
    if match:
      return f"{TF_TEXT_PACKAGE}=={match.group(1)}.{match.group(2)}.*"
  return TF_TEXT_PACKAGE


def import_tf_text():
  """(tensorflow, tensorflow_text), or FastUnavailable saying what is missing."""
  try:
    import tensorflow as tf  # noqa: PLC0415 (heavy; only when a fast tokenizer is built)
    import tensorflow_text  # noqa: PLC0415 (heavy: imports TensorFlow)
  except ImportError as e:
    raise FastUnavailable(
      f"{TF_TEXT_PACKAGE} is not importable ({e}); install the release matching the installed "
      f"TensorFlow: pip install --no-deps '{tf_text_requirement()}'"
    ) from None
  return tf, tensorflow_text


def is_fast_eligible(text: str) -> bool:
  """Whether tensorflow-text's ids for ``text`` are provably the reference's (see the module
  docstring): ASCII without control characters other than tab, newline, carriage return."""
  return text.isascii() and _ASCII_CONTROL.search(text) is None


def tf_text_vocab(tokens: Sequence[str]) -> list[str]:
  """The vocabulary for tensorflow-text: each token the reference can produce from eligible
  text as it is, every other one replaced by a unique string no ASCII text can match.

  tensorflow-text folds the split into its matcher, so a token the reference can never produce
  still matches there: "x y" in a vocabulary makes it read "x y" or "x\ty" as that one token
  (the reference: "x", "y"). On ASCII the reference produces a word piece (letters and digits,
  "##" first for a continuation) or a single punctuation character; keep those (and [UNK],
  tensorflow-text's unknown token), replace the rest."""
  out = []
  for i, token in enumerate(tokens):
    body = token.removeprefix(wordpiece.CONTINUATION_PREFIX)
    keep = (
      token == base.UNK
      or (token == body and token in _ASCII_PUNCT)
      or _ASCII_WORD.fullmatch(body) is not None
    )
    out.append(token if keep else f"\U000f0000{i}")  # a private-use character: never ASCII
  return out


def split_eligible(texts: Sequence[str]) -> tuple[list[int], list[int]]:
  """(indices of the fast-eligible texts, indices of the others), in order; TypeError for a
  text that is not a str (the message of base.check_text)."""
  try:
    joined = "".join(texts)  # also the type check: join takes only str
  except TypeError:
    for text in texts:
      base.check_text(text)
    raise
  if joined.isascii() and _ASCII_CONTROL.search(joined) is None:
    return list(range(len(texts))), []  # the common case, checked in two C passes
  fast, slow = [], []
  for i, text in enumerate(texts):
    (fast if is_fast_eligible(text) else slow).append(i)
  return fast, slow


class FastWordPieceTokenizer(wordpiece.WordPieceTokenizer):
  """WordPieceTokenizer whose batch methods run tensorflow-text on eligible texts.

  Same arguments, methods and ids as :class:`WordPieceTokenizer` (it is one); building it
  raises FastUnavailable when tensorflow-text is missing or cannot take the vocabulary, or when
  ``split_special_tokens=False`` (special tokens matched in text: tensorflow-text cannot).
  """

  backend = "tensorflow-text"

  def __init__(
    self,
    tokens: Sequence[str],
    do_lower_case: bool = True,
    strip_accents: bool | None = None,
    tokenize_chinese_chars: bool = True,
    max_input_chars_per_word: int = wordpiece.MAX_INPUT_CHARS_PER_WORD,
    split_special_tokens: bool = True,
    source: str = "<vocab>",
  ):
    if not split_special_tokens:
      raise FastUnavailable(
        "split_special_tokens=False (special tokens matched in the text) has no fast path"
      )
    self._init_args = (
      list(tokens),
      do_lower_case,
      strip_accents,
      tokenize_chinese_chars,
      max_input_chars_per_word,
      split_special_tokens,
      source,
    )
    tf, tf_text = import_tf_text()
    super().__init__(*self._init_args)
    try:
      # On the texts sent here (ASCII, see is_fast_eligible) lower-casing is all that
      # "lower_case_nfd_strip_accents" does, and a byte is a character.
      fast = tf_text.FastBertTokenizer(
        vocab=tf_text_vocab(self._tokens),
        suffix_indicator=wordpiece.CONTINUATION_PREFIX,
        max_bytes_per_word=max_input_chars_per_word,
        token_out_type=tf.int32,
        unknown_token=base.UNK,
        lower_case_nfd_strip_accents=self.do_lower_case,
      )
    except Exception as e:  # any failure to build means: use the reference
      raise FastUnavailable(f"{TF_TEXT_PACKAGE} cannot build {source}: {e}") from None

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def run(texts):
      ragged = fast.tokenize(texts)
      return ragged.flat_values, ragged.row_splits

    self._tf, self._tf_run = tf, run

  def __reduce__(self):  # TensorFlow objects do not pickle: rebuild from the arguments
    return (type(self), self._init_args)

  def _fast_ids(self, texts: list[str]) -> list[list[int]]:
    out: list[list[int]] = []
    for start in range(0, len(texts), CHUNK):
      values, splits = self._tf_run(self._tf.constant(texts[start : start + CHUNK]))
      values, splits = values.numpy().tolist(), splits.numpy().tolist()
      with base.gc_paused():  # thousands of new lists of ints
        out.extend([values[a:b] for a, b in zip(splits, splits[1:])])
    return out

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    texts = list(texts)
    fast_idx, slow_idx = split_eligible(texts)
    if len(fast_idx) < MIN_FAST_BATCH:
      return super().encode_batch(texts)
    if not slow_idx:
      return self._fast_ids(texts)
    return base.in_batch_order(
      len(texts),
      (fast_idx, self._fast_ids([texts[i] for i in fast_idx])),
      (slow_idx, super().encode_batch([texts[i] for i in slow_idx])),
    )
