"""Export a checkpoint for use elsewhere: a Hugging Face directory, a SavedModel, Orbax params.

The library behind ``python -m bert_jax.export`` (see docs/export.md):

  export("workdir/rte", "hf", "out/rte_hf")              # the head from head.json / the weights
  export("workdir/rte", "saved_model", "out/rte_tf", task="encoder")
  p = load_for_export("workdir/rte")                      # checked Pretrained(params, config, ...)

Everything is checked before anything is written: the requested head against the weights
(every tensor and shape), head.json against the classifier, the output directory.
"""

from __future__ import annotations

import json
import os

from bert_jax.formats import hf
from bert_jax.formats.pretrained import Pretrained, load_pretrained

FORMATS = ("hf", "saved_model", "params")


def load_for_export(path: str, task: str | None = None) -> Pretrained:
  """The checkpoint as ``Pretrained``, checked to fit ``task``: every tensor, every shape."""
  from flax import traverse_util  # noqa: PLC0415

  task = hf.IMPORT_ARCHITECTURES.get(task, task) if task else None
  if task is not None and task not in hf.TASKS:
    raise hf.CheckpointError(
      f"--task {task!r} is not one of {hf.TASKS} (or a transformers "
      f"class: {sorted(hf.IMPORT_ARCHITECTURES)})"
    )
  pretrained = load_pretrained(path, task)  # "encoder": the encoder of any checkpoint
  missing_heads = [g for g in pretrained.absent if g in ("mlm", "nsp")]
  if pretrained.task == "pretraining" and missing_heads:
    raise hf.CheckpointError(
      f"{path}: the checkpoint has no {' / '.join(missing_heads)} head "
      f"weights to export as BertForPreTraining; use --task=encoder"
    )
  head_path = os.path.join(path, "head.json")
  if pretrained.task in ("sequence_classification", "token_classification") and os.path.isfile(
    head_path
  ):
    with open(head_path) as f:
      head = json.load(f)
    n, labels = head.get("num_labels"), head.get("labels") or []
    if (n is not None and n != pretrained.num_labels) or (
      labels and len(labels) != pretrained.num_labels
    ):
      raise hf.CheckpointError(
        f"{head_path}: num_labels {n} / {len(labels)} labels, but the classifier in the "
        f"checkpoint has {pretrained.num_labels} outputs"
      )
  want = hf.param_shapes(pretrained.config, pretrained.task, pretrained.num_labels or 2)
  have = {k: tuple(v.shape) for k, v in traverse_util.flatten_dict(pretrained.params).items()}
  problems = [f"{'/'.join(k)}: missing" for k in want if k not in have]
  problems += [
    f"{'/'.join(k)}: {have[k]}, the {pretrained.task} model needs {s}"
    for k, s in want.items()
    if k in have and have[k] != s
  ]
  problems += [
    f"{'/'.join(k)}: not part of a {pretrained.task} model" for k in have if k not in want
  ]
  if problems:
    raise hf.CheckpointError(
      f"{path}: the weights do not fit a {pretrained.task} head:\n  " + "\n  ".join(problems[:10])
    )
  return pretrained


def export(
  path: str,
  fmt: str,
  output: str,
  task: str | None = None,
  overwrite: bool = False,
) -> str:
  """Exports the checkpoint at ``path`` as ``fmt`` into ``output``; returns ``output``.

  ``path`` is the checkpoint itself: a bert_jax workdir (its latest checkpoint), a
  parameters-only export, a Hugging Face directory or a TF checkpoint. A fine-tuning workdir's
  best checkpoint is ``bert_jax.tasks.best_checkpoint.checkpoint_dir(workdir, "best")``."""
  if fmt not in FORMATS:
    raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
  if os.path.exists(output) and os.listdir(output) and not overwrite:
    raise FileExistsError(f"--output {output} exists and is not empty (pass --overwrite)")
  p = load_for_export(path, task)
  if fmt == "hf":
    hf.save_hf(
      output,
      p.params,
      p.config,
      p.tokenizer,
      head=p.task,
      num_labels=p.num_labels,
      labels=list(p.labels) or None,
      overwrite=overwrite,
    )
  elif fmt == "saved_model":
    from bert_jax.formats.saved_model import export_saved_model  # noqa: PLC0415 (TF: heavy)

    export_saved_model(
      output, p.params, p.config, p.task, p.num_labels, p.tokenizer, p.head, overwrite
    )
  else:
    from bert_jax.formats.params_only import export_params_only  # noqa: PLC0415

    export_params_only(output, p.params, p.config, p.head, p.tokenizer, overwrite)
  return output
