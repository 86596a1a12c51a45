"""What a fine-tuning run reads and writes besides checkpoints: model, tokenizer, workdir files.

Where the encoder and tokenizer come from, in order:
  1. resuming (the workdir already holds ``model_config.json`` and checkpoints): the workdir's
     own model config and tokenizer files, so a resumed run is the same model;
  2. ``config.init_checkpoint`` (a bert_jax workdir, a Hugging Face directory, a TF checkpoint,
     via ``bert_jax.formats.load_pretrained``): its BertConfig and tokenizer;
  3. from scratch: ``BertConfig.from_preset(config.model_preset)`` sized to the tokenizer.
``config.vocab_file`` (with ``do_lower_case``) replaces the tokenizer in cases 2 and 3. The run
config's model settings (``dtype``, ``remat``, dropout rates, ``attention_kernel`` resolved for
the mesh's platform) are applied on top of the architecture by the one factory every run's
encoder comes from, ``bert_jax.model.run_settings.run_bert_config``.

A workdir (common.md): config.json, model_config.json, vocab.txt / sentencepiece.model +
tokenizer_config.json, head.json, checkpoints/ (latest, for resume), best/ (a bert_jax workdir
of the best checkpoint on dev), tensorboard/, metrics.json, summary.json, predictions/.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
from typing import Any

import jax
import ml_collections

from bert_jax.checkpoint import read_json, write_json
from bert_jax.formats import load_pretrained
from bert_jax.model import BertConfig
from bert_jax.model.kernels.attention import platform_of
from bert_jax.model.run_settings import TRAINING_KEYS, run_bert_config
from bert_jax.tasks.registry import TASKS, get_task_class
from bert_jax.tokenize import load_tokenizer
from bert_jax.train.best_checkpoint import has_checkpoint

# Run-config keys added after workdirs were first written, with the value that reproduces what
# such an older run did (no bucketing; JAX's own compilation-cache setting).
_ADDED_KEYS = {
  "length_buckets": "",
  "packing": {"enabled": False, "max_sequences_per_row": 16},
  "attention_kernel": "reference",
  "remat": False,
  "compilation_cache": {"dir": "", "min_compile_time_secs": 1.0, "max_size_bytes": -1},
}
PREDICTIONS_DIR = "predictions"


@dataclasses.dataclass
class ModelSetup:
  bert_config: BertConfig
  tokenizer: Any
  pretrained: Any = None  # bert_jax.formats.Pretrained when initialising


def read_model_config(workdir: str) -> BertConfig:
  path = os.path.join(workdir, "model_config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{workdir} is not a bert_jax workdir: no model_config.json")
  with open(path) as f:
    return BertConfig.from_dict(json.load(f), source=path)


def _tokenizer(path: str, do_lower_case):
  return load_tokenizer(path, do_lower_case=do_lower_case)


CAUSAL_CHOICES = ("error", "causal", "bidirectional")


def _causal_attention(config: ml_collections.ConfigDict, is_decoder: bool) -> bool:
  """Whether the fine-tuned encoder attends left-to-right (config.causal_checkpoint)."""
  choice = config.causal_checkpoint
  if choice not in CAUSAL_CHOICES:
    raise ValueError(f"config.causal_checkpoint={choice!r} is not one of {CAUSAL_CHOICES}")
  if is_decoder and choice == "error":
    raise ValueError(
      f"{config.init_checkpoint or 'the workdir'}: a left-to-right (causal, is_decoder) "
      f"checkpoint, and task {config.task!r} reads bidirectional context: set "
      "config.causal_checkpoint='causal' to fine-tune it left-to-right or 'bidirectional' "
      "to use its weights with full attention"
    )
  return is_decoder and choice == "causal"


def run_model_config(
  bert_config: BertConfig, config, mesh=None, *, is_decoder=None, keys=TRAINING_KEYS
) -> BertConfig:
  """``bert_config`` made the run's by ``bert_jax.model.run_settings.run_bert_config``: the run
  config's ``keys`` (numerics, dropout rates), ``is_decoder`` (None: the model's) and the kernel
  ``config.attention_kernel`` resolves to on ``mesh``'s platform (jax's default devices without
  a mesh); one-line ValueError naming the key."""
  return run_bert_config(
    bert_config, config, platform=platform_of(mesh), is_decoder=is_decoder, keys=keys
  )


def resolve_model(config: ml_collections.ConfigDict, workdir: str, mesh=None) -> ModelSetup:
  """The encoder config, tokenizer and (when initialising) pretrained weights of a run on
  ``mesh`` (its platform decides ``config.attention_kernel='auto'``)."""
  if has_checkpoint(workdir) and os.path.isfile(os.path.join(workdir, "model_config.json")):
    setup = ModelSetup(read_model_config(workdir), _tokenizer(workdir, None))
  else:
    pretrained, tokenizer, bert_config = None, None, None
    if config.init_checkpoint:
      pretrained = load_pretrained(config.init_checkpoint)
      bert_config, tokenizer = pretrained.config, pretrained.tokenizer
    if config.vocab_file:
      tokenizer = _tokenizer(config.vocab_file, config.do_lower_case)
    elif (
      tokenizer is not None
      and config.do_lower_case is not None
      and tokenizer.do_lower_case != config.do_lower_case
    ):
      tokenizer = _tokenizer(config.init_checkpoint, config.do_lower_case)
    if tokenizer is None:
      raise ValueError(
        "no tokenizer: config.init_checkpoint is empty or has no vocabulary; "
        "set config.vocab_file (a vocab.txt or SentencePiece .model)"
      )
    if bert_config is None:
      bert_config = BertConfig.from_preset(config.model_preset, vocab_size=tokenizer.vocab_size)
    if tokenizer.vocab_size > bert_config.vocab_size:
      raise ValueError(
        f"the tokenizer has {tokenizer.vocab_size} tokens but the model's "
        f"vocab_size is {bert_config.vocab_size} (config.vocab_file does not "
        "belong to config.init_checkpoint?)"
      )
    setup = ModelSetup(bert_config, tokenizer, pretrained)
  causal = _causal_attention(config, setup.bert_config.is_decoder)
  setup.bert_config = run_model_config(setup.bert_config, config, mesh, is_decoder=causal)
  return setup


def write_run_files(
  workdir: str, config: ml_collections.ConfigDict, setup: ModelSetup, head: dict
) -> None:
  """config.json, model_config.json, tokenizer files and head.json (process 0 only)."""
  if jax.process_index() != 0:
    return
  os.makedirs(workdir, exist_ok=True)
  write_json(os.path.join(workdir, "config.json"), json.loads(config.to_json_best_effort()))
  write_json(os.path.join(workdir, "model_config.json"), setup.bert_config.to_dict())
  write_json(os.path.join(workdir, "head.json"), head)
  setup.tokenizer.save(workdir)


def copy_model_files(workdir: str, target: str) -> None:
  """model_config.json, head.json and the tokenizer files of ``workdir`` into ``target``."""
  if jax.process_index() != 0:
    return
  os.makedirs(target, exist_ok=True)
  for name in (
    "model_config.json",
    "head.json",
    "config.json",
    "vocab.txt",
    "sentencepiece.model",
    "tokenizer_config.json",
  ):
    src = os.path.join(workdir, name)
    if os.path.isfile(src):
      shutil.copyfile(src, os.path.join(target, name))


def read_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved run config a fine-tuning run saved in ``workdir/config.json``."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{workdir} holds no config.json: not a fine-tuning workdir")
  d = read_json(path)
  if not isinstance(d, dict):
    raise ValueError(f"{path}: not a JSON object; expected a run's config")
  if "task" not in d:
    raise ValueError(f"{path}: no 'task' key; this is not a fine-tuning run (pre-training?)")
  for key, value in _ADDED_KEYS.items():
    d.setdefault(key, value)
  if d["task"] in TASKS:  # the task's own later keys (an unknown task is create_task's error)
    for key, value in get_task_class(d["task"]).added_config_keys.items():
      d.setdefault(key, copy.deepcopy(value))
  if "logical_axis_rules" in d:
    d["logical_axis_rules"] = tuple(tuple(r) for r in d["logical_axis_rules"])
  return ml_collections.ConfigDict(d)
