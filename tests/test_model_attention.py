"""Attention's memory in low precision: the softmax keeps only its bfloat16 output for the
backward pass and the probability dropout redraws its mask instead of keeping it. References:
the plain expressions (jnp.where + jax.nn.softmax, flax-free dropout) and JAX's own autodiff."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from float_tolerance import assert_close_to_float64

from bert_jax.model import BertConfig
from bert_jax.model.bert import SelfAttention, masked_softmax_as
from bert_jax.model.kernels.dropout import Dropout

MIN = jnp.finfo(jnp.float32).min


def _scores(seed=0, shape=(2, 3, 5, 7)):
  s = jax.random.normal(jax.random.key(seed), shape, jnp.float32) * 4.0
  mask = jax.random.bernoulli(jax.random.key(seed + 1), 0.7, shape[:1] + (1, 1) + shape[-1:])
  return s, mask.at[..., 0].set(True)  # every row attends somewhere


def _plain(s, mask):
  return jax.nn.softmax(jnp.where(mask, s, MIN), axis=-1)


def test_forward_is_the_float32_softmax_rounded_once():
  s, mask = _scores()
  np.testing.assert_array_equal(
    np.asarray(masked_softmax_as(s, mask, jnp.bfloat16)),
    np.asarray(_plain(s, mask).astype(jnp.bfloat16)),
  )
  np.testing.assert_array_equal(
    np.asarray(masked_softmax_as(s, mask, "float32")), np.asarray(_plain(s, mask))
  )


def test_gradient_matches_the_float32_softmax_within_bfloat16_rounding():
  s, mask = _scores(3)
  w = jax.random.normal(jax.random.key(9), s.shape, jnp.float32)

  def ours(s):
    return jnp.sum(masked_softmax_as(s, mask, jnp.bfloat16).astype(jnp.float32) * w)

  def reference(s):  # autodiff through the float32 expression, the cast taken as identity
    return jnp.sum(_plain(s, mask) * w)

  g, g_ref = jax.grad(ours)(s), jax.grad(reference)(s)
  # The backward pass reads p rounded to bfloat16 (8 bits of mantissa) and g in bfloat16.
  np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=0.05, rtol=0.02)
  assert np.all(np.asarray(g)[~np.broadcast_to(np.asarray(mask), s.shape)] == 0.0)
  np.testing.assert_allclose(np.asarray(g.sum(-1)), 0.0, atol=0.02)  # rows sum to one


def _residuals(fn, *args):
  """The arrays ``jax.vjp`` keeps for the backward pass."""
  _, vjp = jax.vjp(fn, *args)
  return [x for x in jax.tree_util.tree_leaves(vjp) if hasattr(x, "shape")]


def _attention_residuals(dtype: str, shape_BxHxLxL=(2, 4, 16, 16)):
  b, h, length, _ = shape_BxHxLxL
  c = BertConfig.from_preset("tiny", vocab_size=64).replace(
    dtype=dtype, num_attention_heads=h, max_position_embeddings=length
  )
  x = jax.random.normal(jax.random.key(0), (b, length, c.hidden_size), jnp.float32)
  mask = (jnp.arange(length) < length - 3)[None, None, None, :].repeat(b, 0)
  layer = SelfAttention(c)
  params = nn.unbox(layer.init(jax.random.key(1), x, x, mask, True)["params"])

  def fn(params, x):
    y = layer.apply({"params": params}, x, x, mask, False, rngs={"dropout": jax.random.key(2)})
    return y.astype(jnp.float32)

  return [r for r in _residuals(fn, params, x) if r.shape == shape_BxHxLxL]


def test_bfloat16_attention_keeps_only_the_bfloat16_probabilities():
  kept = _attention_residuals("bfloat16")
  assert [r.dtype for r in kept] == [jnp.bfloat16], [r.dtype for r in kept]
  # float32 is unchanged: it keeps the probabilities in float32 and the dropout mask.
  kept32 = {str(r.dtype) for r in _attention_residuals("float32")}
  assert {"float32", "bool"} <= kept32, kept32


def test_recomputed_dropout_gives_the_same_values_and_gradients():
  x = jax.random.normal(jax.random.key(4), (2, 3, 8, 8), jnp.float32)
  v = jax.random.normal(jax.random.key(5), (2, 8, 3, 4), jnp.float32)

  def run(recompute, dtype=jnp.float32):
    def fn(x, v):
      y = Dropout(0.1, recompute=recompute).apply(
        {},
        x,
        False,
        lambda p, v: jnp.einsum("bhqs,bshk->bqhk", p, v),
        (v,),
        rngs={"dropout": jax.random.key(6)},
      )
      return jnp.sum(y * y)

    return jax.value_and_grad(fn, argnums=(0, 1))(x.astype(dtype), v.astype(dtype))

  (val, grads), (val_r, grads_r) = run(False), run(True)
  with jax.enable_x64():
    _, grads64 = run(False, jnp.float64)
    grads64 = [np.asarray(g) for g in grads64]
  np.testing.assert_array_equal(np.asarray(val), np.asarray(val_r))
  # Off float64 by at most 4x the kept mask's float32 error (float_tolerance).
  for g, g_r, g64 in zip(grads, grads_r, grads64):
    assert_close_to_float64(g_r, g, g64)
  # Where the mask dropped a probability its gradient is zero, kept or recomputed.
  assert 0 < np.mean(np.asarray(grads_r[0]) == 0.0) < 0.3
