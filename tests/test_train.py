"""Train step, optimizer and schedule against independent references: google-research/bert's
schedule formula and weight-decay exclusions, torch.optim.AdamW, a numpy MLM/NSP loss over the
model's full logits; gradient accumulation, remat and bf16 options."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
import torch
from float_tolerance import EPS32, assert_sum_close, encoder_terms, sum_bound

from bert_jax import parallel
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.tasks.pretraining.loss import (
  make_pretraining_eval,
  make_pretraining_loss,
  summarize_eval,
)
from bert_jax.tasks.pretraining.synthetic_input import SyntheticPretrainInput
from bert_jax.train import flops as flops_lib
from bert_jax.train import optimizers
from bert_jax.train.state import init_train_state
from bert_jax.train.train_step import jit_train_step, make_train_step
from configs import common

VOCAB, L, P = 300, 16, 4


def _google_bert_lr(step, init_lr, num_train_steps, num_warmup_steps):
  """optimization.create_optimizer of google-research/bert, in numpy."""
  decayed = init_lr * (1.0 - min(step, num_train_steps) / num_train_steps)
  if num_warmup_steps and step < num_warmup_steps:
    return init_lr * step / num_warmup_steps
  return decayed


def test_schedule_matches_google_bert():
  schedule = optimizers.warmup_linear_decay(1e-4, 10, 100)
  for step in [0, 1, 5, 9, 10, 11, 50, 99, 100, 120]:
    np.testing.assert_allclose(
      float(schedule(step)), _google_bert_lr(step, 1e-4, 100, 10), rtol=1e-6, atol=1e-12
    )
  constant = optimizers.warmup_linear_decay(1e-3, 4, 100, kind="constant")
  assert float(constant(2)) == pytest.approx(5e-4) and float(constant(90)) == pytest.approx(1e-3)
  with pytest.raises(ValueError, match="config.optimizer.schedule"):
    optimizers.warmup_linear_decay(1e-3, 4, 100, kind="cosine")


def test_linear_after_warmup_matches_hugging_face():
  import torch
  import transformers

  ours = optimizers.warmup_linear_decay(1e-4, 10, 100, kind="linear_after_warmup")
  opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)
  ref = transformers.get_linear_schedule_with_warmup(opt, 10, 100)
  for step in range(0, 121):
    np.testing.assert_allclose(
      float(ours(step)),
      1e-4 * ref.lr_lambdas[0](step),
      rtol=1e-6,
      atol=1e-12,
      err_msg=f"step {step}",
    )


def _model(**overrides):
  bert = BertConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=32,
    **overrides,
  )
  return BertForPreTraining(bert)


def _init(model):
  ids = jnp.zeros((1, L), jnp.int32)
  return nn.meta.unbox(
    model.init(jax.random.PRNGKey(0), ids, ids, ids, jnp.zeros((1, P), jnp.int32))
  )


def test_weight_decay_mask_matches_google_bert_exclusions():
  params = _init(_model())["params"]
  mask = optimizers.decay_mask(params)
  names = jax.tree_util.tree_flatten_with_path(mask)[0]
  assert len(names) > 20
  for path, decays in names:
    tf_name = "/".join(str(k.key) for k in path)
    # google-research/bert: _do_use_weight_decay with exclude ["LayerNorm", "layer_norm", "bias"]
    expected = not any(re.search(r, tf_name) for r in ["LayerNorm", "layer_norm", "bias"])
    assert bool(decays) == expected, tf_name
  # Kernels and embeddings decay; LayerNorm scale/bias and every bias do not.
  assert mask["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert not mask["bert"]["layer_0"]["output_LayerNorm"]["scale"]
  assert not mask["mlm_output_bias"]


def test_adamw_with_clipping_matches_torch():
  rs = np.random.RandomState(0)
  params = {
    "dense": {"kernel": rs.randn(4, 3).astype(np.float32), "bias": rs.randn(3).astype(np.float32)},
    "LayerNorm": {"scale": rs.randn(3).astype(np.float32)},
  }
  grads = [
    jax.tree_util.tree_map(lambda p: (rs.randn(*p.shape) * 3).astype(np.float32), params)
    for _ in range(4)
  ]
  cfg = common.optimizer_config()
  tx = optimizers.create_optimizer(cfg, 1e-2)
  p_jax = jax.tree_util.tree_map(jnp.asarray, params)
  opt_state = tx.init(p_jax)
  for g in grads:
    updates, opt_state = tx.update(g, opt_state, p_jax)
    p_jax = jax.tree_util.tree_map(jnp.add, p_jax, updates)

  t = {
    k: torch.tensor(v)
    for k, v in [
      ("kernel", params["dense"]["kernel"]),
      ("bias", params["dense"]["bias"]),
      ("scale", params["LayerNorm"]["scale"]),
    ]
  }
  for v in t.values():
    v.requires_grad_(True)
  opt = torch.optim.AdamW(
    [
      {"params": [t["kernel"]], "weight_decay": 0.01},
      {"params": [t["bias"], t["scale"]], "weight_decay": 0.0},
    ],
    lr=1e-2,
    betas=(0.9, 0.999),
    eps=1e-6,
  )
  for g in grads:
    t["kernel"].grad = torch.tensor(g["dense"]["kernel"])
    t["bias"].grad = torch.tensor(g["dense"]["bias"])
    t["scale"].grad = torch.tensor(g["LayerNorm"]["scale"])
    torch.nn.utils.clip_grad_norm_(list(t.values()), 1.0)
    opt.step()
  # optax computes Adam's bias correction 1 - 0.999^t in float32 (torch in float64): its few ulps
  # (t roundings of eps32 / 2) are relative t eps32 / (2 (1 - 0.999^t)) of it, half that after the
  # square root, of a step of lr 1e-2. Plus float_tolerance's rule 2 for the elementwise steps
  # scaled by the clipping's norm (a sum over the 18 entries), magnitude |p| + the 4 steps.
  steps = np.arange(1, len(grads) + 1)
  bias_correction = np.sum(1e-2 * steps * EPS32 / (4 * (1 - 0.999**steps)))
  for ours, theirs in [
    (p_jax["dense"]["kernel"], t["kernel"]),
    (p_jax["dense"]["bias"], t["bias"]),
    (p_jax["LayerNorm"]["scale"], t["scale"]),
  ]:
    theirs = theirs.detach().numpy()
    atol = bias_correction + sum_bound(np.abs(theirs) + len(grads) * 1e-2, 18)
    assert (np.abs(np.asarray(ours, np.float64) - theirs) <= atol).all()


def _batch(b=4, seed=0):
  batch = next(SyntheticPretrainInput(b, L, P, VOCAB, seed=seed))
  batch["masked_lm_weights"][0, -1] = 0.0  # a padding prediction must not count
  return batch


def test_pretraining_loss_matches_numpy_reference_over_full_logits():
  model = _model()
  params = _init(model)["params"]
  batch = _batch()
  loss, metrics = make_pretraining_loss(model)(params, batch, None, True)
  full = model.apply(
    {"params": params},
    batch["input_ids"],
    batch["input_mask"],
    batch["segment_ids"],
    None,
    deterministic=True,
  )
  logits_BxLxV = np.asarray(full["mlm_logits"], np.float64)
  logp = scipy.special.log_softmax(logits_BxLxV, axis=-1)
  pos, ids, w = batch["masked_lm_positions"], batch["masked_lm_ids"], batch["masked_lm_weights"]
  nll = np.array([[-logp[b, pos[b, j], ids[b, j]] for j in range(P)] for b in range(len(pos))])
  mlm = (nll * w).sum() / (w.sum() + 1e-5)
  nsp_logp = scipy.special.log_softmax(np.asarray(full["nsp_logits"], np.float64), axis=-1)
  nsp = -nsp_logp[np.arange(len(pos)), batch["next_sentence_labels"]].mean()
  np.testing.assert_allclose(float(metrics["mlm_loss"]), mlm, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["nsp_loss"]), nsp, rtol=1e-5)
  np.testing.assert_allclose(float(loss), mlm + nsp, rtol=1e-5)
  # Eval sums give the same loss, plus the accuracy over real predictions only.
  sums = jax.device_get(make_pretraining_eval(model)(params, batch))
  ev = summarize_eval(sums)
  np.testing.assert_allclose(ev["mlm_loss"], mlm, rtol=1e-4)
  pred = np.array(
    [[logits_BxLxV[b, pos[b, j]].argmax() for j in range(P)] for b in range(len(pos))]
  )
  np.testing.assert_allclose(ev["mlm_accuracy"], ((pred == ids) * w).sum() / w.sum(), rtol=1e-4)
  np.testing.assert_allclose(ev["mlm_perplexity"], np.exp(mlm), rtol=1e-3)


def _one_step(model, batch, grad_accum=1, optimizer="adamw"):
  mesh = parallel.create_mesh({"data": 1}, jax.devices()[:1])
  rules = parallel.normalize_rules(common.logical_axis_rules())
  cfg = common.optimizer_config()
  cfg.name = optimizer
  tx = optimizers.create_optimizer(cfg, 1e-3)
  init = lambda rng: model.init(
    rng, *[jnp.zeros((1, L), jnp.int32)] * 3, jnp.zeros((1, P), jnp.int32)
  )["params"]
  state = init_train_state(init, tx, mesh, rules, seed=0)
  step = jit_train_step(
    make_train_step(make_pretraining_loss(model), tx, None, grad_accum, mesh),
    jax.tree_util.tree_map(lambda x: x.sharding, state),
    mesh,
    rules,
  )
  state, metrics = step(state, parallel.make_global_batch(batch, mesh, rules))
  return state, {k: float(v) for k, v in metrics.items()}


def test_grad_accumulation_equals_full_batch_without_dropout():
  model = _model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  batch = next(SyntheticPretrainInput(8, L, P, VOCAB, seed=3, min_length=L))
  batch["masked_lm_weights"][:] = 1.0  # equal weight per micro-batch: the means agree exactly
  s1, m1 = _one_step(model, batch, 1)
  s2, m2 = _one_step(model, batch, 4)
  # The loss before the update, by micro-batches: other float32 orders (float_tolerance, rule 2;
  # the encoder, the head's D and vocabulary, the mean over the predictions).
  n = (
    encoder_terms(model.config, L) + model.config.hidden_size + VOCAB + batch["masked_lm_ids"].size
  )
  assert_sum_close(m1["loss"], m2["loss"], abs(m2["loss"]), n)
  assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-4)
  jax.tree_util.tree_map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6), s1.params, s2.params
  )
  assert int(s2.step) == 1


def test_remat_and_bf16_options():
  batch = _batch(4, seed=5)
  base = _model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  s0, m0 = _one_step(base, batch)
  s1, m1 = _one_step(
    _model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, remat=True), batch
  )
  n = encoder_terms(base.config, L) + base.config.hidden_size + VOCAB + batch["masked_lm_ids"].size
  assert_sum_close(m1["loss"], m0["loss"], abs(m0["loss"]), n)  # as above
  assert m1["grad_norm"] == pytest.approx(m0["grad_norm"], rel=1e-5)
  s2, m2 = _one_step(
    _model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, dtype="bfloat16"), batch
  )
  assert m2["loss"] == pytest.approx(m0["loss"], abs=0.05)
  # Mixed precision: float32 master params and optimizer state.
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(s2.params))
  assert s2.opt_state[1][0].mu["bert"]["layer_0"]["intermediate"]["kernel"].dtype == jnp.float32
  _, m3 = _one_step(base, batch, optimizer="lamb")
  assert np.isfinite(m3["update_norm"]) and m3["update_norm"] != pytest.approx(m0["update_norm"])


def test_flops_formula_counts_matmuls():
  bert = BertConfig.from_preset("base")
  # Hand count for BERT-base at seq 128 with 20 predictions (forward):
  d, f, v, n, l, p = 768, 3072, 30522, 12, 128, 20
  heads = 2 * d * d + 4 * d + 2 * p * (d * d + d * v)
  full_layers = (n - 1) * (8 * l * d * d + 4 * l * d * f + 4 * l * l * d)
  # The last layer's queries, output projection and feed-forward run at [CLS] + 20 positions.
  last = 4 * l * d * d + 4 * 21 * d * d + 4 * 21 * d * f + 4 * 21 * l * d
  manual = full_layers + last + heads
  assert flops_lib.forward_flops_per_example(bert, l, p) == manual
  # Over every position (as Hugging Face's head runs), every layer is full.
  assert flops_lib.forward_flops_per_example(bert, l, l) == n * (
    8 * l * d * d + 4 * l * d * f + 4 * l * l * d
  ) + 2 * d * d + 4 * d + 2 * l * (d * d + d * v)
  assert flops_lib.train_flops_per_example(bert, l, p) == 3 * manual
  assert flops_lib.peak_flops_per_device("TPU v4") == 275e12
  assert flops_lib.peak_flops_per_device("cpu", cpu_peak=1e11) == 1e11
  assert flops_lib.peak_flops_per_device("NVIDIA H100 80GB HBM3", configured=5.0) == 5.0


def test_encoder_flops_formula_counts_matmuls():
  """Fine-tuning's model FLOPs: every layer at every position, by hand for BERT-base, seq 384."""
  bert = BertConfig.from_preset("base")
  d, f, n, l = 768, 3072, 12, 384
  forward = n * (8 * l * d * d + 4 * l * d * f + 4 * l * l * d) + 2 * d * d
  assert flops_lib.encoder_train_flops_per_sequence(bert, l) == 3 * forward
