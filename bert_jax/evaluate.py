r"""Evaluate a fine-tuned workdir on a split: a metrics JSON and the task's prediction files.

  python -m bert_jax.evaluate --workdir /tmp/rte --split dev
  python -m bert_jax.evaluate --workdir /tmp/rte --split test      # GLUE submission: RTE.tsv
  python -m bert_jax.evaluate --workdir /tmp/mnli --split ax --output_dir /tmp/glue_submission

The best checkpoint on dev (``<workdir>/best``) is used, else the latest. ``--split`` is dev
(every dev split of the task), test (every test split) or a split's own name
(dev_mismatched, test_matched, ax, ...). ``--set key=value`` replaces a run-config value, e.g.
a data path that moved: ``--set data_dir=/data/glue``. Output: ``<output_dir>/metrics.json``
and prediction files (default output_dir: ``<workdir>/eval_<split>``); an --output_dir that is
the workdir or a checkpoint of it, or is or contains an input of the run (its data, vocabulary,
init_checkpoint) is refused before any work (``bert_jax.checkpoint.outputs``). A user error is
one line ``evaluate: error: ...`` (status 2 for usage errors, 1 otherwise); ``--verbose_errors``
adds the traceback.
"""

from __future__ import annotations

from bert_jax import interrupts

if __name__ == "__main__":  # a Ctrl-C during the imports below stops at once
  interrupts.stop_at_once_on_ctrl_c("evaluate")

import json
import os

from absl import app, flags

from bert_jax import cli
from bert_jax.checkpoint.lock import WorkdirLockError
from bert_jax.checkpoint.outputs import check_outputs, check_parent, config_inputs
from bert_jax.runs.finetuning.runner import evaluate
from bert_jax.runs.finetuning.runner_io import read_run_config
from bert_jax.train.best_checkpoint import checkpoint_dir

_WORKDIR = flags.DEFINE_string("workdir", None, "A bert_jax fine-tuning workdir")
_SPLIT = flags.DEFINE_string("split", "dev", "dev | test | a split name of the task")
_OUTPUT_DIR = flags.DEFINE_string(
  "output_dir", "", "Where to write (default <workdir>/eval_<split>)"
)
_SET = flags.DEFINE_multi_string("set", [], "key=value overrides of the saved run config")
flags.mark_flags_as_required(["workdir"])


def _parse_overrides(items):
  out = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep:
      raise app.UsageError(f"--set expects key=value, got {item!r}")
    try:
      out[key] = json.loads(value)
    except json.JSONDecodeError:
      out[key] = value
  return out


def _check_output_dir(workdir: str, split: str, output_dir: str, overrides) -> None:
  """The output folder must not be the workdir, one of its checkpoints, or any input of the run
  (before the workdir is locked and the model loaded)."""
  output_dir = output_dir or os.path.join(workdir, f"eval_{split}")
  config = dict(read_run_config(workdir))
  config.update(overrides)
  checkpoint = checkpoint_dir(workdir, "best")
  if os.path.realpath(checkpoint) == os.path.realpath(workdir):
    checkpoint = os.path.join(workdir, "checkpoints")
  inputs = {"--workdir": workdir, "the checkpoint": checkpoint}
  inputs.update(config_inputs(config))
  check_outputs(
    {"--output_dir": output_dir}, inputs, sealed=("the checkpoint", "config.init_checkpoint")
  )
  check_parent("--output_dir", output_dir, create=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  overrides = _parse_overrides(_SET.value)
  _check_output_dir(_WORKDIR.value, _SPLIT.value, _OUTPUT_DIR.value, overrides)
  result = evaluate(_WORKDIR.value, _SPLIT.value, _OUTPUT_DIR.value, overrides)
  print(json.dumps(result["eval"], default=str))


def run():
  """Console-script entry (bert-jax-evaluate)."""
  cli.run(main, prog="evaluate", user_errors=(WorkdirLockError,))


if __name__ == "__main__":
  run()
