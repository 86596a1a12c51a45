r"""Pre-train BERT (masked LM + next sentence), sharded over a device mesh.

  python -m bert_jax.pretrain --config configs/pretrain.py:tiny --workdir workdir/tiny
  python -m bert_jax.pretrain --config configs/pretrain.py:base_paper --workdir gs://b/base \
      --config.input_files='gs://b/seq128/*' --config.phase2.input_files='gs://b/seq512/*' \
      --config.vocab_file=gs://b/vocab.txt --config.mesh.fsdp=8

Every config key can be overridden with ``--config.<key>=value``; a key that does not exist
is an error. Re-running with the same workdir resumes from its latest checkpoint. SIGTERM
during training saves a checkpoint and exits with status 143 (preempted: re-run to resume);
Ctrl-C (SIGINT) saves one too where training has started (at any earlier moment it stops at
once) and exits with status 130. Under a launcher that restarts it (BERT_JAX_ATTEMPT), an
attempt the earlier ones show cannot progress exits with status 3 (``bert_jax.train.attempts``).
A workdir that is, contains or lies inside an input the config names (init_checkpoint,
vocab_file, input files) is refused before any work (``bert_jax.checkpoint.outputs``). A user
error (bad flag or config key, missing file) is one line ``pretrain: error: ...`` (status 2 for usage errors, 1 otherwise);
``--verbose_errors`` adds the traceback. See docs/pretraining.md.
"""

from __future__ import annotations

from bert_jax import interrupts

if __name__ == "__main__":  # a Ctrl-C during the imports below stops at once
  interrupts.stop_at_once_on_ctrl_c("pretrain")

from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import cli
from bert_jax.checkpoint import CheckpointSaveError
from bert_jax.checkpoint.lock import WorkdirLockError
from bert_jax.checkpoint.outputs import check_workdir
from bert_jax.runs.pretraining.runner import run_pretraining
from bert_jax.train.loop import NonFiniteLossError

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
  check_workdir("--workdir", _WORKDIR.value, _CONFIG.value)
  summary = run_pretraining(_CONFIG.value, _WORKDIR.value)
  logging.info(
    "Done (%s) at step %d; summary in %s/summary.json",
    summary["status"],
    summary["step"],
    _WORKDIR.value,
  )


def run():
  """Console-script entry (bert-jax-pretrain)."""
  cli.run(
    main, prog="pretrain", user_errors=(NonFiniteLossError, WorkdirLockError, CheckpointSaveError)
  )


if __name__ == "__main__":
  run()
