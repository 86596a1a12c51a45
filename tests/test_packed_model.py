"""Packed rows in the encoder: each sequence's outputs equal that sequence alone in a row.

The reference for a packed sequence is the same model run on the sequence by itself (its own row,
positions from 0, padding after it), as Krell et al. (2021) define packing without
cross-contamination; for every attention kernel that runs on a CPU.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import assert_gradients_close, assert_sum_close, encoder_terms

from bert_jax.model import (
  BertConfig,
  BertForPreTraining,
  BertForSequenceClassification,
  BertForTokenClassification,
)

L = 128


def _config(kernel="reference", **kw):
  return BertConfig.from_preset("tiny", vocab_size=97).replace(
    attention_probs_dropout_prob=0.0 if kernel != "reference" else 0.1,
    attention_kernel=kernel,
    **kw,
  )


def _sequences(rng, lengths):
  """Sequences of [CLS]=1 ... [SEP]=2 with token types 0 then 1 (as BERT pairs)."""
  out = []
  for n in lengths:
    ids = rng.integers(5, 97, n)
    ids[0], ids[-1] = 1, 2
    types = (np.arange(n) >= n // 2).astype(np.int32)
    masked = np.sort(rng.choice(np.arange(1, n - 1), 3, replace=False))
    out.append((ids.astype(np.int32), types, masked.astype(np.int32)))
  return out


def _alone(seqs):
  """Each sequence in its own row: the reference layout."""
  b = len(seqs)
  ids, types, mask = (np.zeros((b, L), np.int32) for _ in range(3))
  pos = np.zeros((b, 3), np.int32)
  for i, (s, t, m) in enumerate(seqs):
    ids[i, : len(s)], types[i, : len(s)], mask[i, : len(s)], pos[i] = s, t, 1, m
  return dict(input_ids=ids, input_mask=mask, segment_ids=types, masked_lm_positions=pos)


def _packed(seqs):
  """All sequences in one row, each with its [CLS], positions from 0, its own sequence id."""
  ids, types, mask, seq_ids, position_ids = (np.zeros((1, L), np.int32) for _ in range(5))
  cls, pos, start = [], [], 0
  for j, (s, t, m) in enumerate(seqs):
    n = len(s)
    ids[0, start : start + n], types[0, start : start + n] = s, t
    mask[0, start : start + n], seq_ids[0, start : start + n] = 1, j + 1
    position_ids[0, start : start + n] = np.arange(n)
    cls.append(start)
    pos.extend(start + m)
    start += n
  return dict(
    input_ids=ids,
    input_mask=mask,
    segment_ids=types,
    masked_lm_positions=np.asarray([pos], np.int32),
    position_ids=position_ids,
    sequence_ids=seq_ids,
    cls_positions=np.asarray([cls], np.int32),
  )


def _pretraining_outputs(config, batch, params=None):
  model = BertForPreTraining(config)
  if params is None:
    params = nn.unbox(
      model.init(jax.random.key(0), **_alone(_sequences(np.random.default_rng(0), [9])))["params"]
    )
  out = model.apply({"params": params}, **batch)
  return params, out


@pytest.mark.parametrize("kernel", ["reference", "dot_product"])
@pytest.mark.parametrize("is_decoder", [False, True])
def test_a_packed_sequence_equals_the_sequence_alone(kernel, is_decoder):
  config = _config(kernel, is_decoder=is_decoder)
  seqs = _sequences(np.random.default_rng(1), [17, 40, 9, 30])
  params, alone = _pretraining_outputs(config, _alone(seqs))
  _, packed = _pretraining_outputs(config, _packed(seqs), params)
  mlm_alone = np.asarray(alone["mlm_logits"]).reshape(-1, config.vocab_size)
  # Two float32 runs in other orders (float_tolerance, rule 2): magnitude the output's max, n the
  # encoder's and the head's (D) reduction lengths.
  n = encoder_terms(config, _packed(seqs)["input_ids"].shape[1]) + config.hidden_size
  assert_sum_close(np.asarray(packed["mlm_logits"])[0], mlm_alone, np.abs(mlm_alone).max(), n)
  nsp_alone = np.asarray(alone["nsp_logits"])
  assert_sum_close(np.asarray(packed["nsp_logits"])[0], nsp_alone, np.abs(nsp_alone).max(), n)


def test_changing_one_packed_sequence_changes_no_other_sequence_at_all():
  config = _config("reference")
  seqs = _sequences(np.random.default_rng(2), [20, 33, 25])
  changed = list(seqs)
  s, t, m = changed[1]
  changed[1] = (np.where(np.arange(len(s)) % 2 == 1, (s * 7) % 90 + 5, s).astype(np.int32), t, m)
  params, a = _pretraining_outputs(config, _packed(seqs))
  _, b = _pretraining_outputs(config, _packed(changed), params)
  mlm_a, mlm_b = np.asarray(a["mlm_logits"])[0], np.asarray(b["mlm_logits"])[0]
  # Three predictions per sequence; the second sequence's rows are 3..5.
  np.testing.assert_array_equal(mlm_a[[0, 1, 2, 6, 7, 8]], mlm_b[[0, 1, 2, 6, 7, 8]])
  assert not np.array_equal(mlm_a[3:6], mlm_b[3:6])
  nsp_a, nsp_b = np.asarray(a["nsp_logits"])[0], np.asarray(b["nsp_logits"])[0]
  np.testing.assert_array_equal(nsp_a[[0, 2]], nsp_b[[0, 2]])
  assert not np.array_equal(nsp_a[1], nsp_b[1])


def test_packed_gradients_equal_the_sum_over_sequences_alone():
  """The gradient of a sum of per-sequence outputs is the same packed or alone."""
  config = _config("reference").replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  seqs = _sequences(np.random.default_rng(3), [30, 21, 44])
  params, _ = _pretraining_outputs(config, _alone(seqs))
  model = BertForPreTraining(config)

  def total(params, batch):
    out = model.apply({"params": params}, **batch)
    return jnp.sum(out["mlm_logits"] ** 2) + jnp.sum(out["nsp_logits"] ** 2)

  g_alone = jax.grad(total)(params, _alone(seqs))
  g_packed = jax.grad(total)(params, _packed(seqs))
  # Two float32 gradients (float_tolerance, rule 2): the forward and backward chains and the sum
  # over the packed row's tokens.
  length = _packed(seqs)["input_ids"].shape[1]
  assert_gradients_close(g_packed, g_alone, 2 * encoder_terms(config, length) + length)


def test_classification_heads_read_each_packed_sequence():
  config = _config("reference")
  seqs = _sequences(np.random.default_rng(4), [12, 50, 31])
  alone, packed = _alone(seqs), _packed(seqs)
  cls = BertForSequenceClassification(config, num_labels=3)
  params = nn.unbox(cls.init(jax.random.key(1), alone["input_ids"])["params"])
  keys = ("input_ids", "input_mask", "segment_ids")
  a = cls.apply({"params": params}, **{k: alone[k] for k in keys})["logits"]
  p = cls.apply(
    {"params": params},
    **{k: packed[k] for k in keys + ("position_ids", "sequence_ids", "cls_positions")},
  )["logits"]
  assert p.shape == (1, 3, 3)
  # Two float32 runs (float_tolerance, rule 2): the encoder, the pooler and the classifier (2 D).
  n = encoder_terms(config, packed["input_ids"].shape[1]) + 2 * config.hidden_size
  assert_sum_close(np.asarray(p)[0], a, np.abs(np.asarray(a)).max(), n)

  tok = BertForTokenClassification(config, num_labels=5)
  params = nn.unbox(tok.init(jax.random.key(2), alone["input_ids"])["params"])
  a = np.asarray(tok.apply({"params": params}, **{k: alone[k] for k in keys})["logits"])
  p = np.asarray(
    tok.apply(
      {"params": params}, **{k: packed[k] for k in keys + ("position_ids", "sequence_ids")}
    )["logits"]
  )[0]
  start = 0
  for i, (s, _, _) in enumerate(seqs):
    assert_sum_close(p[start : start + len(s)], a[i, : len(s)], np.abs(a).max(), n)
    start += len(s)
