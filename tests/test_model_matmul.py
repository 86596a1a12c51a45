"""bert_jax.model.kernels.matmul: bfloat16 products in the form XLA:CPU runs natively, the same values.

References: ``jnp.einsum`` in float32 (or ``np.einsum`` in float64), flax's
``nn.DenseGeneral`` for the dense layer's parameters and float32 outputs, and JAX's own autodiff
of the plain bfloat16 product for the gradients.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import assert_sum_close, product_magnitude, sum_bound
from jax import lax

from bert_jax.model import BertConfig
from bert_jax.model.bert import dense
from bert_jax.model.kernels import matmul

BF16_ULP = 2.0**-8  # bfloat16 keeps 8 bits of mantissa: one rounding is within this, relatively


def _normal(seed, shape, dtype=jnp.bfloat16):
  return jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype)


def _grads(fn, a, b, w):
  return jax.grad(lambda a, b: jnp.sum(fn(a, b).astype(jnp.float32) * w), argnums=(0, 1))(a, b)


@pytest.mark.parametrize(
  "equation, a_shape, b_shape",
  [
    ("bld,df->blf", (4, 16, 32), (32, 64)),  # a dense layer
    ("blhk,hkd->bld", (4, 16, 2, 16), (2, 16, 32)),  # attention's output projection
    ("bnd,vd->bnv", (2, 5, 32), (97, 32)),  # the MLM decoder
  ],
)
def test_bfloat16_einsum_values_and_gradients(equation, a_shape, b_shape):
  a, b = _normal(2, a_shape), _normal(3, b_shape)
  out_shape = jnp.einsum(equation, a, b).shape
  w = _normal(4, out_shape, jnp.float32)
  plain = lambda a, b: jnp.einsum(equation, a, b)
  ours = lambda a, b: matmul.einsum(equation, a, b, jnp.bfloat16)
  # Values: within one bfloat16 rounding of the float32 product of the same inputs.
  exact = jnp.einsum(
    equation, a.astype(jnp.float32), b.astype(jnp.float32), precision=lax.Precision.HIGHEST
  )
  got = ours(a, b)
  assert got.dtype == jnp.bfloat16
  # One bfloat16 rounding of each value, plus float32's summation order near zero (k eps32 sqrt(n)
  # times each element's sum of |a_i b_i|; module float_tolerance).
  n = int(np.prod(a_shape)) * int(np.prod(b_shape)) // int(np.prod(out_shape))
  sum_error = sum_bound(product_magnitude(equation, a, b), n)
  assert (np.abs(np.asarray(got, np.float64) - exact) <= BF16_ULP * np.abs(exact) + sum_error).all()
  # Gradients: JAX's autodiff of the plain bfloat16 product, to one bfloat16 rounding.
  for g, g_ref in zip(_grads(ours, a, b, w), _grads(plain, a, b, w)):
    assert g.dtype == jnp.bfloat16
    scale = float(jnp.abs(g_ref.astype(jnp.float32)).max())
    np.testing.assert_allclose(
      np.asarray(g, np.float32), np.asarray(g_ref, np.float32), rtol=2 * BF16_ULP, atol=1e-2 * scale
    )


def test_float32_and_batched_products_are_left_as_they_are():
  """No custom gradient (nor a platform switch) unless the compute dtype is bfloat16 and the
  product has no batch index (attention's products keep JAX's own)."""
  a32, b32 = _normal(5, (4, 8, 16), jnp.float32), _normal(6, (16, 32), jnp.float32)
  for fn, args in [
    (lambda a, b: matmul.einsum("bld,df->blf", a, b, jnp.float32), (a32, b32)),
    (lambda y, bias: matmul.add_bias(y, bias), (a32, b32[0, :16])),
    (
      lambda q, k: matmul.einsum(
        "bqhk,bshk->bhqs", q, k, jnp.bfloat16, preferred_element_type=jnp.float32
      ),
      (_normal(7, (2, 8, 2, 4)), _normal(8, (2, 8, 2, 4))),
    ),
  ]:
    text = str(jax.make_jaxpr(jax.grad(lambda *x, f=fn: jnp.sum(f(*x)), argnums=(0, 1)))(*args))
    assert "custom_vjp" not in text and "platform_index" not in text and "cond" not in text, text
  bf16 = str(
    jax.make_jaxpr(lambda a, b: matmul.einsum("bld,df->blf", a, b, jnp.bfloat16))(
      _normal(5, (4, 8, 16)), _normal(6, (16, 32))
    )
  )
  assert "platform_index" in bf16


def _on_cpu() -> bool:
  """The tests run on JAX's default platform: the CPU in CI; a GPU where JAX_PLATFORMS names one
  (the non-CPU lowering, JAX's own ops, is then what runs)."""
  return jax.default_backend() == "cpu"


def _assert_same_vjp(fn, plain, args, g):
  """Off the CPU: ``fn``'s gradient is autodiff's of the plain ops, to the bit."""
  for got, want in zip(jax.vjp(fn, *args)[1](g), jax.vjp(plain, *args)[1](g)):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_a_float32_operands_gradient_is_not_rounded_to_bfloat16():
  """A float32 kernel multiplied in bfloat16 on a CPU: its gradient is the float32 product of
  the bfloat16 operands (not rounded to bfloat16, as autodiff through the cast would). Off the
  CPU: autodiff's, as before (module docstring)."""
  x, kernel = _normal(14, (4, 16, 32)), _normal(15, (32, 64), jnp.float32)
  g = _normal(16, (4, 16, 64))
  ours = lambda x, k: matmul.einsum("bld,df->blf", x, k, jnp.bfloat16)
  if not _on_cpu():
    plain = lambda x, k: jnp.einsum("bld,df->blf", x, k.astype(jnp.bfloat16))
    _assert_same_vjp(ours, plain, (x, kernel), g)
    return
  _, vjp = jax.vjp(ours, x, kernel)
  dx, dkernel = vjp(g)
  assert dx.dtype == jnp.bfloat16 and dkernel.dtype == jnp.float32
  want = np.einsum("bld,blf->df", np.asarray(x, np.float64), np.asarray(g, np.float64))
  # float32 sums of 4 x 16 products: within k eps32 sqrt(n) of their sum of |x g| (float_tolerance).
  assert_sum_close(dkernel, want, product_magnitude("bld,blf->df", x, g), terms=4 * 16)
  assert not np.array_equal(
    np.asarray(dkernel), np.asarray(dkernel.astype(jnp.bfloat16), np.float32)
  )


def test_bfloat16_bias_gradient_is_the_float32_sum():
  """On a CPU; off it, autodiff's bfloat16 sum as before (module docstring)."""
  y, g = _normal(9, (8, 64, 2, 16)), _normal(11, (8, 64, 2, 16))
  want = np.asarray(g, np.float64).sum(axis=(0, 1))
  magnitude = np.abs(np.asarray(g, np.float64)).sum(axis=(0, 1))  # of the 8 x 64 summed terms
  for bias_dtype, rtol in [(jnp.bfloat16, BF16_ULP), (jnp.float32, 0.0)]:
    bias = _normal(10, (2, 16), bias_dtype)
    if not _on_cpu():
      plain = lambda y, b: y + b.astype(y.dtype)
      _assert_same_vjp(matmul.add_bias, plain, (y, bias), g)
      continue
    _, vjp = jax.vjp(matmul.add_bias, y, bias)
    dy, dbias = vjp(g)
    np.testing.assert_array_equal(np.asarray(dy, np.float32), np.asarray(g, np.float32))
    assert dbias.dtype == bias_dtype
    # One rounding to the bias's dtype (rtol), plus the float32 sum's (float_tolerance, rule 2).
    atol = sum_bound(magnitude, 8 * 64)
    assert (np.abs(np.asarray(dbias, np.float64) - want) <= rtol * np.abs(want) + atol).all()
    np.testing.assert_array_equal(
      np.asarray(matmul.add_bias(y, bias), np.float32),
      np.asarray(y + bias.astype(jnp.bfloat16), np.float32),
    )


def test_einsum_rejects_what_its_gradient_cannot_express():
  a, b = _normal(0, (4, 4)), _normal(1, (4, 4))
  for bad in ["ij,jk", "...j,jk->...k", "ii,ij->j", "ij,jk->k"]:
    with pytest.raises(ValueError, match="einsum"):
      matmul.einsum(bad, a, b, jnp.bfloat16)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dense_has_dense_generals_parameters_and_float32_outputs(dtype):
  c = BertConfig.from_preset("tiny", vocab_size=64).replace(dtype=dtype)
  x = _normal(12, (2, 8, c.hidden_size), jnp.float32)
  ours = dense(c, 48, ("embed", "mlp"), "intermediate")
  ref = nn.DenseGeneral(48, dtype=c.dtype, kernel_init=nn.initializers.truncated_normal(0.02))
  p_ours = nn.unbox(ours.init(jax.random.key(3), x)["params"])
  p_ref = ref.init(jax.random.key(3), x)["params"]
  assert jax.tree_util.tree_structure(p_ours) == jax.tree_util.tree_structure(p_ref)
  for k in p_ref:
    np.testing.assert_array_equal(p_ours[k], p_ref[k])
  params = {"kernel": p_ref["kernel"], "bias": _normal(13, p_ref["bias"].shape, jnp.float32)}
  y, y_ref = ours.apply({"params": params}, x), ref.apply({"params": params}, x)
  assert y.dtype == y_ref.dtype == jnp.dtype(dtype)
  if dtype == "float32":
    np.testing.assert_array_equal(y, y_ref)
  else:
    np.testing.assert_allclose(
      np.asarray(y, np.float32), np.asarray(y_ref, np.float32), rtol=2 * BF16_ULP, atol=1e-2
    )


@pytest.mark.parametrize("h_shape", [(2, 5, 32), (7, 32)])
def test_tied_logits_values_and_gradients_against_float64(h_shape):
  """The decoder product with its CPU form of the table's gradient: the float64 products."""
  h, table = _normal(20, h_shape, jnp.float32), _normal(21, (97, 32), jnp.float32)
  g = _normal(22, h_shape[:-1] + (97,), jnp.float32)
  logits, vjp = jax.vjp(lambda h, t: matmul.tied_logits(h, t, jnp.float32), h, table)
  dh, dtable = vjp(g)
  h64, t64, g64 = (np.asarray(x, np.float64) for x in (h, table, g))
  # float32 sums: within k eps32 sqrt(n) of each element's sum of |terms| (float_tolerance).
  assert_sum_close(logits, h64 @ t64.T, np.abs(h64) @ np.abs(t64).T, terms=32)
  assert_sum_close(dh, g64 @ t64, np.abs(g64) @ np.abs(t64), terms=97)
  rows_g, rows_h = g64.reshape(-1, 97), h64.reshape(-1, 32)
  magnitude = np.abs(rows_g).T @ np.abs(rows_h)
  assert_sum_close(dtable, rows_g.T @ rows_h, magnitude, terms=len(rows_g))
  assert dh.dtype == dtable.dtype == jnp.float32 and dtable.shape == table.shape
  text = str(jax.make_jaxpr(lambda h, t: matmul.tied_logits(h, t, jnp.float32))(h, table))
  assert "platform_index" in text  # the CPU form only where lowered for a CPU
  bf16 = matmul.tied_logits(h.astype(jnp.bfloat16), table, jnp.bfloat16)  # einsum's form
  assert bf16.dtype == jnp.bfloat16 and bf16.shape == logits.shape
