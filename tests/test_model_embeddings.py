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


@pytest.mark.parametrize("type_vocab_size", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_embeddings_equal_the_definition(dtype, type_vocab_size):
  c, module, params, ids, seg = _setup(dtype, type_vocab_size)
  out = module.apply({"params": params}, ids, seg, True)
  assert out.dtype == jnp.dtype(dtype)
  ref = _reference(c, params, ids, seg)
  # bfloat16: one rounding of the float32 LayerNorm's output (8 bits of mantissa)
  tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=2**-8, atol=2**-8)
  np.testing.assert_allclose(np.asarray(out, np.float64), ref, **tol)


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
  for k in expected:
    np.testing.assert_allclose(grads[k]["embedding"], expected[k], rtol=1e-5, atol=1e-5, err_msg=k)


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
