"""Export a checkpoint for use elsewhere: a Hugging Face directory, a SavedModel, Orbax params.

The library behind ``python -m bert_jax.export`` (see docs/export.md):

  export("workdir/rte/best", "hf", "out/rte_hf")          # the head from head.json / the weights
  export("workdir/rte", "saved_model", "out/rte_tf", task="encoder")
  export("workdir/ltr", "hf", "out/ltr_hf")  # objective ltr: BertLMHeadModel (mlm: ForMaskedLM)
  p = load_for_export("workdir/rte")                       # checked Pretrained(params, config, ...)

The first argument is the checkpoint itself (anything ``load_pretrained`` reads); which of a
fine-tuning workdir's checkpoints to take is ``bert_jax.train.best_checkpoint``'s business.
Everything is checked before anything is written: the requested head against the weights
(every tensor and shape), head.json against the classifier, the output directory, which must
not be, contain or lie inside the checkpoint (``bert_jax.checkpoint.outputs``: ``overwrite``
never deletes an input). Every format writes the output whole or not at all, and ``overwrite``
replaces it as a whole (``bert_jax.checkpoint.replace_dir``): no file of an earlier export
survives. The staging folders beside the output (``.<name>.new-<pid>-*``, ``.<name>.old-<pid>-*``)
are removed when an export fails or is interrupted, and those a dead process left behind (killed
outright) are removed, with a log line, by the next export to the same output.
"""

from __future__ import annotations

import os
import re
import shutil

from absl import logging

from bert_jax.checkpoint import ensure_replaceable
from bert_jax.checkpoint.outputs import check_outputs, check_parent
from bert_jax.formats import heads, hf, params_only, saved_model
from bert_jax.formats.heads import CheckpointError
from bert_jax.formats.pretrained import Pretrained, load_pretrained

FORMATS = ("hf", "saved_model", "params")


def load_for_export(path: str, task: str | None = None, fmt: str | None = None) -> Pretrained:
  """The checkpoint as ``Pretrained``, checked to fit ``task``: every tensor, every shape
  (``load_pretrained`` checks the weights against the head and head.json).

  A pre-training checkpoint needs its MLM head, and for ``fmt`` "saved_model" (or None: any
  format) its NSP head as well; ``fmt="hf"`` exports one without NSP (``config.objective``
  mlm / ltr) as the LM head alone: BertForMaskedLM, or BertLMHeadModel for a left-to-right
  model; ``fmt="params"`` keeps it as it is."""
  task = heads.IMPORT_ARCHITECTURES.get(task, task) if task else None
  if task is not None and task not in heads.TASKS:
    raise CheckpointError(
      f"--task {task!r} is not one of {heads.TASKS} (or a transformers "
      f"class: {sorted(heads.IMPORT_ARCHITECTURES)})"
    )
  pretrained = load_pretrained(path, task)  # "encoder": the encoder of any checkpoint
  missing_heads = [g for g in pretrained.absent if g in heads.OPTIONAL_HEADS]
  if pretrained.task != "pretraining" or not missing_heads:
    return pretrained
  if missing_heads == ["nsp"] and fmt in ("hf", "params"):
    return pretrained  # the LM head alone (the paper's "No NSP" / "LTR & No NSP")
  if missing_heads == ["nsp"]:
    wanted = f"--format={fmt}" if fmt else "this export"
    raise CheckpointError(
      f"{path}: the checkpoint has no nsp head (pre-trained without next-sentence prediction: "
      f"objective mlm or ltr), which {wanted} of a pre-training head (BertForPreTraining: "
      "mlm_logits and nsp_logits) needs; use --format=hf (BertForMaskedLM, or BertLMHeadModel "
      "for a left-to-right model), --format=params, or --task=encoder"
    )
  raise CheckpointError(
    f"{path}: the checkpoint has no {' / '.join(missing_heads)} head "
    f"weights to export as BertForPreTraining; use --task=encoder"
  )


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
  best checkpoint is ``bert_jax.train.best_checkpoint.checkpoint_dir(workdir, "best")``.
  """
  if fmt not in FORMATS:
    raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
  check_outputs({"--output": output}, {"--workdir": path}, replaced=("--output",))
  check_parent("--output", output, create=True)
  remove_stale_staging(output)
  try:
    ensure_replaceable(output, overwrite)  # before loading: the writers check again
  except FileExistsError as e:
    raise FileExistsError(f"--output {output} exists and is not empty (pass --overwrite)") from e
  p = load_for_export(path, task, fmt)
  try:
    if fmt == "hf":
      labels = list(p.labels) or None
      hf.save_hf(output, p.params, p.config, p.tokenizer, p.task, p.num_labels, labels, overwrite)
    elif fmt == "saved_model":
      saved_model.export_saved_model(
        output, p.params, p.config, p.task, p.num_labels, p.tokenizer, p.head, overwrite
      )
    else:
      params_only.export_params_only(output, p.params, p.config, p.head, p.tokenizer, overwrite)
  except BaseException:  # an error, KeyboardInterrupt, SystemExit (bert_jax.export's SIGTERM)
    remove_staging(output, [os.getpid()])
    raise
  return output


def _staging(output: str) -> list[tuple[str, str, int]]:
  """(path, "new" | "old", pid) of each staging folder ``replace_dir`` made beside ``output``."""
  head, name = os.path.split(os.path.abspath(output))
  pattern = re.compile(rf"\.{re.escape(name)}\.(new|old)-(\d+)-[0-9a-f]{{8}}")
  try:
    entries = os.listdir(head)
  except OSError:
    return []
  return [
    (os.path.join(head, e), m.group(1), int(m.group(2)))
    for e in sorted(entries)
    if (m := pattern.fullmatch(e))
  ]


def _alive(pid: int) -> bool:
  if pid == os.getpid():
    return True
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except OSError:  # e.g. another user's process
    return True
  return True


def remove_staging(output: str, pids) -> list[str]:
  """Removes the staging folders of ``pids`` beside ``output``; returns their paths. An old
  export renamed aside (``.old-``) is put back instead where ``output`` itself is missing."""
  removed = []
  for path, kind, pid in _staging(output):
    if pid not in pids:
      continue
    if kind == "old" and not os.path.lexists(output):
      os.rename(path, output)  # the old export is the only copy left: restore it
      logging.warning("export: restored %s from %s", output, path)
      continue
    shutil.rmtree(path, ignore_errors=True)
    removed.append(path)
  return removed


def remove_stale_staging(output: str) -> list[str]:
  """Removes the staging folders beside ``output`` that a process no longer running on this
  machine left (an export killed outright), with a log line; returns their paths."""
  dead = {pid for _, _, pid in _staging(output) if not _alive(pid)}
  removed = remove_staging(output, dead) if dead else []
  if removed:
    logging.info(
      "export: removed %d staging folder(s) left by an interrupted export of %s: %s",
      len(removed),
      output,
      ", ".join(os.path.basename(p) for p in removed),
    )
  return removed
