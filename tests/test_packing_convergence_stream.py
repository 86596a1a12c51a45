"""A packed pre-training run trains on the unpacked run's instances: the real reader's packed rows
(seq-128 sentence pairs in rows of 256, static and dynamic masks), taken apart by their sequence ids, hold the
same seed's unpacked stream in order, batch by batch a contiguous run of it, each instance with
its tokens, token types, masked positions and labels and NSP label, positions from 0 at its own
[CLS], and every [MASK] in a row a weighted prediction. So at equal instances (equal real
tokens) the two runs have seen the same data, which the convergence benchmark
(benchmarks/quality/packing_convergence.py) relies on."""

import collections

import numpy as np
import pytest

ROWS = 8


@pytest.fixture(scope="module")
def pairs128(pretraining_data, shared_data):
  return pretraining_data(
    "packing_stream_pairs128",
    [shared_data / "pretrain" / "bert_sample_text.txt"],
    vocab_size=600,
    max_seq_lengths=(128,),
    max_predictions_per_seq=(20,),
    dupe_factor=2,
    model=dict(
      hidden_size=32,
      num_hidden_layers=1,
      num_attention_heads=2,
      intermediate_size=64,
      max_position_embeddings=128,
    ),
  )


def _input(data, tmp_path, packed: bool, dynamic: bool):
  from bert_jax.tasks.pretraining.data import input_factory, resolve_data
  from configs import pretrain

  c = pretrain.get_config("tiny")
  c.input_files, c.eval_input_files, c.vocab_file = data["train"], "", data["vocab"]
  c.phase2.fraction = 0.0
  c.packing.enabled = packed
  c.max_seq_length = 256 if packed else 128  # rows of two seq-128 records, about
  c.dynamic_masking = dynamic
  c.shuffle_buffer_size = 100
  c.seed = 7
  sources = resolve_data(c, str(tmp_path))
  return input_factory(c, sources, sources.phases[0], ROWS)(), sources.tokenizer.mask_id


def _instance(ids, segments, positions, labels, nsp):
  return (tuple(ids.tolist()), tuple(segments.tolist()), tuple(positions.tolist()),
          tuple(labels.tolist()), int(nsp))  # fmt: skip


def _unpacked_instances(batch):
  out = []
  for r in range(batch["input_ids"].shape[0]):
    n = int(batch["input_mask"][r].sum())
    w = batch["masked_lm_weights"][r] > 0
    out.append(
      _instance(
        batch["input_ids"][r, :n],
        batch["segment_ids"][r, :n],
        batch["masked_lm_positions"][r][w],
        batch["masked_lm_ids"][r][w],
        batch["next_sentence_labels"][r],
      )
    )
  return out


def _packed_instances(batch, mask_id):
  """The sequences of packed rows, read from sequence_ids alone (not from the packer's state)."""
  out = []
  for r in range(batch["input_ids"].shape[0]):
    ids, seq = batch["input_ids"][r], batch["sequence_ids"][r]
    w = batch["masked_lm_weights"][r] > 0
    positions, labels = batch["masked_lm_positions"][r][w], batch["masked_lm_ids"][r][w]
    (masks,) = np.nonzero(ids == mask_id)
    assert set(masks.tolist()) <= set(positions.tolist()), "a [MASK] without a prediction"
    assert np.all(batch["sequence_weights"][r, seq.max() :] == 0)
    for s in range(1, int(seq.max()) + 1):
      (where,) = np.nonzero(seq == s)
      start, n = int(where[0]), len(where)
      assert np.array_equal(where, np.arange(start, start + n))
      assert np.array_equal(batch["position_ids"][r, where], np.arange(n))
      assert batch["cls_positions"][r, s - 1] == start and batch["sequence_weights"][r, s - 1]
      mine = (positions >= start) & (positions < start + n)
      out.append(
        _instance(
          ids[where],
          batch["segment_ids"][r, where],
          positions[mine] - start,
          labels[mine],
          batch["next_sentence_labels"][r, s - 1],
        )
      )
  return out


@pytest.mark.parametrize("dynamic", [False, True], ids=["static_masks", "dynamic_masks"])
def test_packed_rows_hold_the_unpacked_stream_in_order(pairs128, tmp_path, dynamic):
  packed, mask_id = _input(pairs128, tmp_path, True, dynamic)
  unpacked, _ = _input(pairs128, tmp_path, False, dynamic)
  stream = []
  total_packed = 0
  shifted_differs = False  # not vacuous: the run of the stream one instance later is another
  for _ in range(6):
    got = _packed_instances(next(packed), mask_id)
    while len(stream) < total_packed + len(got) + 1:
      stream += _unpacked_instances(next(unpacked))
    want = stream[total_packed : total_packed + len(got)]
    assert collections.Counter(got) == collections.Counter(want)
    shifted = stream[total_packed + 1 : total_packed + len(got) + 1]
    shifted_differs |= collections.Counter(got) != collections.Counter(shifted)
    total_packed += len(got)
  assert total_packed > 6 * ROWS * 1.5  # rows held more than one instance on average
  assert shifted_differs
