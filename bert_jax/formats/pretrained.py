"""``load_pretrained(path)``: one entry to every kind of BERT checkpoint bert_jax can start from.

Detected by what ``path`` holds:

* a bert_jax workdir (``model_config.json`` + ``checkpoints/``): the latest Orbax checkpoint,
  through ``bert_jax.checkpoint.load_params``, or a given step (``<workdir>/checkpoints/<step>``); or a parameters-only export
  (``model_config.json`` + ``params/``, ``bert_jax.formats.params_only``);
* a Hugging Face directory (``config.json`` + ``model.safetensors`` / ``pytorch_model.bin``,
  possibly sharded), any ``BertModel`` / ``BertFor*`` class, with or without the ``bert.``
  prefix;
* a google-research/bert TensorFlow checkpoint (a directory with ``bert_config.json`` and
  ``bert_model.ckpt.*``, or the checkpoint prefix itself).

The result's params are a plain nested dict of float32 numpy arrays shaped like the unboxed
``model.init(...)["params"]`` of the matching bert_jax model, encoder under ``"bert"``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from flax import traverse_util
from flax.linen import meta

from bert_jax.checkpoint import load_params
from bert_jax.formats import heads, hf, params_only, tf
from bert_jax.formats.heads import CheckpointError
from bert_jax.model.config import BertConfig
from bert_jax.tokenize import load_tokenizer


@dataclasses.dataclass
class Pretrained:
  """What a checkpoint holds.

  Attributes:
    params: nested dict of numpy arrays (encoder under "bert"; "mlm_*"/"nsp" for pre-training
      heads; "classifier" or "qa_outputs" for a fine-tuned head).
    config: the BertConfig the weights were built with.
    tokenizer: a bert_jax Tokenizer from the checkpoint's vocabulary, or None if it has none.
    source: "bert_jax", "huggingface" or "tensorflow".
    task: the head the weights carry: "encoder" (none), "pretraining",
      "sequence_classification", "token_classification", "question_answering",
      "multiple_choice".
    num_labels: width of a classifier head (None without one).
    labels: label names of a classifier head where the checkpoint stores them, else ().
    absent: optional parts the checkpoint lacks: "mlm" / "nsp" (pre-training heads, then left
      out of params; both for a checkpoint with no head at all, as a BertModel) and
      "bert/pooler" (then initialised as BERT does, since the encoder needs it; a Hugging Face
      BertForTokenClassification / QuestionAnswering has no pooler).
    path: where it was read from.
  """

  params: dict[str, Any]
  config: BertConfig
  tokenizer: Any
  source: str
  task: str = "encoder"
  num_labels: int | None = None
  labels: tuple[str, ...] = ()
  absent: tuple[str, ...] = ()
  path: str = ""

  @property
  def head(self) -> dict[str, Any]:
    """The head as in a workdir's head.json."""
    return {"task": self.task, "num_labels": self.num_labels, "labels": list(self.labels)}


def _tokenizer(directory: pathlib.Path, do_lower_case: bool | None):
  has_vocab = (directory / "vocab.txt").is_file() or any(directory.glob("*.model"))
  if not has_vocab:
    return None
  if do_lower_case is None and not (directory / "tokenizer_config.json").is_file():
    # google-research/bert directories say it only in their name (uncased_L-12_H-768_A-12).
    name = directory.name.lower()
    if "uncased" in name:
      do_lower_case = True
    elif "cased" in name:
      do_lower_case = False
  return load_tokenizer(directory, do_lower_case=do_lower_case)


def _check_vocab(config: BertConfig, tokenizer, source: str) -> None:
  if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
    raise CheckpointError(
      f"{source}: the vocabulary has {tokenizer.vocab_size} tokens but the "
      f"model's vocab_size is {config.vocab_size}"
    )


def _head(task: str | None, inferred: str, source: str) -> str:
  if task is None or task == "encoder":  # "encoder" takes the encoder of any checkpoint
    return task or inferred
  if task not in heads.TASKS:
    raise CheckpointError(f"unknown task {task!r}; choose one of {heads.TASKS}")
  if task != inferred:
    raise CheckpointError(f"{source}: the weights carry a {inferred} head, not {task}")
  return task


