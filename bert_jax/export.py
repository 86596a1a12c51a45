r"""Export a bert_jax checkpoint (pre-trained or fine-tuned) for use elsewhere.

  python -m bert_jax.export --workdir=DIR --format=hf --output=OUT           # transformers
  python -m bert_jax.export --workdir=DIR --format=saved_model --output=OUT  # TF serving
  python -m bert_jax.export --workdir=DIR --format=params --output=OUT       # Orbax params

The head comes from the workdir's head.json (or the weights); ``--task`` asks for a particular
one ("encoder" exports any checkpoint's encoder alone). A pre-training run without NSP exports
to hf as BertForMaskedLM (objective mlm) or BertLMHeadModel with is_decoder (objective ltr). A
checkpoint whose head does not fit the requested one is an error before anything is written,
and so is an --output that is, contains or lies inside the workdir (``--overwrite`` never
deletes an input); ``--overwrite`` replaces the output folder as a whole. An export stopped by
SIGINT or SIGTERM removes its staging folders and leaves the output as it was. ``--checkpoint``
picks a fine-tuning workdir's best (``best/``) or latest checkpoint
(``bert_jax.train.best_checkpoint``). See docs/export.md.
"""

from __future__ import annotations

from bert_jax import interrupts

if __name__ == "__main__":  # a Ctrl-C during the imports below stops at once
  interrupts.stop_at_once_on_ctrl_c("export")

import signal

from absl import app, flags

from bert_jax import cli
from bert_jax.checkpoint.outputs import check_outputs
from bert_jax.formats import FORMATS, export
from bert_jax.train.best_checkpoint import CHOICES, checkpoint_dir

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A bert_jax workdir (or a Hugging Face / TF checkpoint).")
flags.DEFINE_enum("format", "hf", FORMATS, "hf | saved_model | params")
flags.DEFINE_string("output", None, "The directory to write (must not exist or be empty).")
flags.DEFINE_string(
  "task",
  None,
  "The head to export (encoder, pretraining, "
  "sequence_classification, ..., or a transformers class name); default: "
  "the checkpoint's.",
)
flags.DEFINE_enum(
  "checkpoint",
  "best",
  list(CHOICES),
  "A fine-tuning workdir's best "
  "checkpoint on dev (its best/ directory; the latest where there is none), or "
  "its latest.",
)
flags.DEFINE_bool("overwrite", False, "Replace an existing, non-empty output.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not FLAGS.workdir or not FLAGS.output:
    raise app.UsageError("--workdir and --output are required")
  check_outputs(
    {"--output": FLAGS.output},
    {"--workdir": FLAGS.workdir},
    replaced=("--output",),
    sealed=("--workdir",),
  )
  source = checkpoint_dir(FLAGS.workdir, FLAGS.checkpoint)
  signal.signal(signal.SIGTERM, _terminate)  # unwind like SIGINT: the export cleans up
  out = export(source, FLAGS.format, FLAGS.output, FLAGS.task, FLAGS.overwrite)
  print(f"export: wrote {FLAGS.format} to {out}")


def _terminate(signum, frame):
  raise SystemExit(128 + signum)


def run():
  """Console-script entry (bert-jax-export); a user error is one line ``export: error: ...``."""
  cli.run(main, prog="export")


if __name__ == "__main__":
  run()
