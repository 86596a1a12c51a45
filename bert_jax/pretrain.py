r"""Pre-train BERT (masked LM + next sentence), sharded over a device mesh.

  python -m bert_jax.pretrain --config configs/pretrain.py:tiny --workdir workdir/tiny
  python -m bert_jax.pretrain --config configs/pretrain.py:base_paper --workdir gs://b/base \
      --config.input_files='gs://b/seq128/*' --config.phase2.input_files='gs://b/seq512/*' \
      --config.vocab_file=gs://b/vocab.txt --config.mesh.fsdp=8

Every config key can be overridden with ``--config.<key>=value``; a key that does not exist
is an error. Re-running with the same workdir resumes from its latest checkpoint. SIGTERM
saves a checkpoint and exits with status 0. See docs/pretraining.md.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "A configs/pretrain.py:<preset> file; override keys with --config.<key>=v",
  lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Run directory: checkpoints, TensorBoard, config, tokenizer, summary.json"
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from bert_jax.train.loop import NonFiniteLossError  # noqa: PLC0415
  from bert_jax.train.metrics import quiet_library_logs  # noqa: PLC0415
  from bert_jax.train.pretraining import run_pretraining  # noqa: PLC0415

  quiet_library_logs()
  try:
    summary = run_pretraining(_CONFIG.value, _WORKDIR.value)
  except NonFiniteLossError as e:
    logging.error("%s", e)
    sys.exit(f"error: {e}")
  except (ValueError, FileNotFoundError) as e:
    logging.error("%s", e)
    sys.exit(f"error: {e}")
  logging.info(
    "Done (%s) at step %d; summary in %s/summary.json",
    summary["status"],
    summary["step"],
    _WORKDIR.value,
  )


def run():
  """Console-script entry (bert-jax-pretrain)."""
  app.run(main)


if __name__ == "__main__":
  run()
