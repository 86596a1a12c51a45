"""Hugging Face BERT checkpoints <-> bert_jax params.

The one table of names in this package: every bert_jax parameter path beside the Hugging Face
(PyTorch) tensor name it corresponds to and how the array is laid out there. PyTorch ``Linear``
weights are ``[out, in]``; bert_jax's dense kernels are ``[in..., out...]`` (the
attention projections split the hidden axis into heads x head_dim). TensorFlow checkpoints
(``tf.py``) are first renamed onto the Hugging Face names, so both imports share one validation.

Reading a directory's tensors (``read_hf_tensors``, ``normalise_names``, ``infer_task``),
turning tensors into params (``tensors_to_params``) and back (``params_to_tensors``), and writing
a directory that ``transformers`` loads with ``from_pretrained`` (``save_hf``). The heads
themselves (which tasks, which classes, which shapes) are ``heads.py``'s.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import numpy as np
import safetensors
import safetensors.numpy
from flax import traverse_util

from bert_jax.checkpoint import ensure_replaceable, read_json, replace_dir, write_json
from bert_jax.formats.heads import (
  ARCHITECTURES,
  CLASSIFIER_TASKS,
  IMPORT_ARCHITECTURES,
  LABELLED_TASKS,
  NO_POOLER,
  CheckpointError,
  check_task,
  listing,
  param_shapes,
)
from bert_jax.model.config import BertConfig

# Parameter groups that a checkpoint may lack (named in Pretrained.absent).
OPTIONAL_GROUPS = ("bert/pooler", "mlm", "nsp")
# Buffers, not parameters, that Hugging Face checkpoints may carry.
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
# A pre-training head without next-sentence prediction (the paper's Table 5 "No NSP" and "LTR &
# No NSP", config.objective mlm / ltr) is the LM head alone: Hugging Face's BertForMaskedLM, or
# BertLMHeadModel (is_decoder: causal attention, row i predicts token i + 1) for a left-to-right
# model. Neither has a pooler.
MASKED_LM, CAUSAL_LM = "BertForMaskedLM", "BertLMHeadModel"


def architecture(config: BertConfig, task: str, next_sentence: bool = True) -> str:
  """The Hugging Face class of ``task``'s model; a pre-training head without the NSP part is
  BertForMaskedLM, or BertLMHeadModel when ``config.is_decoder``."""
  if task == "pretraining" and not next_sentence:
    return CAUSAL_LM if config.is_decoder else MASKED_LM
  return ARCHITECTURES[task]


# Layouts: "same" (identical arrays), "vector" (a bias flattened in HF) or an int n: a kernel
# whose first n bert_jax axes are the inputs, stored [out, in] by PyTorch.
Layout = Any


@dataclasses.dataclass(frozen=True)
class Entry:
  path: tuple[str, ...]  # bert_jax parameter path from the root of the model's params
  name: str  # Hugging Face tensor name (with the "bert." prefix where the class has one)
  layout: Layout
  group: str  # "bert", "bert/pooler", "mlm", "nsp", "classifier", "qa_outputs"


def _linear(path, name, n_in, group):
  return [
    Entry(path + ("kernel",), name + ".weight", n_in, group),
    Entry(path + ("bias",), name + ".bias", "vector", group),
  ]


def _layer_norm(path, name, group):
  return [
    Entry(path + ("scale",), name + ".weight", "same", group),
    Entry(path + ("bias",), name + ".bias", "same", group),
  ]


def entries(
  config: BertConfig,
  task: str,
  num_labels: int = 2,
  prefix: str = "bert.",
  next_sentence: bool = True,
) -> list[Entry]:
  """Every parameter of ``task``'s model with its Hugging Face name (encoder under ``prefix``);
  ``next_sentence=False`` leaves a pre-training head's NSP classifier out."""
  b, p = ("bert",), prefix
  out = [
    Entry(b + ("embeddings", n, "embedding"), f"{p}embeddings.{n}.weight", "same", "bert")
    for n in ("word_embeddings", "position_embeddings", "token_type_embeddings")
  ]
  out += _layer_norm(b + ("embeddings", "LayerNorm"), f"{p}embeddings.LayerNorm", "bert")
  for i in range(config.num_hidden_layers):
    jl, hl = b + (f"layer_{i}",), f"{p}encoder.layer.{i}."
    for n in ("query", "key", "value"):
      out += _linear(jl + ("attention", n), hl + f"attention.self.{n}", 1, "bert")
    out += _linear(jl + ("attention", "output"), hl + "attention.output.dense", 2, "bert")
    out += _layer_norm(jl + ("attention_LayerNorm",), hl + "attention.output.LayerNorm", "bert")
    out += _linear(jl + ("intermediate",), hl + "intermediate.dense", 1, "bert")
    out += _linear(jl + ("output",), hl + "output.dense", 1, "bert")
    out += _layer_norm(jl + ("output_LayerNorm",), hl + "output.LayerNorm", "bert")
  out += _linear(b + ("pooler",), f"{p}pooler.dense", 1, "bert/pooler")
  if task == "pretraining":
    out += _linear(("mlm_transform",), "cls.predictions.transform.dense", 1, "mlm")
    out += _layer_norm(("mlm_LayerNorm",), "cls.predictions.transform.LayerNorm", "mlm")
    out.append(Entry(("mlm_output_bias",), "cls.predictions.bias", "same", "mlm"))
    if next_sentence:
      out += _linear(("nsp",), "cls.seq_relationship", 1, "nsp")
  elif task in CLASSIFIER_TASKS:
    out += _linear(("classifier",), "classifier", 1, "classifier")
  elif task == "question_answering":
    out += _linear(("qa_outputs",), "qa_outputs", 1, "qa_outputs")
  elif task != "encoder":
    check_task(task)
  return out


