"""BERT's input embeddings (Devlin et al. 2019, section 3, figure 2) against a float64 numpy
reference: LayerNorm(word[ids] + position[0..L) + token_type[segments]), and their gradients
against scatter-adds into each table (``np.add.at``).

The lookups run in the tables' float32 and the tables' gradients are float32 scatter-adds (the
word table) or a product with a one-hot matrix (token types), never a bfloat16 scatter: XLA:GPU
runs a scatter-add into bfloat16 as a compare-and-swap loop per element, which took 120 ms of a
187 ms BERT-base step on an H200 (docs/compile.md, "Measured on a GPU").
"""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import assert_sum_close

from bert_jax.model import BertConfig
from bert_jax.model.bert import Embeddings


def _setup(dtype, type_vocab_size=2, b=3, length=11):
  c = BertConfig(
    vocab_size=97,
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=24,
    type_vocab_size=type_vocab_size,
    dtype=dtype,
  )
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, c.vocab_size, (b, length)), jnp.int32)
  ids = ids.at[:, -3:].set(0)  # repeated ids (padding): the scatter-add must sum them
  seg = jnp.asarray(rng.integers(0, type_vocab_size, (b, length)), jnp.int32)
  module = Embeddings(c)
  params = nn.meta.unbox(module.init(jax.random.key(0), ids, seg, True)["params"])
  params = jax.tree_util.tree_map(
    lambda x: jnp.asarray(rng.normal(1.0, 0.5, x.shape), x.dtype), params
  )  # non-trivial LayerNorm scale and bias too
  return c, module, params, ids, seg


def _reference(c, p, ids, seg):
  f = {k: {n: np.asarray(v, np.float64) for n, v in d.items()} for k, d in p.items()}
  ids, seg = np.asarray(ids), np.asarray(seg)
  length = ids.shape[1]
  x = (
    f["word_embeddings"]["embedding"][ids]
    + f["position_embeddings"]["embedding"][:length][None]
    + f["token_type_embeddings"]["embedding"][seg]
  )
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  y = (x - mean) / np.sqrt(var + c.layer_norm_eps)
  return y * f["LayerNorm"]["scale"] + f["LayerNorm"]["bias"]


def _magnitude(c, p, ids, seg):
  """The magnitude of the terms each output element sums (float_tolerance, rule 2): the row's
  inputs (mean ~3: three tables ~1) over the row's standard deviation, times the scale, plus the
  bias."""
  f = {k: {n: np.asarray(v, np.float64) for n, v in d.items()} for k, d in p.items()}
  ids, seg = np.asarray(ids), np.asarray(seg)
  x = (
    f["word_embeddings"]["embedding"][ids]
    + f["position_embeddings"]["embedding"][: ids.shape[1]][None]
    + f["token_type_embeddings"]["embedding"][seg]
  )
  x_over_std = np.abs(x).max(-1, keepdims=True) / x.std(-1, keepdims=True)
  return x_over_std * np.abs(f["LayerNorm"]["scale"]) + np.abs(f["LayerNorm"]["bias"])


@pytest.mark.parametrize("type_vocab_size", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_embeddings_equal_the_definition(dtype, type_vocab_size):
  c, module, params, ids, seg = _setup(dtype, type_vocab_size)
  out = module.apply({"params": params}, ids, seg, True)
  assert out.dtype == jnp.dtype(dtype)
  ref = _reference(c, params, ids, seg)
  if dtype == "float32":  # float32 sums over the row's D inputs (float_tolerance, rule 2)
    assert_sum_close(out, ref, _magnitude(c, params, ids, seg), terms=c.hidden_size)
  else:  # bfloat16: one rounding of the float32 LayerNorm's output (8 bits of mantissa)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=2**-8, atol=2**-8)


def test_table_gradients_are_scatter_adds_of_the_output_gradient():
  c, module, params, ids, seg = _setup("float32")
  g_out = np.random.default_rng(1).normal(size=(*ids.shape, c.hidden_size))

  def loss(tables):
    p = dict(params, **tables)
    return jnp.sum(module.apply({"params": p}, ids, seg, True) * g_out)

  tables = {
    k: params[k] for k in ("word_embeddings", "position_embeddings", "token_type_embeddings")
  }
  grads = jax.grad(loss)(tables)
  # dLoss/dx before the LayerNorm, by finite-difference-free algebra: the LayerNorm's own
  # gradient from jax (checked against torch in test_model_hf); the lookups' gradients here.
  x_grad = jax.grad(
    lambda x: jnp.sum(
      nn.LayerNorm(epsilon=c.layer_norm_eps, use_fast_variance=False).apply(
        {"params": params["LayerNorm"]}, x
      )
      * g_out
    )
  )
  f = {k: np.asarray(v["embedding"], np.float64) for k, v in tables.items()}
  length = ids.shape[1]
  x = (
    f["word_embeddings"][np.asarray(ids)]
    + f["position_embeddings"][:length][None]
    + f["token_type_embeddings"][np.asarray(seg)]
  )
  dx = np.asarray(x_grad(jnp.asarray(x, jnp.float32)), np.float64)
  expected = {k: np.zeros_like(v) for k, v in f.items()}
  np.add.at(expected["word_embeddings"], np.asarray(ids), dx)
  expected["position_embeddings"][:length] = dx.sum(0)
  np.add.at(expected["token_type_embeddings"], np.asarray(seg), dx)
  # float32 scatter-adds of up to B x L rows (float_tolerance, rule 2), each row the LayerNorm's
  # gradient (gs - mean(gs) - y mean(gs y)) / std, gs = g scale: its terms' magnitude, times
  # max|x| / std for the rounding of x (mean ~3) that y = (x - mean) / std carries.
  std = np.sqrt(x.var(-1, keepdims=True) + c.layer_norm_eps)
  y, gs = (x - x.mean(-1, keepdims=True)) / std, g_out * np.asarray(params["LayerNorm"]["scale"])
  row_terms = np.abs(gs) + np.abs(gs).mean(-1, keepdims=True)
  row_terms = (row_terms + np.abs(y) * np.abs(gs * y).mean(-1, keepdims=True)) / std
  row_terms *= np.abs(x).max(-1, keepdims=True) / std
  magnitude = {k: np.zeros_like(v) for k, v in f.items()}
  np.add.at(magnitude["word_embeddings"], np.asarray(ids), row_terms)
  magnitude["position_embeddings"][:length] = row_terms.sum(0)
  np.add.at(magnitude["token_type_embeddings"], np.asarray(seg), row_terms)
  for k in expected:
    assert_sum_close(grads[k]["embedding"], expected[k], magnitude[k], ids.size, err_msg=k)


def test_bfloat16_gradients_scatter_in_float32_and_not_into_token_types():
  c, module, params, ids, seg = _setup("bfloat16")

  def loss(p):
    return jnp.sum(module.apply({"params": p}, ids, seg, True).astype(jnp.float32) ** 2)

  text = jax.jit(jax.grad(loss)).lower(params).as_text()  # StableHLO, before any backend
  scatters = re.findall(r"stablehlo\.scatter.*?->\s*tensor<([^>]+)>", text, flags=re.S)
  assert scatters, "the word table's gradient is a scatter-add"
  for result in scatters:
    assert result.endswith("f32"), f"a scatter-add into {result}: must be float32"
    assert not result.startswith(f"{c.type_vocab_size}x"), f"a scatter into token types {result}"
