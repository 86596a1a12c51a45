"""Float32 LayerNorm with flax's parameters and values, and on a CPU a written-out gradient.

``FastLayerNorm`` has ``nn.LayerNorm``'s parameters (``scale``, ``bias``, shape [D]) and computes
what it computes with ``use_fast_variance=False``, op for op: the mean, the variance as the mean
of the squared deviations, then ``(x - mean) * (rsqrt(var + eps) * scale) + bias``. On a CPU its
gradient is the textbook one, ``dx = r * (gs - mean(gs) - xhat * mean(gs * xhat))`` with
``gs = g * scale``, ``xhat = (x - mean) * r``, ``r = rsqrt(var + eps)``, computed from the saved
``xhat`` and ``r``; autodiff of the forward made XLA:CPU run more passes and materialise the
scale's broadcast. Elsewhere (GPUs, TPUs): autodiff of the same forward.
A few percent of a float32 BERT-base step on a CPU (benchmarks/results/model_numerics.md).
bfloat16 keeps nn.LayerNorm.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax


def _forward(epsilon, x, scale, bias):
  centred = x - x.mean(-1, keepdims=True)
  r = lax.rsqrt(lax.square(centred).mean(-1, keepdims=True) + epsilon)
  return centred * (r * scale) + bias, centred * r, r


def _plain(epsilon, x, scale, bias):
  return _forward(epsilon, x, scale, bias)[0]


_with_written_gradient = jax.custom_vjp(_plain, nondiff_argnums=(0,))


def _fwd(epsilon, x, scale, bias):
  y, xhat, r = _forward(epsilon, x, scale, bias)
  return y, (xhat, r, scale)


def _bwd(epsilon, residuals, g):
  del epsilon
  xhat, r, scale = residuals
  gs = g * scale
  dx = r * (gs - gs.mean(-1, keepdims=True) - xhat * (gs * xhat).mean(-1, keepdims=True))
  rows = tuple(range(g.ndim - 1))
  return dx, jnp.sum(g * xhat, axis=rows), jnp.sum(g, axis=rows)


_with_written_gradient.defvjp(_fwd, _bwd)


class FastLayerNorm(nn.Module):
  """``nn.LayerNorm(use_fast_variance=False)`` over the last axis, float32 only."""

  epsilon: float
  scale_init: Callable[..., Any]
  bias_init: Callable[..., Any]

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    features = x.shape[-1]
    scale = self.param("scale", self.scale_init, (features,), jnp.float32)
    bias = self.param("bias", self.bias_init, (features,), jnp.float32)
    x = x.astype(jnp.float32)
    cpu = functools.partial(_with_written_gradient, self.epsilon)
    default = functools.partial(_plain, self.epsilon)
    return lax.platform_dependent(x, scale, bias, cpu=cpu, default=default)


def layer_norm(epsilon: float, dtype, param_dtype, scale_init, bias_init, name: str) -> nn.Module:
  """A LayerNorm computing its variance as mean((x - mean)^2), as BERT and PyTorch do (flax's
  default E[x^2] - E[x]^2 loses float32 precision on hidden states whose mean is large):
  ``FastLayerNorm`` in float32, ``nn.LayerNorm(use_fast_variance=False)`` otherwise."""
  if jnp.dtype(dtype) == jnp.float32 and jnp.dtype(param_dtype) == jnp.float32:
    return FastLayerNorm(epsilon, scale_init, bias_init, name=name)
  return nn.LayerNorm(
    epsilon=epsilon,
    dtype=dtype,
    param_dtype=param_dtype,
    use_fast_variance=False,
    scale_init=scale_init,
    bias_init=bias_init,
    name=name,
  )
