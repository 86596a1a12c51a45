r"""Builds a BERT vocabulary from a text corpus: a WordPiece vocab.txt or a SentencePiece model.

  python -m bert_jax.build_vocab --input '../shared/data/pretrain/shakespeare/*.txt' \
      --output /tmp/vocab_wp --kind wordpiece --vocab_size 8000 [--cased]
  python -m bert_jax.build_vocab --input '../shared/data/pretrain/shakespeare/*.txt' \
      --output /tmp/vocab_sp --kind sentencepiece --model_type unigram --vocab_size 8000

The output directory gets vocab.txt (or sentencepiece.model and sentencepiece.vocab) and
tokenizer_config.json, the layout of a bert_jax workdir, so it loads with
``bert_jax.tokenize.load_tokenizer(output)``. Input files are UTF-8 text (.gz/.bz2 too), one
sentence or paragraph per line. An --output that is or contains a corpus file is refused before
any work (``bert_jax.checkpoint.outputs``). A user error (no input, an empty corpus, bad UTF-8)
is one line ``build_vocab: error: ...``; ``--verbose_errors`` adds the traceback. See
docs/tokenizers.md.
"""

from bert_jax import interrupts

if __name__ == "__main__":  # a Ctrl-C during the imports below stops at once
  interrupts.stop_at_once_on_ctrl_c("build_vocab")

import json

from absl import app, flags

from bert_jax import cli
from bert_jax.checkpoint.outputs import check_outputs, check_parent, input_paths
from bert_jax.tokenize import vocab

_INPUT = flags.DEFINE_list(
  "input", None, "Corpus files or glob patterns, comma-separated.", required=True
)
_OUTPUT = flags.DEFINE_string(
  "output", None, "Directory to write the vocabulary into.", required=True
)
_KIND = flags.DEFINE_enum("kind", "wordpiece", ["wordpiece", "sentencepiece"], "Vocabulary kind.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 30522, "Size, special tokens included.")
_CASED = flags.DEFINE_bool("cased", False, "Keep case and accents (do_lower_case=False).")
_MODEL_TYPE = flags.DEFINE_enum(
  "model_type", "unigram", list(vocab.MODEL_TYPES), "SentencePiece algorithm."
)
_MIN_FREQUENCY = flags.DEFINE_integer("min_frequency", 2, "WordPiece: least count of a piece.")
_NUM_UNUSED = flags.DEFINE_integer("num_unused", 0, "WordPiece: [unusedN] slots after [MASK].")
_CHARACTER_COVERAGE = flags.DEFINE_float(
  "character_coverage", 0.9995, "SentencePiece: share of characters in the alphabet."
)
_DECODE_ERRORS = flags.DEFINE_enum(
  "decode_errors",
  "strict",
  ["strict", "replace"],
  "Bytes that are not UTF-8: fail naming file:line, or U+FFFD.",
)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace a vocabulary already in --output.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  check_outputs({"--output": _OUTPUT.value}, {"--input": input_paths(_INPUT.value)})
  check_parent("--output", _OUTPUT.value, create=True)
  summary = vocab.build_vocabulary(
    _INPUT.value,
    _OUTPUT.value,
    kind=_KIND.value,
    vocab_size=_VOCAB_SIZE.value,
    do_lower_case=not _CASED.value,
    model_type=_MODEL_TYPE.value,
    min_frequency=_MIN_FREQUENCY.value,
    num_unused=_NUM_UNUSED.value,
    character_coverage=_CHARACTER_COVERAGE.value,
    decode_errors=_DECODE_ERRORS.value,
    overwrite=_OVERWRITE.value,
  )
  print(json.dumps(summary, indent=2))


def run():
  """Console-script entry (bert-jax-build-vocab)."""
  cli.run(main, prog="build_vocab")


if __name__ == "__main__":
  run()
