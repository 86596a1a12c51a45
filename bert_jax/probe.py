r"""Probe what a frozen encoder's representations reveal about private attributes of the input.

  python -m bert_jax.probe --config configs/probe.py:cola_source --workdir /tmp/probe_cola \
      --config.data_dir=../shared/data/glue --config.init_checkpoint=/tmp/cola_finetuned
  python -m bert_jax.probe --config configs/probe.py:stsb_genre --workdir /tmp/probe_stsb \
      --config.data_dir=../shared/data/glue --config.init_checkpoint=$MINILM \
      --config.representation=mean --config.layer=3

Coavoux, Narayan and Cohen (2018): the encoder (``init_checkpoint``: a bert_jax workdir, its best
checkpoint for a fine-tuning one; a Hugging Face directory; a google-research/bert checkpoint) is
frozen; r(x) (``representation``: pooled, cls, mean at ``layer``, or a learned scalar_mix) is
computed for every example; an attacker (64 ReLU units, sigmoid outputs) learns the task's
private attributes z from it on the train split less a held-out ``dev_fraction``, the epoch with
the worst dev privacy is kept, and it is reported on the task's dev split. Output:
``<workdir>/probe.json`` (and the same as ``metrics.json`` for ``launch sweep``): the attacker's
accuracy / F per attribute, privacy (1 - mean accuracy or 1 - F), the majority and direct
baselines, the main task's metric for a fine-tuned workdir of the task (null, with a note that
is also logged, for anything else, a pre-training workdir among them). A user error is one line
``probe: error: ...`` (status 2 for usage errors, 1 otherwise); ``--verbose_errors`` adds the
traceback; everything that can refuse a run is checked before the attacker trains, and a failed
probe leaves no workdir it created. See docs/probe.md.
"""

from __future__ import annotations

from bert_jax import interrupts

if __name__ == "__main__":  # a Ctrl-C during the imports below stops at once
  interrupts.stop_at_once_on_ctrl_c("probe")

import json

from absl import app, flags
from ml_collections import config_flags

from bert_jax import cli
from bert_jax.checkpoint.lock import WorkdirLockError
from bert_jax.checkpoint.outputs import check_workdir
from bert_jax.tools.probe import run_probe

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "configs/probe.py:<preset or GLUE task>; override keys with --config.<key>=v",
  lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where probe.json (and metrics.json) are written")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  check_workdir("--workdir", _WORKDIR.value, _CONFIG.value)
  result = run_probe(_CONFIG.value, _WORKDIR.value)
  test = result["test"]
  main_task = result["main_task"]
  summary = {
    "task": result["task"],
    "representation": result["representation"]["mode"],
    "privacy": test["privacy"],
    "privacy_metric": test["privacy_metric"],
    "attacker_mean_accuracy": test["mean_accuracy"],
    "attacker_f1_micro": test["f1_micro"],
    "majority_privacy": result["baselines"]["majority"]["test"]["privacy"],
    "direct_privacy": (result["baselines"]["direct"] or {}).get("test", {}).get("privacy"),
    "selected_epoch": result["attacker"]["selected_epoch"],
    "main_task": None if main_task is None else {main_task["metric"]: main_task["value"]},
  }
  print(json.dumps(summary, default=str))


def run():
  """Console-script entry (bert-jax-probe)."""
  cli.run(main, prog="probe", user_errors=(WorkdirLockError,))


if __name__ == "__main__":
  run()
