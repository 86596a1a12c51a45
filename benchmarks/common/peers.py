"""Hugging Face Flax BERT pre-training steps, the peers the speed and memory benchmarks run.

Two variants of the same model (``FlaxBertForPreTraining``), both trained with bert_jax's
optimizer (AdamW, clip 1.0, weight decay 0.01 without LayerNorm/bias) on the same MLM + NSP loss:

* ``hf_flax``: as shipped, MLM logits at every position and a loss that masks all but the
  predicted rows (-100-style labels);
* ``hf_flax_masked``: the well-known change a user would make (google-research/bert does it):
  the encoder's output gathered at the masked positions first, so the MLM head (transform +
  30k-vocab decoder) runs on B x P rows instead of B x L. Same parameters, same module code: the
  gather is done in a method applied to HF's own module (``module.bert`` then ``module.cls``).

Neither is bert_jax code; the benchmarks only call them side by side with bert_jax's step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

VARIANTS = ("hf_flax", "hf_flax_masked")  # the Flax peers; torch_step is the PyTorch one


def _hf_config(bert, **extra):
  """transformers' BertConfig with ``bert``'s (a bert_jax BertConfig) architecture and dropout."""
  from transformers import BertConfig as HFConfig  # optional (not a bert_jax dependency), heavy

  extra.setdefault("hidden_dropout_prob", bert.hidden_dropout_prob)
  extra.setdefault("attention_probs_dropout_prob", bert.attention_probs_dropout_prob)
  return HFConfig(
    vocab_size=bert.vocab_size,
    hidden_size=bert.hidden_size,
    num_hidden_layers=bert.num_hidden_layers,
    num_attention_heads=bert.num_attention_heads,
    intermediate_size=bert.intermediate_size,
    hidden_act="gelu",
    max_position_embeddings=bert.max_position_embeddings,
    **extra,
  )


def hf_model(bert, dtype=jnp.float32, do_init: bool = True):
  """``FlaxBertForPreTraining`` with ``bert``'s (a bert_jax BertConfig) architecture."""
  from transformers import FlaxBertForPreTraining  # optional (not a bert_jax dependency), heavy

  return FlaxBertForPreTraining(_hf_config(bert), seed=0, dtype=dtype, _do_init=do_init)


def _masked_forward(module, input_ids, attention_mask, token_type_ids, positions_BxP, train):
  """HF's own submodules, with the MLM head only at ``positions_BxP``."""
  length = input_ids.shape[-1]
  position_ids = jnp.broadcast_to(jnp.arange(length), input_ids.shape)
  hidden_BxLxD, pooled_BxD = module.bert(
    input_ids,
    attention_mask,
    token_type_ids,
    position_ids,
    None,
    deterministic=not train,
    return_dict=False,
  )[:2]
  shared = module.bert.variables["params"]["embeddings"]["word_embeddings"]["embedding"]
  h_BxPxD = jnp.take_along_axis(hidden_BxLxD, positions_BxP[..., None], axis=1)
  return module.cls(h_BxPxD, pooled_BxD, shared_embedding=shared)


def _nsp(logits_Bx2, labels_B):
  return optax.softmax_cross_entropy_with_integer_labels(
    logits_Bx2.astype(jnp.float32), labels_B
  ).mean()


def hf_loss_fn(model, variant: str):
  """``loss(params, batch, rng)`` for a bert_jax pre-training batch (masked_lm_positions etc.)."""
  if variant not in VARIANTS:
    raise ValueError(f"unknown HF variant {variant!r}; choose one of {VARIANTS}")

  def shipped(params, batch, rng):
    out = model(
      batch["input_ids"],
      attention_mask=batch["input_mask"],
      token_type_ids=batch["segment_ids"],
      params=params,
      dropout_rng=rng,
      train=True,
    )
    logits_BxLxV = out.prediction_logits.astype(jnp.float32)
    b = batch["input_ids"].shape[0]
    rows = jnp.arange(b)[:, None]
    pos = batch["masked_lm_positions"]
    w_BxL = (
      jnp.zeros(batch["input_ids"].shape, jnp.float32).at[rows, pos].add(batch["masked_lm_weights"])
    )
    labels_BxL = (
      jnp.zeros(batch["input_ids"].shape, jnp.int32).at[rows, pos].set(batch["masked_lm_ids"])
    )
    xent = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, labels_BxL)
    mlm = jnp.sum(xent * w_BxL) / (jnp.sum(w_BxL) + 1e-5)
    return mlm + _nsp(out.seq_relationship_logits, batch["next_sentence_labels"])

  def masked(params, batch, rng):
    logits_BxPxV, nsp_Bx2 = model.module.apply(
      {"params": params},
      batch["input_ids"],
      batch["input_mask"],
      batch["segment_ids"],
      batch["masked_lm_positions"].astype(jnp.int32),
      True,
      method=_masked_forward,
      rngs={"dropout": rng},
    )
    w_BxP = batch["masked_lm_weights"].astype(jnp.float32)
    xent = optax.softmax_cross_entropy_with_integer_labels(
      logits_BxPxV.astype(jnp.float32), batch["masked_lm_ids"]
    )
    mlm = jnp.sum(xent * w_BxP) / (jnp.sum(w_BxP) + 1e-5)
    return mlm + _nsp(nsp_Bx2, batch["next_sentence_labels"])

  return shipped if variant == "hf_flax" else masked


