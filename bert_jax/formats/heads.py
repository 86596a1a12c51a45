"""What a checkpoint's head is, and the checks every format shares.

* the task table: ``TASKS`` (the heads bert_jax has), the Hugging Face class of each
  (``ARCHITECTURES``) and the classes found in the wild that import onto one
  (``IMPORT_ARCHITECTURES``);
* ``model_for_task``: the Flax module whose params a checkpoint of that head holds, and
  ``param_shapes``: the shapes of its unboxed ``init`` params (no compute);
* ``check_params``: params exactly shaped like that (the one tensor shape check);
* ``head.json`` (``{"task", "num_labels", "labels"}``, beside a workdir's model): ``check_head``
  against the classifier in the weights, and ``write_model_files`` (``model_config.json``,
  ``head.json`` and the tokenizer files, which every export carries).

``CheckpointError`` (a ValueError) is what every format raises for a checkpoint it cannot
import or export; its message names the file and the tensor.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bert_jax import model as models
from bert_jax.checkpoint import read_json, write_json
from bert_jax.model.config import BertConfig

TASKS = (
  "encoder",
  "pretraining",
  "sequence_classification",
  "token_classification",
  "question_answering",
  "multiple_choice",
)
ARCHITECTURES = {
  "encoder": "BertModel",
  "pretraining": "BertForPreTraining",
  "sequence_classification": "BertForSequenceClassification",
  "token_classification": "BertForTokenClassification",
  "question_answering": "BertForQuestionAnswering",
  "multiple_choice": "BertForMultipleChoice",
}
# Heads with a "classifier" tensor.
CLASSIFIER_TASKS = ("sequence_classification", "token_classification", "multiple_choice")
# Heads whose classifier width is num_labels (multiple choice scores each choice: width 1).
LABELLED_TASKS = ("sequence_classification", "token_classification")
# Hugging Face classes whose encoder has no pooler (add_pooling_layer=False).
NO_POOLER = ("token_classification", "question_answering")
# Architectures found in the wild that import onto one of our tasks.
IMPORT_ARCHITECTURES = {
  **{v: k for k, v in ARCHITECTURES.items()},
  "BertForMaskedLM": "pretraining",
  "BertForNextSentencePrediction": "pretraining",
  "BertLMHeadModel": "pretraining",
}
# Top-level params of the optional pre-training heads (named in Pretrained.absent).
OPTIONAL_HEADS = {"mlm": ("mlm_transform", "mlm_LayerNorm", "mlm_output_bias"), "nsp": ("nsp",)}
HEAD_FILE = "head.json"
MODEL_CONFIG_FILE = "model_config.json"


class CheckpointError(ValueError):
  """A checkpoint that cannot be imported or exported; the message names file and tensor."""


# Top-level params a run trains beside the model and never exports: a privacy defence's
# adversary (bert_jax/tasks/privacy/defences.py).
TRAINING_ONLY_SUBTREES = ("adversary",)


def check_task(task: str) -> str:
  if task not in TASKS:
    raise CheckpointError(f"unknown head task {task!r}; choose one of {TASKS}")
  return task


def model_for_task(config: BertConfig, task: str, num_labels: int | None = None) -> nn.Module:
  """The Flax module whose params a ``task`` checkpoint holds (encoder: ``BertEncoder``, whose
  params a checkpoint keeps under "bert")."""
  modules = {
    "encoder": lambda: models.BertEncoder(config),
    "pretraining": lambda: models.BertForPreTraining(config),
    "sequence_classification": lambda: models.BertForSequenceClassification(config, num_labels),
    "token_classification": lambda: models.BertForTokenClassification(config, num_labels),
    "question_answering": lambda: models.BertForQuestionAnswering(config),
    "multiple_choice": lambda: models.BertForMultipleChoice(config),
  }
  return modules[check_task(task)]()


def param_shapes(config: BertConfig, task: str, num_labels: int) -> dict[tuple[str, ...], tuple]:
  """The shapes of the unboxed ``model.init(...)["params"]`` of ``task``'s model (no compute),
  by path; the encoder's under "bert" for every task."""
  module = model_for_task(config, task, num_labels)
  ids = jnp.zeros((1, 1, 2) if task == "multiple_choice" else (1, 2), jnp.int32)
  variables = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), ids))
  flat = traverse_util.flatten_dict(nn.meta.unbox(variables["params"]))
  prefix = ("bert",) if task == "encoder" else ()
  return {prefix + k: tuple(v.shape) for k, v in flat.items()}


def listing(names, limit: int = 8) -> str:
  """``a, b, c ... and 5 more``: a message's list of names, sorted, at most ``limit`` shown."""
  names = sorted(names)
  more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


def check_params(
  params: Mapping[str, Any],
  config: BertConfig,
  task: str,
  num_labels: int | None,
  source: str,
  absent: tuple[str, ...] = (),
) -> None:
  """CheckpointError unless ``params`` are exactly shaped like the unboxed ``model.init`` of
  ``task``'s model: nothing missing (but the pre-training heads named in ``absent``), nothing
  extra, every shape as ``config`` implies."""
  want = param_shapes(config, task, num_labels or 2)
  skipped = {k for g in absent for k in OPTIONAL_HEADS.get(g, ())}
  want = {k: v for k, v in want.items() if k[0] not in skipped}
  have = {k: tuple(np.shape(v)) for k, v in traverse_util.flatten_dict(dict(params)).items()}
  problems = [f"{'/'.join(k)} is missing" for k in want if k not in have]
  problems += [
    f"{'/'.join(k)} has shape {list(have[k])}, model_config.json implies {list(v)}"
    for k, v in want.items()
    if k in have and have[k] != v
  ]
  problems += [
    f"{'/'.join(k)} is not part of a {ARCHITECTURES[task]}" for k in have if k not in want
  ]
  if problems:
    raise CheckpointError(
      f"{source}: the checkpoint's params do not fit its model: "
      + "; ".join(problems[:8])
      + (f" ... and {len(problems) - 8} more" if len(problems) > 8 else "")
    )


def read_object(path: str | os.PathLike) -> dict[str, Any]:
  """A JSON object from ``path``; CheckpointError naming the file otherwise."""
  try:
    d = read_json(path)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{path}: not a readable JSON file: {e}") from e
  if not isinstance(d, dict):
    raise CheckpointError(f"{path}: expected a JSON object, got {type(d).__name__}")
  return d


def read_head(directory: str | os.PathLike) -> dict[str, Any]:
  """``<directory>/head.json``, or {} when there is none."""
  path = os.path.join(directory, HEAD_FILE)
  return read_object(path) if os.path.isfile(path) else {}


def check_head(head: Mapping[str, Any], num_labels: int, source: str) -> None:
  """CheckpointError unless head.json's ``num_labels`` and ``labels`` (where given) agree with
  the ``num_labels`` outputs of the classifier in the weights."""
  n, labels = head.get("num_labels"), head.get("labels") or []
  if (n is not None and n != num_labels) or (labels and len(labels) != num_labels):
    raise CheckpointError(
      f"{source}: num_labels {n} / {len(labels)} labels, but the classifier in the "
      f"checkpoint has {num_labels} outputs"
    )


def write_model_files(
  directory: str, config: BertConfig, head: Mapping[str, Any], tokenizer=None
) -> None:
  """``model_config.json``, ``head.json`` and the tokenizer's files (when there is one)."""
  os.makedirs(directory, exist_ok=True)
  write_json(os.path.join(directory, MODEL_CONFIG_FILE), config.to_dict())
  write_json(os.path.join(directory, HEAD_FILE), dict(head))
  if tokenizer is not None:
    tokenizer.save(directory)