def _drop_heads(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {k: v for k, v in tensors.items() if k.startswith("bert.")}


def _assemble(
  tensors,
  original,
  config: BertConfig,
  hf_config: Mapping[str, Any],
  task: str | None,
  source: str,
  config_source: str,
):
  if task in heads.CLASSIFIER_TASKS:  # the weights cannot tell these apart; architectures can
    hf_config = {**hf_config, "architectures": [heads.ARCHITECTURES[task]]}
  headless = not any(k.startswith(("cls.", "classifier.", "qa_outputs.")) for k in tensors)
  if task == "encoder":
    tensors = _drop_heads(tensors)
  task = _head(task, hf.infer_task(tensors, hf_config, source), source)
  num_labels, labels = None, ()
  if task in heads.LABELLED_TASKS:
    num_labels = (
      int(np.shape(tensors["classifier.weight"])[0])
      if ("classifier.weight" in tensors)
      else int(hf_config.get("num_labels", 2))
    )
    labels = tuple(hf.iter_labels(hf_config))
    if labels and len(labels) != num_labels:
      raise CheckpointError(
        f"{source}: the classifier has {num_labels} outputs but the config's "
        f"id2label names {len(labels)} labels"
      )
  params, absent = hf.tensors_to_params(
    tensors, config, task, num_labels or 2, source, original, config_source
  )
  if headless:  # a BertModel checkpoint: say that the pre-training heads are not there
    absent = ("mlm", "nsp") + absent
  return params, task, num_labels, labels, absent


def _config(path: pathlib.Path) -> tuple[BertConfig, dict[str, Any]]:
  d = heads.read_object(path)
  for key, ok in (
    ("position_embedding_type", "absolute"),
    ("add_cross_attention", False),
  ):
    if d.get(key, ok) != ok:
      raise CheckpointError(
        f"{path}: {key}={d[key]!r} is not supported (bert_jax is BERT with {key}={ok!r})"
      )
  if d.get("model_type", "bert") != "bert":
    raise CheckpointError(f"{path}: model_type {d['model_type']!r} is not 'bert'")
  try:
    return BertConfig.from_dict(d, source=str(path)), d
  except ValueError as e:
    raise CheckpointError(str(e)) from e


def load_huggingface(
  directory, task: str | None = None, do_lower_case: bool | None = None
) -> Pretrained:
  directory = pathlib.Path(directory)
  config, hf_config = _config(directory / "config.json")
  tensors, source = hf.read_hf_tensors(directory)
  tensors, original = hf.normalise_names(tensors, source)
  params, task, num_labels, labels, absent = _assemble(
    tensors, original, config, hf_config, task, source, str(directory / "config.json")
  )
  tokenizer = _tokenizer(directory, do_lower_case)
  _check_vocab(config, tokenizer, str(directory))
  return Pretrained(
    params, config, tokenizer, "huggingface", task, num_labels, labels, absent, str(directory)
  )


def load_tensorflow(path, task: str | None = None, do_lower_case: bool | None = None) -> Pretrained:
  path = pathlib.Path(path)
  prefix = tf.find_checkpoint(path)
  if prefix is None:
    raise CheckpointError(f"{path}: no TensorFlow checkpoint (bert_model.ckpt.index) found")
  directory = path if path.is_dir() else path.parent
  config_path = directory / "bert_config.json"
  if not config_path.is_file():
    raise CheckpointError(f"{directory}: no bert_config.json beside the TensorFlow checkpoint")
  config, tf_config = _config(config_path)
  tensors, original = tf.read_tf_checkpoint(prefix)
  params, task, num_labels, labels, absent = _assemble(
    tensors,
    original,
    config,
    {"architectures": ["BertForSequenceClassification"], **tf_config},
    task,
    prefix,
    str(config_path),
  )
  tokenizer = _tokenizer(directory, do_lower_case)
  _check_vocab(config, tokenizer, str(directory))
  return Pretrained(
    params, config, tokenizer, "tensorflow", task, num_labels, labels, absent, prefix
  )


def step_checkpoint(path) -> tuple[pathlib.Path, int] | None:
  """(workdir, step) when ``path`` is one saved step of a bert_jax run,
  ``<workdir>/checkpoints/<step>``; else None."""
  path = pathlib.Path(path)
  workdir = path.parent.parent
  if (
    path.name.isdigit()
    and path.parent.name == "checkpoints"
    and path.is_dir()
    and (workdir / heads.MODEL_CONFIG_FILE).is_file()
  ):
    return workdir, int(path.name)
  return None


def load_bert_jax(workdir, task: str | None = None) -> Pretrained:
  """The latest checkpoint of a bert_jax workdir (through the Orbax manager), one saved step of
  it (``<workdir>/checkpoints/<step>``, e.g. to fine-tune from an earlier point of pre-training),
  or a parameters-only export (``params/`` beside ``model_config.json``)."""
  step = None
  at_step = step_checkpoint(workdir)
  if at_step is not None:
    workdir, step = at_step
  workdir = pathlib.Path(workdir)
  try:
    if (workdir / "checkpoints").is_dir():
      params, config, tokenizer = load_params(str(workdir), step)
    else:
      params, config, _, tokenizer = params_only.restore_params_only(str(workdir))
  except FileNotFoundError as e:
    raise CheckpointError(f"{workdir}: {e}") from e
  params = traverse_util.unflatten_dict(
    {k: np.asarray(v) for k, v in traverse_util.flatten_dict(dict(meta.unbox(params))).items()}
  )
  # Parameters that exist only for training (a defence's adversary) are not part of the model.
  params = {k: v for k, v in params.items() if k not in heads.TRAINING_ONLY_SUBTREES}
  head = heads.read_head(workdir)
  if "qa_outputs" in params:
    inferred = "question_answering"
  elif "classifier" in params:
    inferred = head.get("task") or "sequence_classification"
  else:
    inferred = "pretraining" if "nsp" in params or "mlm_output_bias" in params else "encoder"
  found = _head(task, inferred, str(workdir))
  absent = tuple(
    g
    for g, k in (("mlm", "mlm_output_bias"), ("nsp", "nsp"))
    if k not in params
    and found in ("pretraining", "encoder")
    and inferred in ("pretraining", "encoder")
  )
  if found == "encoder":
    params = {"bert": params["bert"]}
  num_labels, labels = None, tuple(head.get("labels") or ())
  if "classifier" in params and found != "multiple_choice":
    num_labels = int(np.shape(params["classifier"]["kernel"])[-1])
    heads.check_head(head, num_labels, str(workdir / heads.HEAD_FILE))
  heads.check_params(params, config, found, num_labels, str(workdir), absent)
  return Pretrained(
    params,
    config,
    tokenizer,
    "bert_jax",
    found,
    num_labels,
    labels if num_labels else (),
    absent,
    str(workdir),
  )


def detect(path) -> str:
  """ "bert_jax", "huggingface" or "tensorflow": what kind of checkpoint ``path`` is."""
  path = pathlib.Path(path)
  if (
    path.is_dir()
    and (path / heads.MODEL_CONFIG_FILE).is_file()
    and ((path / "checkpoints").is_dir() or (path / params_only.PARAMS_DIR).is_dir())
  ):
    return "bert_jax"
  if step_checkpoint(path) is not None:
    return "bert_jax"
  if path.is_dir() and hf.is_hf_directory(path):
    return "huggingface"
  if tf.find_checkpoint(path) is not None:
    return "tensorflow"
  if not path.exists() and not pathlib.Path(str(path) + ".index").exists():
    raise CheckpointError(f"{path}: no such file or directory")
  raise CheckpointError(
    f"{path}: not a checkpoint bert_jax knows: expected a bert_jax workdir (model_config.json "
    f"+ checkpoints/), a Hugging Face directory (config.json + model.safetensors or "
    f"pytorch_model.bin) or a google-research/bert TensorFlow checkpoint (bert_config.json + "
    f"bert_model.ckpt.index)"
  )


def load_pretrained(
  path: str | os.PathLike, task: str | None = None, do_lower_case: bool | None = None
) -> Pretrained:
  """Reads any BERT checkpoint bert_jax knows into numpy params + BertConfig + tokenizer.

  Args:
    path: a bert_jax workdir (its latest checkpoint) or one step of it
      (``<workdir>/checkpoints/<step>``), a Hugging Face model directory, or a
      google-research/bert directory / checkpoint prefix.
    task: the head to import (default: the one the checkpoint carries); another head is an
      error. "encoder" takes only the encoder (params["bert"]) of any checkpoint.
    do_lower_case: overrides the tokenizer's casing (default: tokenizer_config.json, else the
      google-research directory name "uncased_..."/"cased_...", else lower-casing).

  Raises:
    CheckpointError (a ValueError) naming the file and tensor for anything unknown, missing,
    mis-shaped or unreadable.
  """
  kind = detect(path)
  if kind == "bert_jax":
    return load_bert_jax(path, task)
  if kind == "huggingface":
    return load_huggingface(path, task, do_lower_case)
  return load_tensorflow(path, task, do_lower_case)
