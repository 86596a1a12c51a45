"""Packed pre-training rows: the packer (bert_jax.data.packing) keeps each instance as it was and
resumes to the same rows; a packed train step's loss, metrics and gradients are the unpacked
step's over the same sequences; no packed sequence sees another; the config keys, the base_fast
preset and the one-line errors for input that cannot be packed."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_tolerance import assert_gradients_close, assert_sum_close, encoder_terms

from bert_jax.data.packing import PackedPretrainInput
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.tasks.pretraining.loss import make_pretraining_loss

VOCAB = 97


def make_instances(n, length=32, predictions=5, seed=0, min_len=5, unmasked=False):
  """``n`` instances in google-research/bert's layout: [CLS] A [SEP] B [SEP] then zeros; masked
  positions (sorted, inside the instance) replaced by [MASK] = 4; random NSP labels."""
  rng = np.random.default_rng(seed)
  out = {
    "input_ids": np.zeros((n, length), np.int32),
    "input_mask": np.zeros((n, length), np.int32),
    "segment_ids": np.zeros((n, length), np.int32),
    "masked_lm_positions": np.zeros((n, predictions), np.int32),
    "masked_lm_ids": np.zeros((n, predictions), np.int32),
    "masked_lm_weights": np.zeros((n, predictions), np.float32),
    "next_sentence_labels": rng.integers(0, 2, n).astype(np.int32),
  }
  for i in range(n):
    m = int(rng.integers(min_len, length + 1))
    a = int(rng.integers(1, m - 3))  # tokens of A; B gets m - 3 - a >= 1
    ids = rng.integers(5, VOCAB, m).astype(np.int32)
    ids[0], ids[a + 1], ids[m - 1] = 2, 3, 3
    out["input_ids"][i, :m] = ids
    out["input_mask"][i, :m] = 1
    out["segment_ids"][i, a + 2 : m] = 1
    if unmasked:
      continue
    candidates = [j for j in range(m) if ids[j] not in (2, 3)]
    k = int(min(predictions, max(1, round(0.15 * m))))
    pos = np.sort(rng.choice(candidates, k, replace=False))
    out["masked_lm_positions"][i, :k] = pos
    out["masked_lm_ids"][i, :k] = ids[pos]
    out["masked_lm_weights"][i, :k] = 1.0
    out["input_ids"][i, pos] = 4
  return out


class ListInstances:
  """A resumable instance iterator over fixed instances, ``chunk`` per batch (as the readers):
  its position is the index of the next chunk; it wraps around at the end."""

  def __init__(self, instances, chunk):
    self.instances, self.chunk = instances, chunk
    self.n = len(instances["input_ids"])
    self.position = 0

  def get_state(self):
    return {"position": self.position}

  def set_state(self, state):
    self.position = int(state["position"])

  def __iter__(self):
    return self

  def __next__(self):
    idx = (np.arange(self.chunk) + self.position * self.chunk) % self.n
    self.position += 1
    return {k: v[idx] for k, v in self.instances.items()}


def instance_of(instances, i):
  n = int(instances["input_mask"][i].sum())
  w = instances["masked_lm_weights"][i] > 0
  return dict(
    ids=instances["input_ids"][i, :n],
    segments=instances["segment_ids"][i, :n],
    positions=instances["masked_lm_positions"][i][w],
    labels=instances["masked_lm_ids"][i][w],
    nsp=int(instances["next_sentence_labels"][i]),
  )


def unpack_row(batch, r):
  """The sequences of packed row ``r`` as the instances they came from."""
  out = []
  seq = batch["sequence_ids"][r]
  positions, weights = batch["masked_lm_positions"][r], batch["masked_lm_weights"][r] > 0
  for s in range(1, seq.max() + 1):
    (where,) = np.nonzero(seq == s)
    start, n = int(where[0]), len(where)
    assert np.array_equal(where, np.arange(start, start + n))  # contiguous
    assert np.array_equal(batch["position_ids"][r, where], np.arange(n))
    assert batch["cls_positions"][r, s - 1] == start
    assert batch["sequence_weights"][r, s - 1] == 1.0
    mine = weights & (positions >= start) & (positions < start + n)
    out.append(
      dict(
        ids=batch["input_ids"][r, where],
        segments=batch["segment_ids"][r, where],
        positions=positions[mine] - start,
        labels=batch["masked_lm_ids"][r][mine],
        nsp=int(batch["next_sentence_labels"][r, s - 1]),
      )
    )
  s = seq.max()
  assert np.all(batch["sequence_weights"][r, s:] == 0)
  assert np.array_equal(batch["input_mask"][r], (seq > 0).astype(np.int32))
  assert int(weights.sum()) == sum(len(x["positions"]) for x in out)
  return out


def _same(a, b):
  return all(np.array_equal(a[k], b[k]) for k in ("ids", "segments", "positions", "labels")) and (
    a["nsp"] == b["nsp"]
  )


def first_fit(lengths, predictions, rows, L, S, P):
  """The documented rule, written out: per batch, instance i (in stream order) goes at the end
  of the first row where it fits, else into a new row; a batch ends at the first instance that
  fits no row once it has ``rows`` rows. Yields each batch's [(instance, row, start)]."""
  i = 0
  while True:
    used, preds, seqs, placed = [], [], [], []
    while True:
      n, p = lengths[i % len(lengths)], predictions[i % len(lengths)]
      r = next(
        (r for r in range(len(used)) if used[r] + n <= L and preds[r] + p <= P and seqs[r] < S),
        None,
      )
      if r is None and len(used) == rows:
        break
      if r is None:
        r = len(used)
        used.append(0), preds.append(0), seqs.append(0)
      placed.append((i, r, used[r]))
      used[r], preds[r], seqs[r] = used[r] + n, preds[r] + p, seqs[r] + 1
      i += 1
    yield placed


