"""Hugging Face BERT checkpoints <-> bert_jax params.

The one table of names in this package: every bert_jax parameter path beside the Hugging Face
(PyTorch) tensor name it corresponds to and how the array is laid out there. PyTorch ``Linear``
weights are ``[out, in]``; bert_jax ``DenseGeneral`` kernels are ``[in..., out...]`` (the
attention projections split the hidden axis into heads x head_dim). TensorFlow checkpoints
(``tf.py``) are first renamed onto the Hugging Face names, so both imports share one validation.

Reading a directory (``read_hf_directory``), turning tensors into params (``tensors_to_params``)
and writing a directory that ``transformers`` loads with ``from_pretrained`` (``save_hf``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

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
# Hugging Face classes whose encoder has no pooler (add_pooling_layer=False).
NO_POOLER = ("token_classification", "question_answering")
# Architectures found in the wild that import onto one of our tasks.
IMPORT_ARCHITECTURES = {
  **{v: k for k, v in ARCHITECTURES.items()},
  "BertForMaskedLM": "pretraining",
  "BertForNextSentencePrediction": "pretraining",
  "BertLMHeadModel": "pretraining",
}
# Parameter groups that a checkpoint may lack (named in Pretrained.absent).
OPTIONAL_GROUPS = ("bert/pooler", "mlm", "nsp")
# Buffers, not parameters, that Hugging Face checkpoints may carry.
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")

# Layouts: "same" (identical arrays), "vector" (a bias flattened in HF) or an int n: a kernel
# whose first n bert_jax axes are the inputs, stored [out, in] by PyTorch.
Layout = Any


class CheckpointError(ValueError):
  """A checkpoint that cannot be imported or exported; the message names file and tensor."""


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
  config: BertConfig, task: str, num_labels: int = 2, prefix: str = "bert."
) -> list[Entry]:
  """Every parameter of ``task``'s model with its Hugging Face name (encoder under ``prefix``)."""
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
    out += _linear(("nsp",), "cls.seq_relationship", 1, "nsp")
  elif task in ("sequence_classification", "token_classification", "multiple_choice"):
    out += _linear(("classifier",), "classifier", 1, "classifier")
  elif task == "question_answering":
    out += _linear(("qa_outputs",), "qa_outputs", 1, "qa_outputs")
  elif task != "encoder":
    raise CheckpointError(f"unknown head task {task!r}; choose one of {TASKS}")
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


def param_shapes(config: BertConfig, task: str, num_labels: int) -> dict[tuple[str, ...], tuple]:
  """The shapes of the unboxed ``model.init(...)["params"]`` of ``task``'s model (no compute)."""
  import flax.linen as nn  # noqa: PLC0415
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  from flax import traverse_util  # noqa: PLC0415

  from bert_jax import model as models  # noqa: PLC0415

  ids = jnp.zeros((1, 2), jnp.int32)
  kwargs = {}
  if task in ("encoder", "pretraining"):
    module = models.BertForPreTraining(config)
    kwargs["masked_lm_positions"] = jnp.zeros((1, 1), jnp.int32)
  elif task == "sequence_classification":
    module = models.BertForSequenceClassification(config, num_labels)
  elif task == "token_classification":
    module = models.BertForTokenClassification(config, num_labels)
  elif task == "question_answering":
    module = models.BertForQuestionAnswering(config)
  elif task == "multiple_choice":
    module = models.BertForMultipleChoice(config)
    ids = jnp.zeros((1, 1, 2), jnp.int32)
  else:
    raise CheckpointError(f"unknown head task {task!r}; choose one of {TASKS}")
  variables = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), ids, **kwargs))
  flat = traverse_util.flatten_dict(nn.meta.unbox(variables["params"]))
  if task == "encoder":
    flat = {k: v for k, v in flat.items() if k[0] == "bert"}
  return {k: tuple(v.shape) for k, v in flat.items()}