def hf_shape(shape: Sequence[int], layout: Layout) -> tuple[int, ...]:
  if layout == "same":
    return tuple(shape)
  if layout == "vector":
    return (math.prod(shape),)
  return (math.prod(shape[layout:]), math.prod(shape[:layout]))


def to_params_layout(x: np.ndarray, layout: Layout, shape: Sequence[int]) -> np.ndarray:
  if layout in ("same", "vector"):
    return x.reshape(shape)
  return np.ascontiguousarray(x.T).reshape(shape)


def to_hf_layout(x: np.ndarray, layout: Layout) -> np.ndarray:
  if layout == "same":
    return np.ascontiguousarray(x)
  if layout == "vector":
    return np.ascontiguousarray(x.reshape(-1))
  n_in = math.prod(x.shape[:layout])
  return np.ascontiguousarray(x.reshape(n_in, -1).T)


def _init_like(shape, config: BertConfig, seed: int) -> np.ndarray:
  """BERT's initialisation (truncated normal) for a parameter the checkpoint lacks."""
  if len(shape) == 1:
    return np.zeros(shape, np.float32)
  rng = np.random.default_rng(seed)
  return (np.clip(rng.standard_normal(shape), -2, 2) * config.initializer_range).astype(np.float32)


def tensors_to_params(
  tensors: Mapping[str, np.ndarray],
  config: BertConfig,
  task: str,
  num_labels: int,
  source: str,
  original: Mapping[str, str] | None = None,
  config_source: str = "the config",
) -> tuple[dict[str, Any], tuple[str, ...]]:
  """Hugging Face-named tensors (prefix already normalised to "bert.") -> nested params.

  Returns ``(params, absent)``: ``absent`` lists the optional groups the checkpoint lacked
  ("bert/pooler" is then initialised as BERT does, since ``BertEncoder`` needs it; a missing
  "mlm"/"nsp" head is left out of params). Anything unknown, missing or mis-shaped raises
  CheckpointError whose message starts with ``source`` (the file) and names each tensor by its
  name there (``original`` maps our names back to it).
  """
  original = original or {}
  describe = lambda n: repr(original.get(n, n))
  all_entries = entries(config, task, num_labels)
  shapes = param_shapes(config, task, num_labels)
  present_groups = {e.group for e in all_entries if e.name in tensors}
  if any(n.startswith("cls.predictions.") for n in tensors):
    present_groups.add("mlm")  # a decoder alone is a partial MLM head: reported missing below
  absent = tuple(
    g for g in OPTIONAL_GROUPS if g not in present_groups and any(e.group == g for e in all_entries)
  )
  wanted = [e for e in all_entries if e.group not in absent]
  known = {e.name for e in all_entries} | set(BUFFERS)
  if task == "pretraining":
    known |= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
  unknown = [n for n in tensors if n not in known]
  if unknown:
    layers = sorted(
      {n.split(".")[3] for n in unknown if n.startswith("bert.encoder.layer.")}, key=int
    )
    hint = (
      f" ({config_source} says num_hidden_layers={config.num_hidden_layers} but the weights "
      f"have layer(s) {', '.join(layers)})"
      if layers
      else ""
    )
    raise CheckpointError(
      f"{source}: unknown tensor(s) for a {ARCHITECTURES[task]}{hint}: "
      + listing([describe(n) for n in unknown])
    )
  missing = [e.name for e in wanted if e.name not in tensors]
  if missing:
    raise CheckpointError(
      f"{source}: missing tensor(s) for a {ARCHITECTURES[task]}: "
      + listing([describe(n) for n in missing])
    )
  flat = {}
  for e in wanted:
    shape = shapes[e.path]
    x = np.asarray(tensors[e.name])
    if tuple(x.shape) != hf_shape(shape, e.layout):
      raise CheckpointError(
        f"{source}: tensor {describe(e.name)} has shape {list(x.shape)} but {config_source} "
        f"(vocab_size={config.vocab_size}, hidden_size={config.hidden_size}, "
        f"intermediate_size={config.intermediate_size}, num_attention_heads="
        f"{config.num_attention_heads}, max_position_embeddings="
        f"{config.max_position_embeddings}, type_vocab_size={config.type_vocab_size}"
        f"{f', num_labels={num_labels}' if e.group == 'classifier' else ''}) implies "
        f"{list(hf_shape(shape, e.layout))}"
      )
    if not (np.issubdtype(x.dtype, np.floating) or x.dtype.name == "bfloat16"):
      raise CheckpointError(
        f"{source}: tensor {describe(e.name)} has dtype {x.dtype}, not floating point"
      )
    flat[e.path] = to_params_layout(x.astype(np.float32), e.layout, shape)
  for name, tied in (
    ("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
    ("cls.predictions.decoder.bias", "cls.predictions.bias"),
  ):
    if (
      name in tensors
      and "mlm" not in absent
      and not np.array_equal(
        np.asarray(tensors[name], np.float32), np.asarray(tensors[tied], np.float32)
      )
    ):
      raise CheckpointError(
        f"{source}: tensor {describe(name)} differs from {describe(tied)}; "
        "BERT ties them and bert_jax does not support an untied MLM decoder"
      )
  if "bert/pooler" in absent:
    for i, e in enumerate(x for x in all_entries if x.group == "bert/pooler"):
      flat[e.path] = _init_like(shapes[e.path], config, seed=i)
  params: dict[str, Any] = {}
  for path, x in flat.items():
    node = params
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = x
  return params, absent


def params_to_tensors(
  params: Mapping[str, Any],
  config: BertConfig,
  task: str,
  num_labels: int,
  next_sentence: bool = True,
) -> dict[str, np.ndarray]:
  """Nested params -> the state dict of the Hugging Face class for ``task``
  (``architecture(config, task, next_sentence)``; the LM head alone, without a pooler, for a
  pre-training head with ``next_sentence=False``)."""
  flat = traverse_util.flatten_dict(dict(params))
  prefix = "" if task == "encoder" else "bert."
  arch = architecture(config, task, next_sentence)
  wanted = entries(config, task, num_labels, prefix, next_sentence)
  if task in NO_POOLER or arch in (MASKED_LM, CAUSAL_LM):
    wanted = [e for e in wanted if e.group != "bert/pooler"]
  shapes = param_shapes(config, task, num_labels)
  missing = ["/".join(e.path) for e in wanted if e.path not in flat]
  if missing:
    raise CheckpointError(f"params lack what a {arch} needs: {listing(missing)}")
  known = {e.path for e in entries(config, task, num_labels, next_sentence=next_sentence)}
  # "encoder" exports the encoder of any model: its head is left out on purpose.
  extra = [
    "/".join(k) for k in flat if k not in known and not (task == "encoder" and k[0] != "bert")
  ]
  if extra:
    raise CheckpointError(
      f"params have entries a {arch} has no place for: "
      f"{listing(extra)}; pass the right head (and num_labels)"
    )
  out = {}
  for e in wanted:
    x = np.asarray(flat[e.path], np.float32)
    if x.shape != shapes[e.path]:
      raise CheckpointError(
        f"param {'/'.join(e.path)} has shape {list(x.shape)}, the config "
        f"implies {list(shapes[e.path])}"
      )
    out[e.name] = to_hf_layout(x, e.layout)
  return out


# --- reading a directory -------------------------------------------------------------------

WEIGHT_FILES = (
  "model.safetensors",
  "model.safetensors.index.json",
  "pytorch_model.bin",
  "pytorch_model.bin.index.json",
)


def is_hf_directory(path: pathlib.Path) -> bool:
  return (path / "config.json").is_file() and any((path / f).is_file() for f in WEIGHT_FILES)


def _read_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
  try:
    return safetensors.numpy.load_file(str(path))
  except (safetensors.SafetensorError, OSError, ValueError, TypeError) as e:
    raise CheckpointError(
      f"{path}: not a readable safetensors file (truncated or corrupt?): {e}"
    ) from e


def _read_torch(path: pathlib.Path) -> dict[str, np.ndarray]:
  try:
    import torch  # noqa: PLC0415 (optional, heavy: only for a .bin checkpoint)
  except ImportError as e:
    raise CheckpointError(
      f"{path}: reading a pytorch_model.bin needs torch installed; or "
      "convert it to model.safetensors"
    ) from e
  try:
    state = torch.load(str(path), map_location="cpu", weights_only=True)
  except Exception as e:  # pylint: disable=broad-except  # torch raises many kinds
    raise CheckpointError(f"{path}: not a readable PyTorch state dict: {e}") from e
  return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}


