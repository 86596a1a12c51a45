"""Downstream tasks: GLUE, SWAG, NER (fine-tuned and feature-based), SQuAD.

Each task implements ``bert_jax.tasks.base.Task``; ``TASKS`` maps a config's ``task`` name to
the class that implements it ("module:Class", imported only when asked for, so that reading the
registry imports neither TensorFlow nor a task's dependencies).
"""

from __future__ import annotations

import importlib
from typing import Any

from bert_jax.tasks.base import SplitData, Task

GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")

TASKS: dict[str, str] = {
  **{name: "bert_jax.tasks.glue:GlueTask" for name in GLUE_TASKS},
  "swag": "bert_jax.tasks.swag:SwagTask",
  "ner": "bert_jax.tasks.ner:NerTask",
  "ner_feature_based": "bert_jax.tasks.feature_based:FeatureBasedNerTask",
  "squad_v1": "bert_jax.tasks.squad:SquadTask",
  "squad_v2": "bert_jax.tasks.squad:SquadTask",
}


def get_task_class(name: str) -> type[Task]:
  """The Task class registered under ``name``; a clear error listing the known names."""
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
  module_name, cls_name = TASKS[name].split(":")
  return getattr(importlib.import_module(module_name), cls_name)


def create_task(config: Any, tokenizer: Any) -> Task:
  """The task named by ``config.task``, built from the run config and a tokenizer."""
  return get_task_class(config.task)(config, tokenizer)


def build_job(config: Any, workdir: str | None = None, mesh: Any = None, *, abstract: bool = False):
  """The ``bert_jax.train.job.Job`` of any run config: fine-tuning when it names a ``task``,
  else pre-training. ``abstract=True`` (or no workdir): shapes only, for compiling the run's
  steps without its data (``python -m bert_jax.compile``); nothing is read or written."""
  if abstract:
    workdir = None
  if "task" in config:
    from bert_jax.tasks.runner import build_finetune_job  # noqa: PLC0415 (imports this module)

    return build_finetune_job(config, workdir, mesh)
  from bert_jax.tasks.pretraining import build_pretraining_job  # noqa: PLC0415 (TF: heavy)

  return build_pretraining_job(config, workdir, mesh)


__all__ = [
  "GLUE_TASKS",
  "TASKS",
  "SplitData",
  "Task",
  "build_job",
  "create_task",
  "get_task_class",
]
