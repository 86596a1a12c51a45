r"""Export a bert_jax checkpoint (pre-trained or fine-tuned) for use elsewhere.

  python -m bert_jax.export --workdir=DIR --format=hf --output=OUT           # transformers
  python -m bert_jax.export --workdir=DIR --format=saved_model --output=OUT  # TF serving
  python -m bert_jax.export --workdir=DIR --format=params --output=OUT       # Orbax params

The head comes from the workdir's head.json (or the weights); ``--task`` asks for a particular
one ("encoder" exports any checkpoint's encoder alone). A checkpoint whose head does not fit
the requested one is an error before anything is written. See docs/export.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from absl import app, flags

FORMATS = ("hf", "saved_model", "params")
FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A bert_jax workdir (or a Hugging Face / TF checkpoint).")
flags.DEFINE_enum("format", "hf", FORMATS, "hf | saved_model | params")
flags.DEFINE_string("output", None, "The directory to write (must not exist or be empty).")
flags.DEFINE_string("task", None, "The head to export (encoder, pretraining, "
                    "sequence_classification, ..., or a transformers class name); default: "
                    "the checkpoint's.")
flags.DEFINE_bool("overwrite", False, "Replace an existing, non-empty output.")


def load_for_export(path: str, task: str | None = None):
  """The checkpoint as ``Pretrained``, checked to fit ``task``: every tensor, every shape."""
  from bert_jax.checkpoint import hf  # pylint: disable=import-outside-toplevel
  from bert_jax.checkpoint.pretrained import load_pretrained  # pylint: disable=import-outside-toplevel
  from flax import traverse_util  # pylint: disable=import-outside-toplevel

  task = hf.IMPORT_ARCHITECTURES.get(task, task) if task else None
  if task is not None and task not in hf.TASKS:
    raise hf.CheckpointError(f"--task {task!r} is not one of {hf.TASKS} (or a transformers "
                             f"class: {sorted(hf.IMPORT_ARCHITECTURES)})")
  # "encoder" takes the encoder of any checkpoint (load_pretrained allows it for pre-training
  # checkpoints only), so load with the checkpoint's own head and drop the head here.
  pretrained = load_pretrained(path, None if task == "encoder" else task)
  if task == "encoder":
    pretrained = dataclasses.replace(pretrained, params={"bert": pretrained.params["bert"]},
                                     task="encoder", num_labels=None, labels=(), absent=())
  missing_heads = [g for g in pretrained.absent if g in ("mlm", "nsp")]
  if pretrained.task == "pretraining" and missing_heads:
    raise hf.CheckpointError(f"{path}: the checkpoint has no {' / '.join(missing_heads)} head "
                             f"weights to export as BertForPreTraining; use --task=encoder")
  head_path = os.path.join(path, "head.json")
  if pretrained.task in ("sequence_classification", "token_classification") and os.path.isfile(
      head_path):
    with open(head_path) as f:
      head = json.load(f)
    n, labels = head.get("num_labels"), head.get("labels") or []
    if (n is not None and n != pretrained.num_labels) or (
        labels and len(labels) != pretrained.num_labels):
      raise hf.CheckpointError(
          f"{head_path}: num_labels {n} / {len(labels)} labels, but the classifier in the "
          f"checkpoint has {pretrained.num_labels} outputs")
  want = hf.param_shapes(pretrained.config, pretrained.task, pretrained.num_labels or 2)
  have = {k: tuple(v.shape) for k, v in traverse_util.flatten_dict(pretrained.params).items()}
  problems = [f"{'/'.join(k)}: missing" for k in want if k not in have]
  problems += [f"{'/'.join(k)}: {have[k]}, the {pretrained.task} model needs {s}"
               for k, s in want.items() if k in have and have[k] != s]
  problems += [f"{'/'.join(k)}: not part of a {pretrained.task} model" for k in have
               if k not in want]
  if problems:
    raise hf.CheckpointError(f"{path}: the weights do not fit a {pretrained.task} head:\n  "
                             + "\n  ".join(problems[:10]))
  return pretrained


def export(path: str, fmt: str, output: str, task: str | None = None,
           overwrite: bool = False) -> str:
  """Exports the checkpoint at ``path`` as ``fmt`` into ``output``; returns ``output``."""
  if fmt not in FORMATS:
    raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
  if os.path.exists(output) and os.listdir(output) and not overwrite:
    raise FileExistsError(f"--output {output} exists and is not empty (pass --overwrite)")
  p = load_for_export(path, task)
  if fmt == "hf":
    from bert_jax.checkpoint.hf import save_hf  # pylint: disable=import-outside-toplevel
    save_hf(output, p.params, p.config, p.tokenizer, head=p.task, num_labels=p.num_labels,
            labels=list(p.labels) or None, overwrite=overwrite)
  elif fmt == "saved_model":
    from bert_jax.checkpoint.saved_model import export_saved_model  # pylint: disable=import-outside-toplevel
    export_saved_model(output, p.params, p.config, p.task, p.num_labels, p.tokenizer, p.head,
                       overwrite)
  else:
    from bert_jax.checkpoint.params_only import export_params_only  # pylint: disable=import-outside-toplevel
    export_params_only(output, p.params, p.config, p.head, p.tokenizer, overwrite)
  return output


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not FLAGS.workdir or not FLAGS.output:
    raise app.UsageError("--workdir and --output are required")
  try:
    out = export(FLAGS.workdir, FLAGS.format, FLAGS.output, FLAGS.task, FLAGS.overwrite)
  except (ValueError, FileNotFoundError, FileExistsError) as e:
    print(f"export: error: {e}", file=sys.stderr)
    return 2
  print(f"export: wrote {FLAGS.format} to {out}")
  return 0


if __name__ == "__main__":
  app.run(main)
