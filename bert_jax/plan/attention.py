"""Which attention kernel a compiled step runs, and the FLOPs its compiler does not count.

  kernel = kernel_for(config, topo)        # "reference" | "dot_product" | "splash"; ValueError
  flops = fused_attention_flops(dims, batch=256, seq_len=512, train=True, remat=False)

The kernel is ``config.attention_kernel`` resolved as a run on the topology's chips resolves it
(``bert_jax.model.run_settings.run_bert_config``, platform "tpu" or "gpu"), with the
model's attention dropout: ``config.attention_probs_dropout_prob`` where the run config has the
key, else the ``bert_config_file``'s value, else BertConfig's default (0.1, the paper's). A fused
kernel with dropout > 0 is the run's one-line error, before anything compiles.

A fused kernel that is a custom call (Pallas splash on TPUs, cuDNN's fused attention on GPUs: the
kernel table's ``custom_calls``, ``bert_jax.model.kernels.attention.ATTENTION_KERNELS``) is
opaque to XLA's cost analysis: the compiler reports almost no FLOPs for it, and an estimate from
its numbers alone would be too fast. Its FLOPs are then counted from the model here, per layer
and sequence as bert_jax/train/flops.py counts attention (the scores ``q k^T`` and the weighted
sum ``p v``: 2 x 2 x L x L x D forward, D = heads x head size), at every layer over whole rows
(splash takes every position as a query, also in the last layer), and the backward pass at
``FUSED_BACKWARD_FACTOR`` x the forward (the flash-attention backward recomputes the scores
before the gradients of both products); with remat the forward runs twice. The model FLOPs
behind MFU stay flops.py's.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jax

from bert_jax.model.config import BertConfig
from bert_jax.model.kernels.attention import ATTENTION_KERNELS
from bert_jax.model.run_settings import run_bert_config, run_lengths
from bert_jax.parallel.topology import Topology

FUSED_BACKWARD_FACTOR = 2.5  # the fused kernels' backward FLOPs over their forward's


def platform(topo: Topology) -> str:
  return "gpu" if topo.is_gpu else "tpu"


def attention_dropout(config) -> float:
  """The attention dropout of the model ``config`` runs (see the module docstring)."""
  if "attention_probs_dropout_prob" in config:
    return float(config.attention_probs_dropout_prob)
  default = BertConfig.__dataclass_fields__["attention_probs_dropout_prob"].default
  path = config.get("bert_config_file", "") if hasattr(config, "get") else ""
  if path:
    with open(path) as f:
      return float(json.load(f).get("attention_probs_dropout_prob", default))
  return float(default)


def sequence_lengths(config) -> list[int]:
  """The sequence lengths a run of ``config`` trains at (phase 2's too where it has one)."""
  return [length for length, _ in run_lengths(config)]


def kernel_for(config, topo: Topology) -> str:
  """The attention kernel a run of ``config`` on ``topo``'s chips uses: the run's own choice
  (``bert_jax.model.run_settings.run_bert_config``, at each phase's length, with the model's
  attention dropout, ``attention_dropout``); the run's one-line ValueError where it would refuse
  the combination."""
  base = BertConfig(attention_probs_dropout_prob=attention_dropout(config))
  return run_bert_config(base, config, platform=platform(topo)).attention_kernel


def fused_choices(config, topo: Topology) -> list[str]:
  """The kernels a plan tries: the resolved kernel; and, where ``config.attention_kernel`` is
  "auto" and resolves to a fused kernel (attention dropout 0), the reference path beside it
  (the fused kernel saves memory, but its backward pass recomputes the scores)."""
  kernel = kernel_for(config, topo)
  if config.get("attention_kernel", "reference") == "auto" and kernel != "reference":
    return [kernel, "reference"]
  return [kernel]


def attention_dims(abstract_params: Any) -> tuple[int, int, int]:
  """(layers, heads, head size) of the model whose abstract params these are: the self-attention
  query kernels (``.../attention/query/kernel``, D x heads x head size)."""
  shapes = [
    leaf.shape
    for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_params)
    if [getattr(k, "key", getattr(k, "name", None)) for k in path][-3:]
    == ["attention", "query", "kernel"]
  ]
  if not shapes:
    return 0, 0, 0
  return len(shapes), int(shapes[0][-2]), int(shapes[0][-1])


def fused_attention_flops(
  dims: tuple[int, int, int], *, batch: int, seq_len: int, train: bool, remat: bool = False
) -> float:
  """FLOPs of a fused kernel over one step of ``batch`` rows of ``seq_len`` (all chips): forward
  4 x B x H x L x L x K per layer; training adds the backward (``FUSED_BACKWARD_FACTOR`` x) and,
  with remat, the forward again."""
  layers, heads, head = dims
  forward = 4.0 * batch * heads * seq_len * seq_len * head * layers
  if not train:
    return forward
  return forward * (1.0 + FUSED_BACKWARD_FACTOR + (1.0 if remat else 0.0))


def fused_calls(hlo_text: str, kernel: str, on: str) -> int:
  """How many custom calls of ``kernel`` (on platform ``on``) the compiled module makes; 0 for
  a kernel XLA computes itself (the reference path, dot_product on a TPU)."""
  pattern = ATTENTION_KERNELS[kernel].custom_calls.get(on) if kernel in ATTENTION_KERNELS else None
  return len(re.findall(pattern, hlo_text)) if pattern else 0


def describe(kernel: str, flops_per_chip: float) -> str:
  """The report's line on the kernel."""
  if kernel == "reference":
    return "attention kernel: reference (XLA's einsum + softmax; counted by the compiler)"
  if not flops_per_chip:
    return f"attention kernel: {kernel} (compiled by XLA; counted by the compiler)"
  return (
    f"attention kernel: {kernel} (a custom call the compiler counts no FLOPs in: "
    f"{flops_per_chip / 1e12:,.2f} TFLOP per chip per train step added from the model, "
    f"backward {FUSED_BACKWARD_FACTOR:g}x forward)"
  )


def is_fused(kernel: str) -> bool:
  """Whether ``kernel`` is a fused kernel (the kernel table's ``fused``)."""
  return kernel in ATTENTION_KERNELS and ATTENTION_KERNELS[kernel].fused


__all__ = [
  "FUSED_BACKWARD_FACTOR",
  "attention_dims",
  "attention_dropout",
  "describe",
  "fused_attention_flops",
  "fused_calls",
  "fused_choices",
  "is_fused",
  "kernel_for",
  "sequence_lengths",
]
