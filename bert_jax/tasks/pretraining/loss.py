"""Pre-training objectives: BERT's masked LM + next sentence (section 3.1) and the paper's
Table 5 ablations.

``objective`` (``configs/pretrain.py``'s ``config.objective``):

* ``"mlm_nsp"`` (BERT): as google-research/bert's ``run_pretraining.py``, the MLM loss is the
  cross-entropy at the masked positions, weighted by ``masked_lm_weights`` (0 for padding
  predictions) and divided by the weight sum; the NSP loss is the mean cross-entropy of the
  2-way classifier; the total is their sum. Logits are computed only at
  ``masked_lm_positions`` (BxPxV, not BxLxV).
* ``"mlm"`` ("No NSP"): the MLM loss alone; the model has no NSP head.
* ``"ltr"`` ("LTR & No NSP"): a left-to-right LM on the original (unmasked) tokens: causal
  attention (``BertConfig.is_decoder``), and at every position i with a real token at i + 1 the
  cross-entropy of predicting it, averaged over those positions; the output layer is the MLM
  head's (tied to the embeddings), so parameters and checkpoints have the same layout.

Packed rows (``bert_jax.data.packing``: ``sequence_ids`` in the batch) give the same losses as
the unpacked rows of the same sequences: the model sees ``position_ids``, ``sequence_ids`` (each
sequence attends only to itself; causally within itself for ltr) and ``cls_positions`` (the NSP
head at each sequence's [CLS], BxSx2); MLM is the same weighted mean over the masked tokens; NSP
is the mean over the real sequences (``sequence_weights``); ltr predicts token i + 1 only
where it is of the same sequence as token i.

Eval sums and summaries report loss, accuracy and perplexity (exp of the mean loss, the paper's
Table 6 "LM (ppl)") of the LM part under ``mlm_*`` for the masked objectives and ``lm_*`` for
``ltr``; NSP figures only for ``mlm_nsp``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from bert_jax.data.packing import SEQUENCE_WEIGHTS
from bert_jax.model import BertForPreTraining

OBJECTIVES = ("mlm_nsp", "mlm", "ltr")


def check_objective(objective: str) -> str:
  if objective not in OBJECTIVES:
    raise ValueError(
      f"config.objective={objective!r} is not one of {OBJECTIVES} (mlm_nsp: BERT's masked LM + "
      "next sentence; mlm: no NSP; ltr: left-to-right LM, no NSP)"
    )
  return objective


def _forward(model: BertForPreTraining, params, batch, rng, deterministic: bool, objective: str):
  rngs = None if deterministic else {"dropout": rng}
  positions = None if objective == "ltr" else batch["masked_lm_positions"]
  packed = {}
  if "sequence_ids" in batch:
    packed = dict(position_ids=batch["position_ids"], sequence_ids=batch["sequence_ids"])
    if objective == "mlm_nsp":
      packed["cls_positions"] = batch["cls_positions"]
  return model.apply(
    {"params": params},
    batch["input_ids"],
    batch["input_mask"],
    batch["segment_ids"],
    positions,
    deterministic=deterministic,
    rngs=rngs,
    **packed,
  )


def argmax_is(logits_BxNxV, ids_BxN) -> jax.Array:
  """``jnp.argmax(logits, -1) == ids`` (argmax: the first index of the maximum), cheaper.

  The label's logit is the maximum and no earlier logit equals it. The max is the one the
  cross-entropy's log-softmax takes (XLA computes it once); argmax's (value, index) reduction
  is a pass of its own, slow on XLA:CPU: the loss and gradient over BERT's 30,522-way logits at
  640 predictions took 68-109 ms with it, 36-40 ms this way, 27-41 ms with no accuracy at all.
  """
  max_BxNx1 = jnp.max(logits_BxNxV, -1, keepdims=True)
  label_BxNx1 = jnp.take_along_axis(logits_BxNxV, ids_BxN[..., None], -1)
  index_V = jnp.arange(logits_BxNxV.shape[-1], dtype=ids_BxN.dtype)
  earlier_BxN = jnp.any((logits_BxNxV == max_BxNx1) & (index_V < ids_BxN[..., None]), -1)
  return (label_BxNx1[..., 0] == max_BxNx1[..., 0]) & ~earlier_BxN


def xent_terms(logits_BxNxV, ids_BxN, w_BxN, prefix: str) -> dict[str, jax.Array]:
  """The weighted cross-entropy sum, correct-prediction count and weight sum of an LM head's
  logits (float32), as ``{prefix}_loss_sum``, ``{prefix}_correct`` and ``{prefix}_weight``."""
  logits_BxNxV = logits_BxNxV.astype(jnp.float32)
  w_BxN = w_BxN.astype(jnp.float32)
  xent_BxN = optax.softmax_cross_entropy_with_integer_labels(logits_BxNxV, ids_BxN)
  correct_BxN = argmax_is(logits_BxNxV, ids_BxN).astype(jnp.float32)
  return {
    f"{prefix}_loss_sum": jnp.sum(xent_BxN * w_BxN),
    f"{prefix}_correct": jnp.sum(correct_BxN * w_BxN),
    f"{prefix}_weight": jnp.sum(w_BxN),
  }


def next_token_targets(batch) -> tuple[jax.Array, jax.Array]:
  """(targets BxL, weights BxL): row i's target is token i + 1, weighted 1 where that token is
  real (input_mask) and, in packed rows, of the same sequence as token i; the last position
  predicts nothing."""
  ids_BxL = batch["input_ids"]
  targets_BxL = jnp.concatenate([ids_BxL[:, 1:], jnp.zeros_like(ids_BxL[:, :1])], axis=1)
  mask_BxL = batch["input_mask"]
  w_BxL = jnp.concatenate([mask_BxL[:, 1:], jnp.zeros_like(mask_BxL[:, :1])], axis=1)
  if "sequence_ids" in batch:
    seq_BxL = batch["sequence_ids"]
    next_BxL = jnp.concatenate([seq_BxL[:, 1:], jnp.zeros_like(seq_BxL[:, :1])], axis=1)
    w_BxL = w_BxL * ((next_BxL == seq_BxL) & (seq_BxL > 0))
  return targets_BxL, w_BxL.astype(jnp.float32)


def _per_example_terms(out, batch, objective: str):
  if objective == "ltr":
    targets_BxL, w_BxL = next_token_targets(batch)
    return xent_terms(out["mlm_logits"], targets_BxL, w_BxL, "lm")
  terms = xent_terms(out["mlm_logits"], batch["masked_lm_ids"], batch["masked_lm_weights"], "mlm")
  if objective == "mlm_nsp" and SEQUENCE_WEIGHTS in batch:  # packed: BxS sequences
    nsp_logits_BxSx2 = out["nsp_logits"].astype(jnp.float32)
    labels_BxS = batch["next_sentence_labels"]
    w_BxS = batch[SEQUENCE_WEIGHTS].astype(jnp.float32)
    nsp_xent_BxS = optax.softmax_cross_entropy_with_integer_labels(nsp_logits_BxSx2, labels_BxS)
    nsp_correct_BxS = (jnp.argmax(nsp_logits_BxSx2, -1) == labels_BxS).astype(jnp.float32)
    terms.update(
      nsp_loss_sum=jnp.sum(nsp_xent_BxS * w_BxS),
      nsp_correct=jnp.sum(nsp_correct_BxS * w_BxS),
      nsp_count=jnp.sum(w_BxS),
    )
  elif objective == "mlm_nsp":
    nsp_logits_Bx2 = out["nsp_logits"].astype(jnp.float32)
    labels_B = batch["next_sentence_labels"].reshape(-1)
    # Held-out batches padded to full size mark their padding rows with example_weights 0.
    ex_w_B = batch.get("example_weights", jnp.ones(labels_B.shape, jnp.float32))
    nsp_xent_B = optax.softmax_cross_entropy_with_integer_labels(nsp_logits_Bx2, labels_B)
    nsp_correct_B = (jnp.argmax(nsp_logits_Bx2, -1) == labels_B).astype(jnp.float32)
    terms.update(
      nsp_loss_sum=jnp.sum(nsp_xent_B * ex_w_B),
      nsp_correct=jnp.sum(nsp_correct_B * ex_w_B),
      nsp_count=jnp.sum(ex_w_B),
    )
  return terms


def make_pretraining_loss(model: BertForPreTraining, objective: str = "mlm_nsp"):
  """``loss_fn(params, batch, rng, deterministic) -> (loss, metrics)`` for ``objective``."""
  check_objective(objective)
  lm = "lm" if objective == "ltr" else "mlm"

  def loss_fn(params, batch: Mapping[str, jax.Array], rng, deterministic: bool):
    out = _forward(model, params, batch, rng, deterministic, objective)
    t = _per_example_terms(out, batch, objective)
    lm_loss = t[f"{lm}_loss_sum"] / (t[f"{lm}_weight"] + 1e-5)
    metrics = {
      f"{lm}_loss": lm_loss,
      f"{lm}_accuracy": t[f"{lm}_correct"] / (t[f"{lm}_weight"] + 1e-5),
    }
    if objective != "mlm_nsp":
      return lm_loss, metrics
    nsp_loss = t["nsp_loss_sum"] / jnp.maximum(t["nsp_count"], 1.0)
    metrics.update(
      nsp_loss=nsp_loss, nsp_accuracy=t["nsp_correct"] / jnp.maximum(t["nsp_count"], 1.0)
    )
    return lm_loss + nsp_loss, metrics

  return loss_fn


def make_pretraining_eval(model: BertForPreTraining, objective: str = "mlm_nsp"):
  """``eval_fn(params, batch) -> sums`` to add up over held-out batches (no dropout)."""
  check_objective(objective)

  def eval_fn(params, batch):
    out = _forward(model, params, batch, None, True, objective)
    return _per_example_terms(out, batch, objective)

  return eval_fn


def summarize_eval(sums: Mapping[str, Any]) -> dict[str, float]:
  """LM accuracy / loss / perplexity (and NSP accuracy / loss) from summed eval terms."""
  out = {}
  for lm in ("mlm", "lm"):
    if f"{lm}_weight" in sums:
      w = max(float(sums[f"{lm}_weight"]), 1e-5)
      loss = float(sums[f"{lm}_loss_sum"]) / w
      out.update(
        {
          f"{lm}_accuracy": float(sums[f"{lm}_correct"]) / w,
          f"{lm}_loss": loss,
          f"{lm}_perplexity": float(jnp.exp(min(loss, 80.0))),
        }
      )
  if "nsp_count" in sums:
    n = max(float(sums["nsp_count"]), 1.0)
    out.update(
      nsp_accuracy=float(sums["nsp_correct"]) / n, nsp_loss=float(sums["nsp_loss_sum"]) / n
    )
  return out
