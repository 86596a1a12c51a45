"""Bucketed, sharded inference batches: plans, input order, padding, compilations, the mesh.

References: numpy sums of each row's own tokens (what a batch's padding and bucket cut must not
change), the bucket list ``parse_buckets`` gives, and jit's own cache of compiled programs. The
test process has 8 fake CPU devices (tests/conftest.py).
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.data.inference_batches import InferenceBatches, data_parallel_mesh, pad_ragged
from bert_jax.data.length_buckets import parse_buckets


def _rows(n, max_len, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, max_len + 1, size=n)
  return [rng.integers(1, 1000, size=k).tolist() for k in lengths], lengths


def _make(seqs, lengths):
  def make(index, length):
    return {
      "input_ids": pad_ragged(seqs, index, length),
      "input_mask": (np.arange(length) < lengths[index][:, None]).astype(np.int32),
    }

  return make


@jax.jit
def _row_sums(params, batch):
  ids, mask = batch["input_ids"], batch["input_mask"]
  width = jnp.full(ids.shape[:1], ids.shape[1], jnp.int32)  # the cut length the row ran at
  return {"sum": (ids * mask).sum(1) * params, "width": width}


def test_rows_come_back_in_input_order_and_batches_are_cut_to_buckets():
  seqs, lengths = _rows(37, 60, seed=1)
  batches = InferenceBatches(batch_size=8, buckets=parse_buckets("16", 64))
  out = batches.run_in_order(_row_sums, batches.replicate(2), lengths, _make(seqs, lengths))
  np.testing.assert_array_equal(out["sum"], [2 * sum(s) for s in seqs])
  # Each row ran at the bucket of the longest row of its batch: shortest first, 8 a batch.
  order = np.argsort(lengths, kind="stable")
  expected_width = np.empty(37, np.int64)
  for start in range(0, 37, 8):
    rows = order[start : start + 8]
    expected_width[rows] = min(b for b in (16, 32, 48, 64) if b >= lengths[rows].max())
  np.testing.assert_array_equal(out["width"], expected_width)


def test_the_last_batch_is_padded_with_copies_of_its_first_row():
  lengths = np.array([5, 3, 9, 1, 7, 2, 8, 4, 6, 10, 11])
  plan = InferenceBatches(batch_size=8, buckets=(4, 8, 12)).plan(lengths)
  assert [b.rows.tolist() for b in plan] == [
    np.argsort(lengths, kind="stable")[:8].tolist(),
    np.argsort(lengths, kind="stable")[8:].tolist(),
  ]
  last = plan[-1]
  assert last.index.size == 8 and last.rows.size == 3
  assert last.index.tolist() == last.rows.tolist() + [last.rows[0]] * 5
  assert [b.length for b in plan] == [8, 12]


def test_each_bucket_compiles_once():
  seqs, lengths = _rows(50, 40, seed=2)
  make = _make(seqs, lengths)

  @jax.jit
  def fn(params, batch):
    return (batch["input_ids"] * batch["input_mask"]).sum(1) + params

  batches = InferenceBatches(batch_size=8, buckets=parse_buckets("8", 40))
  used = {b.length for b in batches.plan(lengths)}
  assert len(used) > 2  # several buckets, several batches each
  compiled = []

  @contextlib.contextmanager
  def compiling(length):
    compiled.append(length)
    yield

  params = batches.replicate(0)
  for _ in range(2):  # a second pass compiles nothing new
    list(batches.run(fn, params, lengths, make, compiling=compiling))
  assert fn._cache_size() == len(used)  # pylint: disable=protected-access
  assert sorted(compiled) == sorted(used)


def test_batches_are_split_over_the_devices():
  assert jax.device_count() == 8
  batches = InferenceBatches(batch_size=3, buckets=(16,))
  assert batches.batch_size == 8  # rounded up to the 8 devices
  assert batches.mesh is data_parallel_mesh()  # one mesh per device set, built once
  assert batches.mesh.devices.size == 8
  seqs, lengths = _rows(5, 16, seed=3)
  arrays = batches.shard(_make(seqs, lengths), batches.plan(lengths)[0].index, 16)
  for x in arrays.values():
    assert x.shape == (8, 16)
    assert len(x.addressable_shards) == 8
    assert {s.data.shape for s in x.addressable_shards} == {(1, 16)}
  params = batches.replicate(np.ones(4))
  assert len(params.addressable_shards) == 8 and params.sharding.is_fully_replicated
  # Over a subset of the devices: 2 of them, so batches are a multiple of 2.
  two = InferenceBatches(batch_size=3, buckets=(16,), devices=jax.devices()[:2])
  assert two.batch_size == 4 and two.mesh.devices.size == 2
  out = two.run_in_order(_row_sums, two.replicate(1), lengths, _make(seqs, lengths))
  np.testing.assert_array_equal(out["sum"], [sum(s) for s in seqs])


def test_a_row_longer_than_every_bucket_is_an_error():
  batches = InferenceBatches(batch_size=8, buckets=(8, 16))
  with pytest.raises(ValueError, match=r"a row of 17 tokens is longer than the longest bucket"):
    batches.plan([3, 17])
  with pytest.raises(ValueError, match="buckets must be ascending positive lengths"):
    InferenceBatches(batch_size=8, buckets=(16, 8))


def test_bucket_lists_are_read_by_parse_buckets():
  """A sequence of lengths is exactly those lengths (one included), capped at max_seq_length;
  extract_features' default list reads through it."""
  from bert_jax.tools import features

  assert parse_buckets((8, 16, 24, 32, 48), 40) == (8, 16, 24, 32, 40)
  assert parse_buckets([32], 128) == (32, 128)  # not its multiples, unlike "32"
  assert features.bucket_lengths(64) == (8, 16, 24, 32, 48, 64)
  assert features.bucket_lengths(512)[-4:] == (192, 256, 384, 512)
  with pytest.raises(ValueError, match="lengths must be positive"):
    parse_buckets((0, 16), 64)
