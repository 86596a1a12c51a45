"""The attention kernel switch: each fused kernel against the reference path, and its errors.

The reference path is BERT's computation (checked against Hugging Face in test_model_hf.py);
``dot_product`` runs XLA's implementation on a CPU and ``splash`` the Pallas TPU kernel in
interpret mode. Forward and gradients, padded, left-to-right and packed rows, float32.
"""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


def _outputs_and_grads(kernel, packed, is_decoder, positions=False):
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

  (_, out), grads = jax.value_and_grad(loss, has_aux=True)(params)
  return np.asarray(out), grads


@pytest.mark.parametrize("kernel", ["dot_product", "splash"])
@pytest.mark.parametrize(
  "packed,is_decoder,positions",
  [(False, False, False), (True, False, False), (True, True, False), (True, False, True)],
)
def test_a_fused_kernel_equals_the_reference_path(kernel, packed, is_decoder, positions):
  ref_out, ref_grads = _outputs_and_grads("reference", packed, is_decoder, positions)
  out, grads = _outputs_and_grads(kernel, packed, is_decoder, positions)
  real = _batch(packed)["input_mask_BxL"] > 0
  if not positions:  # padded positions' rows are never read
    ref_out, out = ref_out[real], out[real]
  np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-5)
  flat_ref, flat = jax.tree_util.tree_leaves(ref_grads), jax.tree_util.tree_leaves(grads)
  for a, b in zip(flat_ref, flat):
    a = np.asarray(a)  # float32 sums in another order: tolerance relative to the leaf's scale
    np.testing.assert_allclose(np.asarray(b), a, rtol=1e-4, atol=2e-5 * max(1.0, np.abs(a).max()))


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
  ref_out, _ = _outputs_and_grads("reference", True, False)
  config = BertConfig.from_preset("tiny", vocab_size=97).replace(
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attention_kernel="splash"
  )
  model, batch = BertEncoder(config), _batch(True)
  params = nn.unbox(model.init(jax.random.key(0), batch["input_ids_BxL"])["params"])
  with mesh_context(mesh, rules):
    out = jax.jit(lambda p, b: model.apply({"params": p}, **b)["sequence_output"])(params, batch)
  real = batch["input_mask_BxL"] > 0
  np.testing.assert_allclose(np.asarray(out)[real], ref_out[real], rtol=2e-5, atol=2e-5)


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
