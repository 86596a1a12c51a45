r"""Extract contextual token features from a pre-trained BERT (google-research/bert's script).

  python -m bert_jax.extract_features --input_file=sentences.txt --output_file=features.jsonl \
      --checkpoint=path/to/model --layers=-1,-2,-3,-4 --max_seq_length=128 --batch_size=32

Each input line is a sentence or ``text_a ||| text_b``; each output line is a JSON object
``{"linex_index", "features": [{"token", "layers": [{"index", "values"}]}]}`` as the original
writes it. --checkpoint is a bert_jax workdir, a Hugging Face directory or a google-research/bert
TensorFlow checkpoint. ``--scalar_mix_weights=w0,...,wL`` (embeddings, then each layer; divided
by their sum) and ``--scalar_mix_gamma`` add ELMo's scalar mix as a layer entry ``"index": "mix"``.
A user error is one line ``extract_features: error: ...`` (status 2 for
usage errors, 1 otherwise); ``--verbose_errors`` adds the traceback. See
docs/extract_features.md.
"""

from __future__ import annotations

from bert_jax import interrupts

if __name__ == "__main__":  # a Ctrl-C during the imports below stops at once
  interrupts.stop_at_once_on_ctrl_c("extract_features")

import json

from absl import app, flags

from bert_jax import cli
from bert_jax.checkpoint.outputs import check_outputs
from bert_jax.tools.features import extract_features

FLAGS = flags.FLAGS
flags.DEFINE_string("input_file", None, "UTF-8 text, one sentence (or 'a ||| b') per line.")
flags.DEFINE_string("output_file", None, "JSON lines output (written when complete).")
flags.DEFINE_string(
  "checkpoint",
  None,
  "bert_jax workdir, Hugging Face directory or "
  "google-research/bert checkpoint (directory or bert_model.ckpt prefix).",
)
flags.DEFINE_list(
  "layers",
  ["-1", "-2", "-3", "-4"],
  "Encoder layers to output (-1: last); may be empty (--layers=) with --scalar_mix_weights.",
)
flags.DEFINE_list(
  "scalar_mix_weights",
  None,
  "Also output ELMo's scalar mix gamma * sum_k s_k h_k as the layer entry 'mix': one weight >= 0 "
  "per hidden state, num_hidden_layers + 1 of them (the embeddings first, then layers 0..L-1), "
  "divided by their sum.",
)
flags.DEFINE_float("scalar_mix_gamma", 1.0, "The scalar mix's scale (with --scalar_mix_weights).")
flags.DEFINE_integer("max_seq_length", 128, "Longer inputs are truncated (counted in the summary).")
flags.DEFINE_integer("batch_size", 32, "Lines per jitted batch.")
flags.DEFINE_boolean("do_lower_case", None, "Override the checkpoint tokenizer's casing.")
flags.DEFINE_boolean(
  "allow_empty_lines",
  False,
  "Extract [CLS] [SEP] for an empty line (the "
  "original's behaviour) instead of stopping with an error naming it.",
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  missing = [f"--{n}" for n in ("input_file", "output_file", "checkpoint") if not FLAGS[n].value]
  if missing:
    raise app.UsageError(f"{', '.join(missing)} required")
  check_outputs(
    {"--output_file": FLAGS.output_file},
    {"--input_file": FLAGS.input_file, "--checkpoint": FLAGS.checkpoint},
    sealed=("--checkpoint",),
  )
  try:
    layers = [int(x) for x in FLAGS.layers]
  except ValueError:
    raise app.UsageError(f"--layers must be integers, got {','.join(FLAGS.layers)}") from None
  mix_weights = None
  if FLAGS.scalar_mix_weights is not None:
    try:
      mix_weights = [float(x) for x in FLAGS.scalar_mix_weights]
    except ValueError:
      raise app.UsageError(
        f"--scalar_mix_weights must be numbers, got {','.join(FLAGS.scalar_mix_weights)}"
      ) from None
  elif FLAGS["scalar_mix_gamma"].present:
    raise app.UsageError("--scalar_mix_gamma needs --scalar_mix_weights")
  summary = extract_features(
    FLAGS.input_file,
    FLAGS.output_file,
    FLAGS.checkpoint,
    layers,
    FLAGS.max_seq_length,
    FLAGS.batch_size,
    FLAGS.do_lower_case,
    FLAGS.allow_empty_lines,
    scalar_mix_weights=mix_weights,
    scalar_mix_gamma=FLAGS.scalar_mix_gamma,
  )
  print(json.dumps(summary))


def run():
  """Console-script entry (bert-jax-extract-features)."""
  cli.run(main, prog="extract_features", user_errors=(OSError,))


if __name__ == "__main__":
  run()
