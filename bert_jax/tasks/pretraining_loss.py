"""BERT's pre-training objective: masked-LM loss + next-sentence loss (paper section 3.1).

As google-research/bert's ``run_pretraining.py``: the MLM loss is the cross-entropy at the
masked positions, weighted by ``masked_lm_weights`` (0 for padding predictions) and divided by
the weight sum; the NSP loss is the mean cross-entropy of the 2-way classifier; the total is
their sum. Logits are computed only at ``masked_lm_positions`` (BxPxV, not BxLxV).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from bert_jax.model import BertForPreTraining


def _forward(model: BertForPreTraining, params, batch, rng, deterministic: bool):
  rngs = None if deterministic else {"dropout": rng}
  return model.apply(
    {"params": params},
    batch["input_ids"],
    batch["input_mask"],
    batch["segment_ids"],
    batch["masked_lm_positions"],
    deterministic=deterministic,
    rngs=rngs,
  )


def _per_example_terms(out, batch):
  mlm_logits_BxPxV = out["mlm_logits"].astype(jnp.float32)
  nsp_logits_Bx2 = out["nsp_logits"].astype(jnp.float32)
  ids_BxP = batch["masked_lm_ids"]
  w_BxP = batch["masked_lm_weights"].astype(jnp.float32)
  mlm_xent_BxP = optax.softmax_cross_entropy_with_integer_labels(mlm_logits_BxPxV, ids_BxP)
  mlm_correct_BxP = (jnp.argmax(mlm_logits_BxPxV, -1) == ids_BxP).astype(jnp.float32)
  labels_B = batch["next_sentence_labels"].reshape(-1)
  # Held-out batches padded to full size mark their padding rows with example_weights 0.
  ex_w_B = batch.get("example_weights", jnp.ones(labels_B.shape, jnp.float32))
  nsp_xent_B = optax.softmax_cross_entropy_with_integer_labels(nsp_logits_Bx2, labels_B)
  nsp_correct_B = (jnp.argmax(nsp_logits_Bx2, -1) == labels_B).astype(jnp.float32)
  return dict(
    mlm_loss_sum=jnp.sum(mlm_xent_BxP * w_BxP),
    mlm_correct=jnp.sum(mlm_correct_BxP * w_BxP),
    mlm_weight=jnp.sum(w_BxP),
    nsp_loss_sum=jnp.sum(nsp_xent_B * ex_w_B),
    nsp_correct=jnp.sum(nsp_correct_B * ex_w_B),
    nsp_count=jnp.sum(ex_w_B),
  )


def make_pretraining_loss(model: BertForPreTraining):
  """``loss_fn(params, batch, rng, deterministic) -> (mlm_loss + nsp_loss, metrics)``."""

  def loss_fn(params, batch: Mapping[str, jax.Array], rng, deterministic: bool):
    t = _per_example_terms(_forward(model, params, batch, rng, deterministic), batch)
    mlm_loss = t["mlm_loss_sum"] / (t["mlm_weight"] + 1e-5)
    nsp_loss = t["nsp_loss_sum"] / jnp.maximum(t["nsp_count"], 1.0)
    metrics = dict(
      mlm_loss=mlm_loss,
      nsp_loss=nsp_loss,
      mlm_accuracy=t["mlm_correct"] / (t["mlm_weight"] + 1e-5),
      nsp_accuracy=t["nsp_correct"] / jnp.maximum(t["nsp_count"], 1.0),
    )
    return mlm_loss + nsp_loss, metrics

  return loss_fn


def make_pretraining_eval(model: BertForPreTraining):
  """``eval_fn(params, batch) -> sums`` to add up over held-out batches (no dropout)."""

  def eval_fn(params, batch):
    return _per_example_terms(_forward(model, params, batch, None, True), batch)

  return eval_fn


def summarize_eval(sums: Mapping[str, Any]) -> dict[str, float]:
  """MLM accuracy / loss / perplexity and NSP accuracy / loss from summed eval terms."""
  w = max(float(sums["mlm_weight"]), 1e-5)
  n = max(float(sums["nsp_count"]), 1.0)
  mlm_loss = float(sums["mlm_loss_sum"]) / w
  return dict(
    mlm_accuracy=float(sums["mlm_correct"]) / w,
    mlm_loss=mlm_loss,
    mlm_perplexity=float(jnp.exp(min(mlm_loss, 80.0))),
    nsp_accuracy=float(sums["nsp_correct"]) / n,
    nsp_loss=float(sums["nsp_loss_sum"]) / n,
  )