def read_hf_tensors(directory: pathlib.Path) -> tuple[dict[str, np.ndarray], str]:
  """All tensors of a Hugging Face directory and the weights file (or index) they came from."""
  for name in WEIGHT_FILES:
    path = directory / name
    if not path.is_file():
      continue
    if name.endswith(".index.json"):
      try:
        weight_map = read_json(path)["weight_map"]
      except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: not a valid index (needs a 'weight_map'): {e}") from e
      files = sorted(set(weight_map.values()))
    else:
      files = [name]
    tensors = {}
    for f in files:
      reader = _read_safetensors if f.endswith(".safetensors") else _read_torch
      if not (directory / f).is_file():
        raise CheckpointError(f"{path}: names shard {f} which does not exist")
      for k, v in reader(directory / f).items():
        tensors[k] = v
    return tensors, str(path)
  raise CheckpointError(f"{directory}: no weights found (looked for {', '.join(WEIGHT_FILES)})")


def normalise_names(
  tensors: Mapping[str, np.ndarray], source: str
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """Put the encoder under "bert." (BertModel saves it bare) and rename gamma/beta.

  Returns the renamed tensors and, for messages, each new name's name in the file.
  """
  bare = any(k.startswith(("embeddings.", "encoder.", "pooler.")) for k in tensors)
  prefixed = any(k.startswith("bert.") for k in tensors)
  if bare and prefixed:
    raise CheckpointError(
      f"{source}: tensors both with and without "
      "the 'bert.' prefix; cannot tell which encoder to use"
    )
  out, described = {}, {}
  for k, v in tensors.items():
    new = k
    if bare and k.startswith(("embeddings.", "encoder.", "pooler.")):
      new = "bert." + k
    if new.endswith(".gamma"):
      new = new[: -len(".gamma")] + ".weight"
    elif new.endswith(".beta"):
      new = new[: -len(".beta")] + ".bias"
    out[new] = v
    described[new] = k
  for b in BUFFERS:
    out.pop("bert." + b, None)
  return out, described


def infer_task(tensors: Mapping[str, Any], hf_config: Mapping[str, Any], source: str) -> str:
  """Which head a (normalised) Hugging Face checkpoint carries."""
  archs = hf_config.get("architectures") or []
  if any(k.startswith("qa_outputs.") for k in tensors):
    return "question_answering"
  if any(k.startswith("classifier.") for k in tensors):
    for a in archs:
      if IMPORT_ARCHITECTURES.get(a) in CLASSIFIER_TASKS:
        return IMPORT_ARCHITECTURES[a]
    raise CheckpointError(
      f"{source}: the weights have a 'classifier' but 'architectures' ({archs}) does not say "
      "whether it is BertForSequenceClassification, BertForTokenClassification or "
      "BertForMultipleChoice; pass task=..."
    )
  if any(k.startswith("cls.") for k in tensors):
    return "pretraining"
  return "encoder"


# --- writing a directory -------------------------------------------------------------------


def hf_config_dict(
  config: BertConfig,
  task: str,
  num_labels: int,
  labels: Sequence[str] | None,
  pad_id: int = 0,
  next_sentence: bool = True,
) -> dict[str, Any]:
  """config.json: ``config``'s fields (``is_decoder`` among them when true) and the class."""
  d = {
    "architectures": [architecture(config, task, next_sentence)],
    "model_type": "bert",
    **config.to_dict(),
    "position_embedding_type": "absolute",
    "pad_token_id": pad_id,
    "torch_dtype": "float32",
    "use_cache": True,
  }
  if task in LABELLED_TASKS:
    names = list(labels) if labels else [f"LABEL_{i}" for i in range(num_labels)]
    if len(names) != num_labels:
      raise CheckpointError(f"{len(names)} labels given for num_labels={num_labels}")
    d["id2label"] = {str(i): n for i, n in enumerate(names)}
    d["label2id"] = {n: i for i, n in enumerate(names)}
    if task == "sequence_classification":
      d["problem_type"] = "regression" if num_labels == 1 else "single_label_classification"
  return d


def save_hf(
  directory,
  params: Mapping[str, Any],
  config: BertConfig,
  tokenizer=None,
  head: str = "pretraining",
  num_labels: int | None = None,
  labels: Sequence[str] | None = None,
  overwrite: bool = False,
) -> pathlib.Path:
  """Write a Hugging Face directory: model.safetensors, config.json and the tokenizer files.

  ``head`` is one of ``heads.TASKS`` ("encoder" writes a BertModel). Pre-training params
  without an ``nsp`` head (``config.objective`` mlm or ltr) write the LM head alone: a
  BertForMaskedLM, or a BertLMHeadModel (``is_decoder`` in config.json) for a left-to-right
  model (``config.is_decoder``); with one, a BertForPreTraining. ``num_labels`` defaults to
  ``len(labels)`` or the classifier's width. The directory loads with
  ``transformers.AutoModel*.from_pretrained(directory)`` / ``BertFor*.from_pretrained``.
  It is written whole or not at all (``bert_jax.checkpoint.replace_dir``): a non-empty
  ``directory`` is refused unless ``overwrite``, and then replaced as a whole (no file of an
  earlier export survives). Call it on one process (e.g. ``jax.process_index() == 0``) with
  params it can read in full (numpy, or arrays gathered with
  ``jax.experimental.multihost_utils.process_allgather``).
  """
  check_task(head)
  try:
    ensure_replaceable(directory, overwrite)
  except FileExistsError as e:
    raise CheckpointError(f"refusing to overwrite: {e}") from e
  params = nn.meta.unbox(dict(params))
  if num_labels is None:
    if labels:
      num_labels = len(labels)
    elif head in LABELLED_TASKS:
      if "classifier" not in params:
        raise CheckpointError(f"params have no 'classifier' for head {head!r}")
      num_labels = int(np.shape(params["classifier"]["kernel"])[-1])
    else:
      num_labels = 2
  next_sentence = head != "pretraining" or "nsp" in params
  tensors = params_to_tensors(params, config, head, num_labels, next_sentence)
  pad_id = getattr(tokenizer, "pad_id", 0) if tokenizer is not None else 0
  hf_config = hf_config_dict(config, head, num_labels, labels, pad_id, next_sentence)
  with replace_dir(directory, overwrite) as tmp:
    # Serialised in memory and written with open(): the file gets the mode the umask gives
    # (safetensors' save_file creates its files 0600).
    data = safetensors.numpy.save(tensors, metadata={"format": "pt"})
    with open(os.path.join(tmp, "model.safetensors"), "wb") as f:
      f.write(data)
    write_json(os.path.join(tmp, "config.json"), hf_config)
    if tokenizer is not None:
      tokenizer.save(tmp)
      tok_config_path = os.path.join(tmp, "tokenizer_config.json")
      tok_config = read_json(tok_config_path) if os.path.isfile(tok_config_path) else {}
      if os.path.isfile(os.path.join(tmp, "vocab.txt")):
        tok_config.setdefault("tokenizer_class", "BertTokenizer")
      tok_config.setdefault("do_lower_case", bool(getattr(tokenizer, "do_lower_case", True)))
      tok_config.setdefault("model_max_length", config.max_position_embeddings)
      write_json(tok_config_path, tok_config)
  return pathlib.Path(directory)


def iter_labels(hf_config: Mapping[str, Any]) -> Iterator[str]:
  id2label = hf_config.get("id2label") or {}
  for i in sorted(id2label, key=int):
    yield id2label[i]
