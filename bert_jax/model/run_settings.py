"""The run's encoder: a base ``BertConfig`` with a run config's model settings and kernel.

  bert = run_bert_config(base, config, platform="tpu")                 # a training run's
  bert = run_bert_config(base, config, platform=p, keys=NUMERICS_KEYS)  # evaluating a workdir
  kernel = run_attention_kernel(config, platform="gpu", attention_dropout=0.0)

Every run (pre-training, fine-tuning, evaluation, the planner's compile for a topology) makes
its model here, so a run config means the same model wherever it is read. The base is the
architecture (a preset, a ``bert_config_file``, a checkpoint's or a workdir's model config);
the run config (any mapping with the run configs' key names) sets on top of it:

  dtype, remat                     numerics (the compute dtype; rematerialise each layer)
  hidden_dropout_prob,             the dropout rates (training runs; an evaluation keeps the
  attention_probs_dropout_prob     rates the model was trained with)
  attention_kernel                 resolved for ``platform`` at every sequence length the run
                                   trains at (``run_lengths``): ``auto`` takes the kernel the
                                   table picks; where lengths pick different kernels (``auto``
                                   on a TPU, a phase length splash cannot take) the other one

A key the run config lacks keeps the base's value. What only a task decides (a left-to-right
encoder: pre-training's objective, fine-tuning's ``causal_checkpoint``) comes in as
``is_decoder``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bert_jax.model.config import BertConfig
from bert_jax.model.kernels.attention import ATTENTION_KERNELS, resolve_attention_kernel

# The run-config keys a training run sets on its encoder, and those an evaluation sets.
TRAINING_KEYS = ("dtype", "remat", "hidden_dropout_prob", "attention_probs_dropout_prob")
NUMERICS_KEYS = ("dtype", "remat")
_CASTS = {
  "dtype": str,
  "remat": bool,
  "hidden_dropout_prob": float,
  "attention_probs_dropout_prob": float,
}


def run_lengths(config: Mapping[str, Any]) -> list[tuple[int, str]]:
  """(length, config key) of each sequence length a run of ``config`` trains at:
  ``max_seq_length``, and ``phase2.max_seq_length`` where the config has a phase 2 that runs
  (``phase2.fraction`` > 0)."""
  lengths = [(int(config["max_seq_length"]), "config.max_seq_length")]
  phase2 = config.get("phase2")
  if phase2 is not None and phase2.get("fraction", 0) > 0:
    lengths.append((int(phase2["max_seq_length"]), "config.phase2.max_seq_length"))
  return lengths


def run_attention_kernel(
  config: Mapping[str, Any],
  *,
  platform: str,
  attention_dropout: float,
  lengths: Sequence[tuple[int, str]] | None = None,
) -> str:
  """``config.attention_kernel`` (default "reference") resolved for ``platform`` at each of
  ``lengths`` (default ``run_lengths(config)``); where they resolve differently, a fused kernel
  that takes every length: the one place a run's kernel is decided. One-line ValueError naming
  the keys where the combination cannot run."""
  requested = str(config.get("attention_kernel", "reference"))
  kernels = {
    resolve_attention_kernel(
      requested,
      attention_dropout=attention_dropout,
      platform=platform,
      max_seq_length=length,
      length_key=key,
    )
    for length, key in (run_lengths(config) if lengths is None else lengths)
  }
  if len(kernels) > 1:  # "auto" with a length a kernel's block does not divide
    kernels = {k for k in kernels if ATTENTION_KERNELS[k].length_multiple == 1}
  return kernels.pop()


def run_bert_config(
  base: BertConfig,
  config: Mapping[str, Any],
  *,
  platform: str,
  is_decoder: bool | None = None,
  keys: Sequence[str] = TRAINING_KEYS,
) -> BertConfig:
  """``base`` with ``config``'s values of ``keys`` (those it has), ``is_decoder`` (None: the
  base's) and the attention kernel ``run_attention_kernel`` resolves with the resulting
  attention dropout."""
  changes = {k: _CASTS[k](config[k]) for k in keys if k in config}
  if is_decoder is not None:
    changes["is_decoder"] = bool(is_decoder)
  bert = base.replace(**changes)
  kernel = run_attention_kernel(
    config, platform=platform, attention_dropout=bert.attention_probs_dropout_prob
  )
  return bert.replace(attention_kernel=kernel)
