r"""Top-k next WordPieces for every prefix of every line, from a pre-trained (causal or masked) LM.

  python -m bert_jax.predict_next --input_file=train.txt --output_file=train.next.jsonl \
      --checkpoint=workdir/tiny_ltr --top_k=5 --max_seq_length=128 --batch_size=64

Each input line is tokenized to WordPieces t1..tn; for each prefix t1..tj (j = 0..n-1) one JSON
line ``{"line", "prefix_len", "gold", "gold_logprob", "gold_rank", "topk": [[piece, logprob],
...]}`` in input order. --mode=auto reads a left-to-right (is_decoder) checkpoint causally and a
bidirectional one as ``[CLS] t1..tj [MASK] [SEP]``. The summary (accuracy, perplexity) goes to
--summary_file (default <output_file>.summary.json) and is printed as one line. A user error is
one line ``predict_next: error: ...`` (status 2 for usage errors, 1 otherwise). See
docs/predict_next.md and bert_jax/tools/next_token.py.
"""

from __future__ import annotations

from bert_jax import interrupts

if __name__ == "__main__":  # a Ctrl-C during the imports below stops at once
  interrupts.stop_at_once_on_ctrl_c("predict_next")

import json
import os

from absl import app, flags

from bert_jax import cli
from bert_jax.checkpoint.outputs import check_outputs
from bert_jax.tools.next_token import MODES, predict_next

FLAGS = flags.FLAGS
flags.DEFINE_string("input_file", None, "UTF-8 text, one item per line.")
flags.DEFINE_string("output_file", None, "JSON lines output, one object per prefix.")
flags.DEFINE_string(
  "checkpoint",
  None,
  "A checkpoint with an LM head: bert_jax pre-training workdir (or <workdir>/checkpoints/<step>), "
  "Hugging Face BertLMHeadModel / BertForMaskedLM directory, google-research/bert checkpoint.",
)
flags.DEFINE_integer("top_k", 5, "Next pieces to emit per prefix.")
flags.DEFINE_integer("max_seq_length", 128, "Model input length (context is truncated to fit).")
flags.DEFINE_integer("batch_size", 64, "Rows (windows, or prefixes in mlm mode) per jitted batch.")
flags.DEFINE_enum(
  "mode", "auto", MODES, "auto: by the checkpoint's is_decoder; causal; mlm ([MASK] at the end)."
)
flags.DEFINE_boolean("do_lower_case", None, "Override the checkpoint tokenizer's casing.")
flags.DEFINE_string("summary_file", None, "Summary JSON (default: <output_file>.summary.json).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  missing = [f"--{n}" for n in ("input_file", "output_file", "checkpoint") if not FLAGS[n].value]
  if missing:
    raise app.UsageError(f"{', '.join(missing)} required")
  check_outputs(
    {
      "--output_file": FLAGS.output_file,
      "--summary_file": FLAGS.summary_file or f"{FLAGS.output_file}.summary.json",
    },
    {"--input_file": FLAGS.input_file, "--checkpoint": FLAGS.checkpoint},
    sealed=("--checkpoint",),
  )
  if not os.path.isfile(FLAGS.input_file):
    raise ValueError(f"--input_file={FLAGS.input_file}: no such file")
  if not os.path.exists(FLAGS.checkpoint) and not os.path.exists(FLAGS.checkpoint + ".index"):
    raise ValueError(f"--checkpoint={FLAGS.checkpoint}: no such file or directory")
  summary = predict_next(
    FLAGS.input_file,
    FLAGS.output_file,
    FLAGS.checkpoint,
    top_k=FLAGS.top_k,
    max_seq_length=FLAGS.max_seq_length,
    batch_size=FLAGS.batch_size,
    mode=FLAGS.mode,
    do_lower_case=FLAGS.do_lower_case,
    summary_file=FLAGS.summary_file,
  )
  print(json.dumps(summary))


def run():
  """Console-script entry."""
  cli.run(main, prog="predict_next", user_errors=(OSError,))


if __name__ == "__main__":
  run()
