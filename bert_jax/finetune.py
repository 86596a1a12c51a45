r"""Fine-tune BERT on a downstream task (GLUE, SWAG, NER, feature-based NER, SQuAD).

  python -m bert_jax.finetune --config configs/glue.py:rte --workdir /tmp/rte \
      --config.data_dir=../shared/data/glue --config.init_checkpoint=PATH_TO_BERT
  python -m bert_jax.finetune --config configs/ner.py --workdir /tmp/ner \
      --config.train_file=../shared/data/conll2003/train.txt \
      --config.dev_file=../shared/data/conll2003/dev.txt --config.init_checkpoint=PATH

``init_checkpoint`` is a bert_jax workdir, a Hugging Face directory or a google-research/bert
TF checkpoint: its encoder is loaded, the head is new, and what was not loaded is printed.
Every config key can be overridden with ``--config.<key>=value`` (a key that does not exist is
an error), e.g. the paper's grid: learning_rate, train_batch_size, num_train_epochs, seed.
Re-running with the same workdir resumes; SIGTERM during training saves a checkpoint and exits
with status 143 (preempted: re-run to resume), Ctrl-C with 130. A workdir that is, contains or
lies inside an input the config names (init_checkpoint, vocab_file, data_dir, train_file, ...)
is refused before any work (``bert_jax.checkpoint.outputs``). The workdir ends with
metrics.json (the task's primary dev metric, for sweeps), summary.json, predictions/ and best/. A user error is one line
``finetune: error: ...`` (status 2 for usage errors, 1 otherwise); ``--verbose_errors`` adds
the traceback. See docs/finetuning.md.
"""

from __future__ import annotations

from bert_jax import interrupts

if __name__ == "__main__":  # a Ctrl-C during the imports below stops at once
  interrupts.stop_at_once_on_ctrl_c("finetune")

import json

from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import cli
from bert_jax.checkpoint import CheckpointSaveError
from bert_jax.checkpoint.lock import WorkdirLockError
from bert_jax.checkpoint.outputs import check_workdir
from bert_jax.runs.finetuning.runner import finetune
from bert_jax.train.loop import NonFiniteLossError

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "A configs/<task>.py:<arg> file; override keys with --config.<key>=v",
  lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Run directory: checkpoints, best/, predictions/, metrics.json, summary.json"
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  check_workdir("--workdir", _WORKDIR.value, _CONFIG.value)
  result = finetune(_CONFIG.value, _WORKDIR.value)
  if result.get("status") != "completed":
    logging.warning("Stopped (%s) at step %d; re-run to resume", result["status"], result["step"])
    return
  print(
    json.dumps(
      {
        "task": result["task"],
        "primary_metric": result["primary_metric"],
        "dev": result["dev"],
        "best_step": result["best_step"],
      },
      default=str,
    )
  )


def run():
  """Console-script entry (bert-jax-finetune)."""
  cli.run(
    main, prog="finetune", user_errors=(NonFiniteLossError, WorkdirLockError, CheckpointSaveError)
  )


if __name__ == "__main__":
  run()
