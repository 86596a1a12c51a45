r"""Evaluate a fine-tuned workdir on a split: a metrics JSON and the task's prediction files.

  python -m bert_jax.evaluate --workdir /tmp/rte --split dev
  python -m bert_jax.evaluate --workdir /tmp/rte --split test      # GLUE submission: RTE.tsv
  python -m bert_jax.evaluate --workdir /tmp/mnli --split ax --output_dir /tmp/glue_submission

The best checkpoint on dev (``<workdir>/best``) is used, else the latest. ``--split`` is dev
(every dev split of the task), test (every test split) or a split's own name
(dev_mismatched, test_matched, ax, ...). ``--set key=value`` replaces a run-config value, e.g.
a data path that moved: ``--set data_dir=/data/glue``. Output: ``<output_dir>/metrics.json``
and prediction files (default output_dir: ``<workdir>/eval_<split>``). A user error is one line
``evaluate: error: ...`` (status 2 for usage errors, 1 otherwise); ``--verbose_errors`` adds
the traceback.
"""

from __future__ import annotations

import json

from absl import app, flags

from bert_jax import cli
from bert_jax.checkpoint.lock import WorkdirLockError
from bert_jax.tasks.runner import evaluate

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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  result = evaluate(_WORKDIR.value, _SPLIT.value, _OUTPUT_DIR.value, _parse_overrides(_SET.value))
  print(json.dumps(result["eval"], default=str))


def run():
  """Console-script entry (bert-jax-evaluate)."""
  cli.run(main, prog="evaluate", user_errors=(WorkdirLockError,))


if __name__ == "__main__":
  run()
