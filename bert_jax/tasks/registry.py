"""The task registry: a config's ``task`` name to the class that implements it.

``TASKS`` maps each name to "module:Class", imported only when asked for, so that reading the
registry (the configs do) imports neither TensorFlow nor a task's dependencies.
"""

from __future__ import annotations

import importlib
from typing import Any

from bert_jax.tasks.base import Task

GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")

TASKS: dict[str, str] = {
  **{name: "bert_jax.tasks.glue.task:GlueTask" for name in GLUE_TASKS},
  "swag": "bert_jax.tasks.swag.task:SwagTask",
  "ner": "bert_jax.tasks.ner.task:NerTask",
  "ner_feature_based": "bert_jax.tasks.ner.feature_based:FeatureBasedNerTask",
  "squad_v1": "bert_jax.tasks.squad.task:SquadTask",
  "squad_v2": "bert_jax.tasks.squad.task:SquadTask",
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