def _listing(names: Sequence[str], limit: int = 8) -> str:
  names = sorted(names)
  more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


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
      + _listing([describe(n) for n in unknown])
    )
  missing = [e.name for e in wanted if e.name not in tensors]
  if missing:
    raise CheckpointError(
      f"{source}: missing tensor(s) for a {ARCHITECTURES[task]}: "
      + _listing([describe(n) for n in missing])
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
  params: Mapping[str, Any], config: BertConfig, task: str, num_labels: int
) -> dict[str, np.ndarray]:
  """Nested params -> the state dict of the Hugging Face class for ``task``."""
  from flax import traverse_util  # noqa: PLC0415

  flat = traverse_util.flatten_dict(dict(params))
  prefix = "" if task == "encoder" else "bert."
  wanted = entries(config, task, num_labels, prefix)
  if task in NO_POOLER:
    wanted = [e for e in wanted if e.group != "bert/pooler"]
  shapes = param_shapes(config, task, num_labels)
  missing = ["/".join(e.path) for e in wanted if e.path not in flat]
  if missing:
    raise CheckpointError(f"params lack what a {ARCHITECTURES[task]} needs: {_listing(missing)}")
  known = {e.path for e in entries(config, task, num_labels)}
  # "encoder" exports the encoder of any model: its head is left out on purpose.
  extra = [
    "/".join(k) for k in flat if k not in known and not (task == "encoder" and k[0] != "bert")
  ]
  if extra:
    raise CheckpointError(
      f"params have entries a {ARCHITECTURES[task]} has no place for: "
      f"{_listing(extra)}; pass the right head (and num_labels)"
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
  from safetensors import SafetensorError  # noqa: PLC0415
  from safetensors.numpy import load_file  # noqa: PLC0415

  try:
    return load_file(str(path))
  except (SafetensorError, OSError, ValueError, TypeError) as e:
    raise CheckpointError(
      f"{path}: not a readable safetensors file (truncated or corrupt?): {e}"
    ) from e


def _read_torch(path: pathlib.Path) -> dict[str, np.ndarray]:
  try:
    import torch  # noqa: PLC0415
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
        weight_map = json.loads(path.read_text())["weight_map"]
      except (ValueError, KeyError) as e:
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
  config: BertConfig, task: str, num_labels: int, labels: Sequence[str] | None, pad_id: int = 0
) -> dict[str, Any]:
  d = {
    "architectures": [ARCHITECTURES[task]],
    "model_type": "bert",
    **config.to_dict(),
    "position_embedding_type": "absolute",
    "pad_token_id": pad_id,
    "torch_dtype": "float32",
    "use_cache": True,
  }
  if task in ("sequence_classification", "token_classification"):
    names = list(labels) if labels else [f"LABEL_{i}" for i in range(num_labels)]
    if len(names) != num_labels:
      raise CheckpointError(f"{len(names)} labels given for num_labels={num_labels}")
    d["id2label"] = {str(i): n for i, n in enumerate(names)}
    d["label2id"] = {n: i for i, n in enumerate(names)}
    if task == "sequence_classification":
      d["problem_type"] = "regression" if num_labels == 1 else "single_label_classification"
  return d


def _atomic_write(path: pathlib.Path, write: Callable[[str], None]) -> None:
  tmp = str(path.parent / f".{path.name}.{os.getpid()}.tmp")
  try:
    write(tmp)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


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

  ``head`` is one of TASKS ("encoder" writes a BertModel). ``num_labels`` defaults to
  ``len(labels)`` or the classifier's width. The directory loads with
  ``transformers.AutoModel*.from_pretrained(directory)`` / ``BertFor*.from_pretrained``.
  Existing files are never replaced unless ``overwrite``; each file is written atomically.
  Call it on one process (e.g. ``jax.process_index() == 0``) with params it can read in full
  (numpy, or arrays gathered with ``jax.experimental.multihost_utils.process_allgather``).
  """
  import flax.linen as nn  # noqa: PLC0415
  from safetensors.numpy import save_file  # noqa: PLC0415

  if head not in TASKS:
    raise CheckpointError(f"unknown head {head!r}; choose one of {TASKS}")
  params = nn.meta.unbox(dict(params))
  if num_labels is None:
    if labels:
      num_labels = len(labels)
    elif head in ("sequence_classification", "token_classification"):
      if "classifier" not in params:
        raise CheckpointError(f"params have no 'classifier' for head {head!r}")
      num_labels = int(np.shape(params["classifier"]["kernel"])[-1])
    else:
      num_labels = 2
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  tensors = params_to_tensors(params, config, head, num_labels)
  pad_id = getattr(tokenizer, "pad_id", 0) if tokenizer is not None else 0
  hf_config = hf_config_dict(config, head, num_labels, labels, pad_id)
  targets = [directory / "model.safetensors", directory / "config.json"]
  if not overwrite:
    clash = [str(p) for p in targets + [directory / "vocab.txt"] if p.exists()]
    if clash:
      raise CheckpointError(f"refusing to overwrite {', '.join(clash)} (pass overwrite=True)")
  _atomic_write(targets[0], lambda p: save_file(tensors, p, metadata={"format": "pt"}))
  _atomic_write(
    targets[1],
    lambda p: pathlib.Path(p).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n"),
  )
  if tokenizer is not None:
    tokenizer.save(str(directory))
    tok_config_path = directory / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text()) if tok_config_path.is_file() else {}
    if (directory / "vocab.txt").is_file():
      tok_config.setdefault("tokenizer_class", "BertTokenizer")
    tok_config.setdefault("do_lower_case", bool(getattr(tokenizer, "do_lower_case", True)))
    tok_config.setdefault("model_max_length", config.max_position_embeddings)
    tok_config_path.write_text(json.dumps(tok_config, indent=2, sort_keys=True) + "\n")
  return directory


def iter_labels(hf_config: Mapping[str, Any]) -> Iterator[str]:
  id2label = hf_config.get("id2label") or {}
  for i in sorted(id2label, key=int):
    yield id2label[i]
