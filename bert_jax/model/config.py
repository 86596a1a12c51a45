"""BERT model hyper-parameters: a small frozen dataclass plus named size presets.

Field names follow google-research/bert's ``bert_config.json`` (which Hugging Face's
``config.json`` shares), so a config file from either maps onto this class directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bert_jax.model.kernels.attention import check_kernel

# Size presets from the paper and google-research/bert's compact models (intermediate = 4H).
PRESETS: dict[str, tuple[int, int, int]] = {
  # name: (num_hidden_layers, hidden_size, num_attention_heads)
  "tiny": (2, 128, 2),
  "mini": (4, 256, 4),
  "small": (4, 512, 8),
  "medium": (8, 512, 8),
  "base": (12, 768, 12),
  "large": (24, 1024, 16),
  # The paper's Table 6 (model size ablation), named as google-research/bert names its models
  # (L layers, H hidden, A heads); L12_H768_A12 is base and L24_H1024_A16 is large.
  "L3_H768_A12": (3, 768, 12),
  "L6_H768_A3": (6, 768, 3),
  "L6_H768_A12": (6, 768, 12),
  "L12_H768_A12": (12, 768, 12),
  "L12_H1024_A16": (12, 1024, 16),
  "L24_H1024_A16": (24, 1024, 16),
}

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Architecture of a BERT encoder (what a checkpoint's weights depend on) and its numerics."""

  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"  # exact (erf) gelu, as in BERT
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-12
  # Left-to-right (causal) self-attention: position i attends to positions <= i only (the
  # paper's "LTR & No NSP" ablation, Table 5). Hugging Face's BertConfig has the same key.
  is_decoder: bool = False
  # Numerics, not architecture: compute dtype (params stay in param_dtype) and rematerialisation.
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: bool = False
  # How attention is computed (bert_jax.model.kernels.attention): "reference" (BERT's einsum,
  # softmax and attention dropout), "dot_product" or "splash" (fused, no attention dropout).
  attention_kernel: str = "reference"

  def __post_init__(self):
    check_kernel(self.attention_kernel, self.attention_probs_dropout_prob)
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
        f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
        f"{self.num_attention_heads}"
      )
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {ACTIVATIONS}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in DTYPES:
        raise ValueError(f"{name} {getattr(self, name)!r} is not one of {DTYPES}")
    for name in (
      "vocab_size",
      "hidden_size",
      "num_hidden_layers",
      "num_attention_heads",
      "intermediate_size",
      "max_position_embeddings",
      "type_vocab_size",
    ):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  def replace(self, **changes: Any) -> BertConfig:
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_preset(cls, name: str, **overrides: Any) -> BertConfig:
    """A preset by name ('tiny' ... 'large'); overrides set any other field."""
    if name not in PRESETS:
      raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    layers, hidden, heads = PRESETS[name]
    fields = dict(
      num_hidden_layers=layers,
      hidden_size=hidden,
      num_attention_heads=heads,
      intermediate_size=4 * hidden,
    )
    fields.update(overrides)
    return cls(**fields)

  @classmethod
  def from_dict(cls, d: Mapping[str, Any], source: str = "config") -> BertConfig:
    """From a bert_config.json / Hugging Face config.json dict; unknown keys are ignored.

    Raises ValueError naming ``source`` when a required size is missing or invalid.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in d.items() if k in names}
    if "layer_norm_epsilon" in d and "layer_norm_eps" not in d:
      kwargs["layer_norm_eps"] = d["layer_norm_epsilon"]
    if kwargs.get("hidden_act") == "gelu_python":
      kwargs["hidden_act"] = "gelu"
    missing = [
      k
      for k in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
      )
      if k not in kwargs
    ]
    if missing:
      raise ValueError(f"{source}: missing required key(s) {missing}")
    try:
      return cls(**kwargs)
    except (TypeError, ValueError) as e:
      raise ValueError(f"{source}: {e}") from e

  def to_dict(self) -> dict[str, Any]:
    """The architecture fields as in bert_config.json (numerics fields left out; ``is_decoder``
    only when True, so a bidirectional model's file is google-research/bert's)."""
    d = dataclasses.asdict(self)
    for k in ("dtype", "param_dtype", "remat", "attention_kernel"):
      d.pop(k)
    if not self.is_decoder:
      d.pop("is_decoder")
    return d
