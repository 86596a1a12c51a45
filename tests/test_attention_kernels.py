"""The attention kernel switch: each fused kernel against the reference path, and its errors.

The reference path is BERT's computation (checked against Hugging Face in test_model_hf.py);
``dot_product`` runs XLA's implementation on a CPU and ``splash`` the Pallas TPU kernel in
interpret mode. Forward and gradients, padded, left-to-right and packed rows, float32.
"""

import functools
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import assert_close_to_float64, float64_bound

from bert_jax.model import BertConfig, BertEncoder
from bert_jax.model.kernels import attention as kernels
from bert_jax.parallel import create_mesh, mesh_context, normalize_rules

L = 128


def _batch(packed: bool):
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 97, (2, L)).astype(np.int32)
  mask = np.ones((2, L), np.int32)
  mask[1, 70:] = 0
  batch = dict(input_ids_BxL=ids, input_mask_BxL=mask, segment_ids_BxL=(np.arange(L) > 40) * mask)
  if packed:
    seq = np.zeros((2, L), np.int32)
    seq[0, :50], seq[0, 50:90], seq[0, 90:] = 1, 2, 3
    seq[1, :30], seq[1, 30:70] = 1, 2
    starts = np.maximum.accumulate(
      np.where(np.diff(seq, prepend=-1, axis=1) != 0, np.arange(L), 0), 1
    )
    batch.update(sequence_ids_BxL=seq, position_ids_BxL=(np.arange(L) - starts).astype(np.int32))
  return batch


def _outputs_and_grads(kernel, packed, is_decoder, positions=False, float64=False):
  config = BertConfig.from_preset("tiny", vocab_size=97).replace(
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    attention_kernel=kernel,
    is_decoder=is_decoder,
  )
  model, batch = BertEncoder(config), _batch(packed)
  if positions:
    batch["output_positions_BxP"] = np.asarray([[3, 60, 100], [5, 6, 69]], np.int32)
  params = nn.unbox(model.init(jax.random.key(0), batch["input_ids_BxL"])["params"])
  key = "gathered_output" if positions else "sequence_output"

  def loss(params):
    out = model.apply({"params": params}, **batch)
    real = batch["input_mask_BxL"][..., None] if not positions else 1.0
    return jnp.sum((out[key] * real) ** 2) + jnp.sum(out["pooled_output"] ** 2), out[key]

  if not float64:
    (_, out), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return np.asarray(out), grads
  # The same parameters in float64. BertConfig admits 16- and 32-bit dtypes only, so the float64
  # run sets them past its check; the reference path still rounds the attention scores and
  # probabilities to float32 once per layer (bert.py's preferred_element_type and
  # masked_softmax_as), a few ulps against the hundreds a float32 run accumulates.
  object.__setattr__(config, "dtype", "float64")
  object.__setattr__(config, "param_dtype", "float64")
  model = BertEncoder(config)
  with jax.enable_x64(True):
    params = jax.tree_util.tree_map(lambda p: np.asarray(p, np.float64), params)
    (_, out), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return np.asarray(out), jax.tree_util.tree_map(np.asarray, grads)


@functools.cache
def _reference(packed, is_decoder, positions=False, float64=False):
  """The reference path's outputs and gradients (float32, or float64), computed once per case."""
  return _outputs_and_grads("reference", packed, is_decoder, positions, float64)


def _module(path) -> tuple:
  return tuple(path[:-1])


@pytest.mark.parametrize("kernel", ["dot_product", "splash"])
@pytest.mark.parametrize(
  "packed,is_decoder,positions",
  [(False, False, False), (True, False, False), (True, True, False), (True, False, True)],
)
def test_a_fused_kernel_equals_the_reference_path(kernel, packed, is_decoder, positions):
  ref_out, ref_grads = _reference(packed, is_decoder, positions)
  out64, grads64 = _reference(packed, is_decoder, positions, float64=True)
  out, grads = _outputs_and_grads(kernel, packed, is_decoder, positions)
  real = _batch(packed)["input_mask_BxL"] > 0
  if not positions:  # padded positions' rows are never read
    ref_out, out, out64 = ref_out[real], out[real], out64[real]
  # float32 sums in another order: off float64 by at most 4x the reference path's own error.
  assert_close_to_float64(out, ref_out, out64)
  leaves64 = jax.tree_util.tree_leaves_with_path(grads64)
  flat_ref, flat = jax.tree_util.tree_leaves(ref_grads), jax.tree_util.tree_leaves(grads)
  # Gradients: the reference's error and the magnitude are taken over each Dense/LayerNorm/table
  # (kernel and bias together: one sum over the tokens, of LayerNorm-scaled inputs for the
  # kernel), since a gradient that is zero in exact arithmetic (a key bias: softmax ignores a
  # shift of a row's scores) is rounding noise of its module's terms, not of its own size.
  ref_error, magnitude = {}, {}
  for (path, x64), a in zip(leaves64, flat_ref):
    m = _module(path)
    ref_error[m] = max(ref_error.get(m, 0.0), np.abs(np.asarray(a, np.float64) - x64).max())
    magnitude[m] = max(magnitude.get(m, 0.0), np.abs(x64).max())
  for (path, x64), b in zip(leaves64, flat):
    bound = float64_bound(ref_error[_module(path)], magnitude[_module(path)])
    np.testing.assert_allclose(
      np.asarray(b, np.float64), x64, rtol=0, atol=bound, err_msg=jax.tree_util.keystr(path)
    )


