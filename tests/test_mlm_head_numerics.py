"""The MLM head's cheaper formulations against plain references: the accuracy's ``argmax_is``
against numpy's argmax (first index of the maximum), ``add_vocab_bias``'s gradient against a
float64 sum of the rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model.kernels.matmul import add_vocab_bias
from bert_jax.tasks.pretraining.loss import argmax_is


@pytest.mark.parametrize("vocab", [2, 7, 30522])
def test_argmax_is_equals_numpy_argmax_with_ties(vocab):
  rng = np.random.default_rng(vocab)
  # Coarse values: most rows hold several equal maxima, the case where "is it the max" and
  # "is it the argmax" differ.
  logits = np.round(rng.normal(size=(4, 9, vocab)) * 2).astype(np.float32) / 2
  first = logits.argmax(-1)
  tied = np.array([[np.flatnonzero(r == r.max())[-1] for r in row] for row in logits])
  random = rng.integers(0, vocab, size=first.shape)
  for ids in (first, tied, random):
    expected = logits.argmax(-1) == ids
    got = np.asarray(argmax_is(jnp.asarray(logits), jnp.asarray(ids, jnp.int32)))
    np.testing.assert_array_equal(got, expected)
  assert (tied != first).any() or vocab == 2  # the ties were really exercised


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_add_vocab_bias_values_and_gradients(dtype):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 1001)).astype(np.float32)
  bias = rng.normal(size=(1001,)).astype(np.float32)
  cot = rng.normal(size=logits.shape).astype(np.float32)
  x, b, g = (jnp.asarray(a, dtype) for a in (logits, bias, cot))
  y, vjp = jax.vjp(add_vocab_bias, x, b)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(x + b))
  dx, db = vjp(g)
  assert dx.dtype == x.dtype and db.dtype == b.dtype
  np.testing.assert_array_equal(np.asarray(dx), np.asarray(g))
  g64 = np.asarray(g.astype(jnp.float32), np.float64)
  expected = g64.sum(axis=(0, 1))
  # One rounding to the bias's dtype from a float32 sum of 15 rows.
  tol = 1e-5 if dtype == "float32" else 2**-7
  np.testing.assert_allclose(np.asarray(db.astype(jnp.float32)), expected, rtol=tol, atol=tol)