def hf_train_step(model, variant: str, tx):
  """``(params, opt_state, batch, rng) -> (params, opt_state, loss)``, not jitted."""
  loss_fn = hf_loss_fn(model, variant)

  def train_step(params, opt_state, batch, rng):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return train_step


def torch_step(
  bert, seed: int = 0, dtype: str = "float32", device: str = "cpu", compiled: bool = False
):
  """PyTorch (transformers' ``BertForPreTraining``, SDPA attention, eager, float32) with the MLM
  head at the masked positions, AdamW (lr 1e-4, wd 0.01 without LayerNorm/bias, eps 1e-6) and
  gradient clipping at 1.0 as bert_jax: ``run(batch of numpy arrays) -> loss``.

  ``dtype="bfloat16"``: mixed precision as PyTorch users run it on a CPU, the forward pass under
  ``torch.autocast("cpu", torch.bfloat16)`` (matmuls in bfloat16, float32 weights and optimizer).
  ``device="cuda"``: the same on an NVIDIA GPU (autocast on "cuda"; SDPA then picks its fused
  attention kernels); ``run`` returns the loss as a tensor on that device, not yet synchronised.
  ``compiled``: the forward pass and loss under ``torch.compile`` (TorchInductor's default mode;
  the backward graph is compiled with it), as a user would try for speed; the first calls
  compile (tens of seconds on a CPU; a C++ compiler is needed there).
  """
  import torch  # optional (not a bert_jax dependency), heavy
  from transformers import BertForPreTraining  # optional, heavy

  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"unknown dtype {dtype!r}; choose float32 or bfloat16")
  torch.manual_seed(seed)
  cfg = _hf_config(bert, attn_implementation="sdpa")
  model = BertForPreTraining(cfg).to(device).train()
  no_decay = [p for n, p in model.named_parameters() if "LayerNorm" in n or n.endswith("bias")]
  decay = [p for n, p in model.named_parameters() if not ("LayerNorm" in n or n.endswith("bias"))]
  opt = torch.optim.AdamW(
    [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
    lr=1e-4,
    eps=1e-6,
  )
  xent = torch.nn.CrossEntropyLoss(reduction="none")

  def loss_of(t):
    pos_BxP = t["masked_lm_positions"].long()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
      out = model.bert(
        t["input_ids"].long(),
        attention_mask=t["input_mask"],
        token_type_ids=t["segment_ids"].long(),
      )
      seq_BxLxD, pooled_BxD = out[0], out[1]
      h_BxPxD = seq_BxLxD.gather(1, pos_BxP[..., None].expand(-1, -1, seq_BxLxD.shape[-1]))
      logits_BxPxV, nsp_Bx2 = model.cls(h_BxPxD, pooled_BxD)
    logits_BxPxV, nsp_Bx2 = logits_BxPxV.float(), nsp_Bx2.float()
    w_BxP = t["masked_lm_weights"]
    per = xent(logits_BxPxV.flatten(0, 1), t["masked_lm_ids"].long().flatten())
    mlm = (per * w_BxP.flatten()).sum() / (w_BxP.sum() + 1e-5)
    return mlm + xent(nsp_Bx2, t["next_sentence_labels"].long()).mean()

  if compiled:
    loss_of = torch.compile(loss_of)

  def run(batch):
    loss = loss_of({k: torch.as_tensor(v, device=device) for k, v in batch.items()})
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.detach()

  return run