def test_dot_product_in_bfloat16_equals_the_reference_path_within_its_rounding():
  """A host without cuDNN (this CPU) takes XLA's kernel; the values are the reference path's."""
  outs = {}
  for kernel in ("reference", "dot_product"):
    config = BertConfig.from_preset("tiny", vocab_size=97).replace(
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attention_kernel=kernel
    )
    model, batch = BertEncoder(config.replace(dtype="bfloat16")), _batch(True)
    params = nn.unbox(model.init(jax.random.key(0), batch["input_ids_BxL"])["params"])
    out = model.apply({"params": params}, **batch)["sequence_output"]
    outs[kernel] = np.asarray(out.astype(jnp.float32))[batch["input_mask_BxL"] > 0]
  np.testing.assert_allclose(outs["dot_product"], outs["reference"], atol=0.1, rtol=0.05)


def test_splash_sharded_over_batch_and_heads_equals_the_reference_path():
  mesh = create_mesh({"data": 2, "fsdp": 1, "tensor": 2}, jax.devices()[:4])
  rules = normalize_rules([("batch", ("data", "fsdp")), ("heads", "tensor"), ("kv", None)])
  ref_out, _ = _reference(True, False)
  out64, _ = _reference(True, False, float64=True)
  config = BertConfig.from_preset("tiny", vocab_size=97).replace(
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attention_kernel="splash"
  )
  model, batch = BertEncoder(config), _batch(True)
  params = nn.unbox(model.init(jax.random.key(0), batch["input_ids_BxL"])["params"])
  with mesh_context(mesh, rules):
    out = jax.jit(lambda p, b: model.apply({"params": p}, **b)["sequence_output"])(params, batch)
  real = batch["input_mask_BxL"] > 0
  assert_close_to_float64(np.asarray(out)[real], ref_out[real], out64[real])


def test_a_fused_kernel_with_attention_dropout_is_refused():
  with pytest.raises(ValueError, match="attention_kernel='dot_product' has no attention dropout"):
    BertConfig(attention_kernel="dot_product", attention_probs_dropout_prob=0.1)
  with pytest.raises(ValueError, match="'flash' is not one of"):
    BertConfig(attention_kernel="flash", attention_probs_dropout_prob=0.0)


def _resolve(requested, dropout=0.0, platform="tpu", length=512):
  return kernels.resolve_attention_kernel(
    requested, attention_dropout=dropout, platform=platform, max_seq_length=length
  )


def test_auto_picks_the_platform_kernel_and_falls_back_with_dropout(caplog):
  assert _resolve("auto", platform="tpu") == "splash"
  assert _resolve("auto", platform="tpu", length=200) == "dot_product"
  assert _resolve("auto", platform="gpu") == "dot_product"
  assert _resolve("auto", platform="cpu") == "reference"
  with caplog.at_level(logging.INFO):
    assert _resolve("auto", dropout=0.1, platform="gpu") == "reference"
  assert "attention dropout" in caplog.text


@pytest.mark.parametrize(
  "requested,dropout,platform,length,message",
  [
    ("flash", 0.0, "tpu", 512, r"config.attention_kernel='flash' is not one of"),
    ("splash", 0.1, "tpu", 512, r"config.attention_probs_dropout_prob=0.1: set it to 0"),
    ("dot_product", 0.1, "gpu", 512, r"'dot_product' has no attention dropout"),
    ("splash", 0.0, "gpu", 512, r"'splash' runs on TPUs only; these devices are 'gpu'"),
    ("splash", 0.0, "tpu", 200, r"config.max_seq_length a multiple of 128, got 200"),
  ],
)
def test_bad_kernel_settings_are_one_line_errors(requested, dropout, platform, length, message):
  with pytest.raises(ValueError, match=message) as e:
    _resolve(requested, dropout, platform, length)
  assert "\n" not in str(e.value)