def test_packer_keeps_every_instance_and_fills_rows_first_fit():
  inst = make_instances(300, length=32, predictions=5, seed=1)
  L, S, P, R = 64, 3, 12, 4
  packer = PackedPretrainInput(ListInstances(inst, 7), R, L, S, P)
  lengths = inst["input_mask"].sum(1)
  preds = (inst["masked_lm_weights"] > 0).sum(1)
  expected = first_fit(lengths, preds, R, L, S, P)
  total = 0
  for _ in range(10):
    batch = next(packer)
    placed = next(expected)
    by_row = {r: unpack_row(batch, r) for r in range(R)}
    assert sum(len(v) for v in by_row.values()) == len(placed)
    for i, r, start in placed:
      k = sum(1 for _, r2, s2 in placed if r2 == r and s2 < start)  # its index in the row
      assert batch["cls_positions"][r, k] == start
      assert _same(by_row[r][k], instance_of(inst, i % 300)), i
    total += len(placed)
  assert packer.sequences == total
  assert total > R * 10 * 1.5  # several sequences per row on average


def test_packer_is_deterministic_and_resumes_to_the_same_rows():
  inst = make_instances(50, length=32, predictions=5, seed=2)

  def batches(packer, k):
    return [next(packer) for _ in range(k)]

  a = PackedPretrainInput(ListInstances(inst, 6), 3, 64, 4, 16)
  b = PackedPretrainInput(ListInstances(inst, 6), 3, 64, 4, 16)
  first_a, first_b = batches(a, 5), batches(b, 5)
  for x, y in zip(first_a, first_b):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  state = json.loads(json.dumps(a.get_state()))  # what a checkpoint keeps
  rest = batches(a, 6)
  resumed = PackedPretrainInput(ListInstances(inst, 6), 3, 64, 4, 16)
  next(resumed)  # somewhere else first, as a process that read ahead
  resumed.set_state(state)
  for x, y in zip(rest, batches(resumed, 6)):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def test_packer_rejects_an_instance_longer_than_the_row():
  inst = make_instances(8, length=32, predictions=5, seed=3, min_len=30)
  packer = PackedPretrainInput(ListInstances(inst, 4), 2, 16, 4, 16)
  with pytest.raises(ValueError, match=r"does not fit a packed row of max_seq_length=16"):
    next(packer)


# --- the train step --------------------------------------------------------------------------
def _model(objective):
  bert = BertConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    is_decoder=objective == "ltr",
  )
  return BertForPreTraining(bert, next_sentence=objective == "mlm_nsp")


def _packed_and_unpacked(objective, rows=3):
  inst = make_instances(64, length=32, predictions=5, seed=4, unmasked=objective == "ltr")
  packer = PackedPretrainInput(ListInstances(inst, 64), rows, 64, 4, 16)
  packed = next(packer)
  n = packer.sequences
  unpacked = {k: v[:n] for k, v in inst.items()}
  return packed, unpacked, n


def _keys(objective, packed):
  from bert_jax.tasks.pretraining.data import batch_keys

  return batch_keys(objective, packed)


