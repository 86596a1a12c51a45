"""Softmax over attention scores under a mask, in float32, keeping only its low-precision output.

The reference attention path's softmax (``bert_jax.model.bert.SelfAttention``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array


def masked_softmax_as(s_f32: Array, mask: Array, dtype) -> Array:
  """``softmax(where(mask, s_f32, min), -1).astype(dtype)``, computed in float32.

  For a low-precision ``dtype`` the backward pass keeps only the ``dtype`` output: not the
  float32 probabilities ``jax.nn.softmax`` keeps, nor the float32 masked scores and the
  broadcast mask ``jnp.where`` keeps (in bfloat16 that is 2 bytes per element of B x H x L x L
  per layer instead of 9). The gradient, ``p * (g - sum(g * p))`` (zero where masked, as
  p is), is computed in float32 from it. For float32 it is exactly the plain expression.
  """
  if jnp.dtype(dtype) == jnp.float32:
    return jax.nn.softmax(jnp.where(mask, s_f32, jnp.finfo(jnp.float32).min), axis=-1)
  return _low_precision_masked_softmax(s_f32, mask, jnp.dtype(dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _low_precision_masked_softmax(s_f32: Array, mask: Array, dtype) -> Array:
  s_f32 = jnp.where(mask, s_f32, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(s_f32, axis=-1).astype(dtype)


def _low_precision_masked_softmax_fwd(s_f32, mask, dtype):
  p = _low_precision_masked_softmax(s_f32, mask, dtype)
  return p, p


def _low_precision_masked_softmax_bwd(dtype, p, g):
  del dtype
  p32, g32 = p.astype(jnp.float32), g.astype(jnp.float32)
  return p32 * (g32 - jnp.sum(g32 * p32, axis=-1, keepdims=True)), None


_low_precision_masked_softmax.defvjp(
  _low_precision_masked_softmax_fwd, _low_precision_masked_softmax_bwd
)
