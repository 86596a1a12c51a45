"""bert_jax.model.kernels.layer_norm.FastLayerNorm against flax's nn.LayerNorm (parameter tree, values
to the bit) and, for its written-out gradient, JAX's autodiff of the plain formula in float64
(whose values are checked against NumPy's)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from float_tolerance import assert_close_to_float64

from bert_jax.model.kernels.layer_norm import FastLayerNorm


def _inputs(shape=(3, 7, 96)):
  k = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(k[0], shape) * 3 + 2
  g = jax.random.normal(k[1], shape)
  params = {
    "scale": 1 + 0.1 * jax.random.normal(k[2], shape[-1:]),
    "bias": 0.1 * jax.random.normal(k[3], shape[-1:]),
  }
  return x, g, {"params": params}


def _numpy_layer_norm(x, scale, bias, eps):
  mean = x.mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * scale + bias


def test_values_and_parameters_are_flax_layer_norms():
  x, _, variables = _inputs()
  ref = nn.LayerNorm(epsilon=1e-12, use_fast_variance=False)
  ours = FastLayerNorm(1e-12, nn.initializers.ones_init(), nn.initializers.zeros_init())
  init_ref, init_ours = ref.init(jax.random.key(1), x), ours.init(jax.random.key(1), x)
  assert jax.tree_util.tree_map(jnp.shape, init_ref) == jax.tree_util.tree_map(jnp.shape, init_ours)
  want = jax.jit(ref.apply)(variables, x)
  np.testing.assert_array_equal(np.asarray(jax.jit(ours.apply)(variables, x)), np.asarray(want))


def test_gradients_against_float64():
  x, g, variables = _inputs()
  ours = FastLayerNorm(1e-12, nn.initializers.ones_init(), nn.initializers.zeros_init())
  _, vjp = jax.vjp(jax.jit(ours.apply), variables, x)
  dvars, dx = vjp(g)
  # The float64 reference: JAX's autodiff of the plain formula in float64 on the CPU.
  with jax.enable_x64():
    x64, g64 = jnp.asarray(np.asarray(x), jnp.float64), jnp.asarray(np.asarray(g), jnp.float64)
    s64 = jnp.asarray(np.asarray(variables["params"]["scale"]), jnp.float64)
    b64 = jnp.asarray(np.asarray(variables["params"]["bias"]), jnp.float64)

    def plain(x, s, b):
      mean = x.mean(-1, keepdims=True)
      return (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-12) * s + b

    y64, vjp64 = jax.vjp(plain, x64, s64, b64)
    want_dx, want_ds, want_db = (np.asarray(v) for v in vjp64(g64))
    np.testing.assert_allclose(
      np.asarray(y64), _numpy_layer_norm(*(np.asarray(v) for v in (x64, s64, b64)), 1e-12)
    )
  # Off float64 by at most 4x what flax's LayerNorm's float32 autodiff is off (float_tolerance).
  ref = nn.LayerNorm(epsilon=1e-12, use_fast_variance=False)
  ref_dvars, ref_dx = jax.vjp(jax.jit(ref.apply), variables, x)[1](g)
  assert_close_to_float64(dx, ref_dx, want_dx)
  for k, want in (("scale", want_ds), ("bias", want_db)):
    got, ref_got = dvars["params"][k], ref_dvars["params"][k]
    assert_close_to_float64(got, ref_got, want, err_msg=k)