@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm", "ltr"])
def test_packed_step_equals_the_unpacked_step_over_the_same_sequences(objective):
  packed, unpacked, n = _packed_and_unpacked(objective)
  assert n >= 6  # 3 rows of 64 hold at least two sequences of at most 32 each
  model = _model(objective)
  packed = {k: jnp.asarray(packed[k]) for k in _keys(objective, True)}
  unpacked = {k: jnp.asarray(unpacked[k]) for k in _keys(objective, False)}
  ids = unpacked["input_ids"]
  params = model.init(jax.random.PRNGKey(0), ids, ids, ids, unpacked.get("masked_lm_positions"))[
    "params"
  ]
  loss_fn = make_pretraining_loss(model, objective)
  grad = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, None, True), has_aux=True))
  (loss_p, metrics_p), grads_p = grad(params, packed)
  (loss_u, metrics_u), grads_u = grad(params, unpacked)
  # Two float32 steps in other orders (float_tolerance, rule 2): the encoder's reductions at the
  # packed length, the head's (D, then the vocabulary's softmax) and the mean over the tokens.
  length = packed["input_ids"].shape[1]
  n = encoder_terms(model.config, length) + model.config.hidden_size + VOCAB + ids.size
  assert_sum_close(loss_p, loss_u, abs(float(loss_u)), n)
  assert metrics_p.keys() == metrics_u.keys()
  for k in metrics_u:
    assert_sum_close(metrics_p[k], metrics_u[k], np.abs(metrics_u[k]).max(), n, err_msg=k)
  assert_gradients_close(grads_p, grads_u, 2 * n)
  # Not vacuous: the unpacked step of a different set of sequences differs.
  other = dict(unpacked, input_ids=unpacked["input_ids"].at[0, 1].set(5 + (ids[0, 1] - 4) % 90))
  assert abs(float(grad(params, other)[0][0]) - float(loss_u)) > 1e-6


@pytest.mark.parametrize("objective", ["mlm_nsp", "ltr"])
def test_changing_one_packed_sequence_changes_no_other_sequence(objective):
  from bert_jax.tasks.pretraining.loss import _forward

  packed, _, _ = _packed_and_unpacked(objective, rows=2)
  model = _model(objective)
  batch = {k: jnp.asarray(packed[k]) for k in _keys(objective, True)}
  ids = batch["input_ids"]
  params = model.init(jax.random.PRNGKey(1), ids, ids, ids, batch.get("masked_lm_positions"))[
    "params"
  ]
  seq = packed["sequence_ids"][0]
  assert seq.max() >= 3
  target = 2  # the middle sequence of row 0: others before and after it
  changed = dict(packed)
  ids_changed = packed["input_ids"].copy()
  where = seq == target
  ids_changed[0, where] = (ids_changed[0, where] + 7) % (VOCAB - 5) + 5
  changed["input_ids"] = ids_changed
  changed = {k: jnp.asarray(changed[k]) for k in _keys(objective, True)}
  fwd = jax.jit(lambda p, b: _forward(model, p, b, None, True, objective))
  a, b = fwd(params, batch), fwd(params, changed)
  if objective == "ltr":  # logits at every token: the other sequences' tokens are unchanged
    la, lb = np.asarray(a["mlm_logits"]), np.asarray(b["mlm_logits"])
    assert not np.array_equal(la[0, where], lb[0, where])
    others = (seq > 0) & ~where  # (padding's outputs belong to no sequence)
    np.testing.assert_array_equal(la[0, others], lb[0, others])
    real = packed["sequence_ids"][1:] > 0
    np.testing.assert_array_equal(la[1:][real], lb[1:][real])
    return
  positions = packed["masked_lm_positions"][0]
  in_target = (seq[positions] == target) & (packed["masked_lm_weights"][0] > 0)
  la, lb = np.asarray(a["mlm_logits"]), np.asarray(b["mlm_logits"])
  assert not np.array_equal(la[0, in_target], lb[0, in_target])
  np.testing.assert_array_equal(la[0, ~in_target], lb[0, ~in_target])
  np.testing.assert_array_equal(la[1:], lb[1:])
  na, nb = np.asarray(a["nsp_logits"]), np.asarray(b["nsp_logits"])
  assert na.shape == (2, 4, 2)
  others = np.arange(4) != target - 1
  assert not np.array_equal(na[0, target - 1], nb[0, target - 1])
  np.testing.assert_array_equal(na[0, others], nb[0, others])
  np.testing.assert_array_equal(na[1:], nb[1:])
