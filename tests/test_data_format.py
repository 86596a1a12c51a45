"""TFRecord interchange with google-research/bert's schema, and deterministic parallel generation.

The reference schema below is written out independently of bert_jax.data.tfrecord (it is the
one `run_pretraining.py` of google-research/bert parses).
"""

import dataclasses
import filecmp
import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from bert_jax.data import generate, pipeline

L, P = 128, 20


def reference_spec(seq, preds):
  return {
    "input_ids": tf.io.FixedLenFeature([seq], tf.int64),
    "input_mask": tf.io.FixedLenFeature([seq], tf.int64),
    "segment_ids": tf.io.FixedLenFeature([seq], tf.int64),
    "masked_lm_positions": tf.io.FixedLenFeature([preds], tf.int64),
    "masked_lm_ids": tf.io.FixedLenFeature([preds], tf.int64),
    "masked_lm_weights": tf.io.FixedLenFeature([preds], tf.float32),
    "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
  }


def independent_example(rng, seq=L, preds=P):
  """An Example as the original script writes it, built with plain tf.train protos."""
  n = int(rng.integers(8, seq + 1))
  ids = [101] + list(rng.integers(1000, 30000, n - 2)) + [102]
  segment = [0] * (n // 2) + [1] * (n - n // 2)
  k = int(rng.integers(1, preds + 1))
  positions = sorted(rng.choice(np.arange(1, n - 1), size=min(k, n - 2), replace=False))
  labels = [int(ids[p]) for p in positions]
  pad, mpad = seq - n, preds - len(positions)
  feat = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in v]))
  example = tf.train.Example(
    features=tf.train.Features(
      feature={
        "input_ids": feat(ids + [0] * pad),
        "input_mask": feat([1] * n + [0] * pad),
        "segment_ids": feat(segment + [0] * pad),
        "masked_lm_positions": feat(list(positions) + [0] * mpad),
        "masked_lm_ids": feat(labels + [0] * mpad),
        "masked_lm_weights": tf.train.Feature(
          float_list=tf.train.FloatList(value=[1.0] * len(positions) + [0.0] * mpad)
        ),
        "next_sentence_labels": feat([int(rng.integers(0, 2))]),
      }
    )
  )
  return example.SerializeToString()


def test_independently_written_records_are_read_as_is(tmp_path):
  rng = np.random.default_rng(0)
  records = [independent_example(rng) for _ in range(24)]
  path = str(tmp_path / "original.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for r in records:
      writer.write(r)
  expected = [tf.io.parse_single_example(r, reference_spec(L, P)) for r in records]
  inp = pipeline.PretrainInput(path, 8, L, P, shuffle=False, process_index=0, process_count=1)
  got = [next(inp) for _ in range(3)]
  for b, batch in enumerate(got):
    assert batch["input_ids"].dtype == np.int32 and batch["masked_lm_weights"].dtype == np.float32
    assert batch["next_sentence_labels"].shape == (8,)
    for i in range(8):
      ref = expected[b * 8 + i]
      for key, value in ref.items():
        np.testing.assert_array_equal(batch[key][i], np.reshape(value.numpy(), batch[key][i].shape))


@pytest.fixture(scope="module")
def small_corpus(shared_data):
  pretrain = shared_data / "pretrain"
  return [str(pretrain / "bert_sample_text.txt")]


def _config(minilm_dir, **kw):
  base = dict(
    tokenizer_path=str(minilm_dir / "vocab.txt"),
    do_lower_case=True,
    max_seq_lengths=(128, 512),
    max_predictions_per_seq=(20, 80),
    dupe_factor=3,
    random_seed=7,
  )
  base.update(kw)
  return generate.GenerationConfig(**base)


@pytest.mark.parametrize("engine", generate.ENGINES)
def test_our_records_parse_with_the_original_spec(engine, tmp_path, small_corpus, minilm_dir):
  result = generate.generate(
    small_corpus, str(tmp_path), _config(minilm_dir, engine=engine), num_workers=1, progress=False
  )
  for seq, preds in ((128, 20), (512, 80)):
    files = sorted(glob.glob(result["files"][seq]["train"]))
    assert files
    n = 0
    for record in tf.data.TFRecordDataset(files):
      ex = {
        k: v.numpy()
        for k, v in tf.io.parse_single_example(record, reference_spec(seq, preds)).items()
      }
      n += 1
      length = int(ex["input_mask"].sum())
      assert (ex["input_mask"][:length] == 1).all() and (ex["input_mask"][length:] == 0).all()
      assert ex["input_ids"][0] == 101 and ex["input_ids"][length - 1] == 102  # [CLS] .. [SEP]
      assert (ex["input_ids"][length:] == 0).all() and (ex["segment_ids"][length:] == 0).all()
      k = int(ex["masked_lm_weights"].sum())
      assert k == min(preds, max(1, round(length * 0.15)))
      assert (ex["masked_lm_weights"][:k] == 1).all() and (ex["masked_lm_weights"][k:] == 0).all()
      positions = ex["masked_lm_positions"][:k]
      assert (np.diff(positions) > 0).all() and positions.min() > 0 and positions.max() < length
      assert ex["next_sentence_labels"][0] in (0, 1)
    assert n == result["stats"]["per_length"][str(seq)]["train_examples"]


def test_same_bytes_for_one_and_two_workers(tmp_path, shared_data, minilm_dir):
  plays = sorted(glob.glob(str(shared_data / "pretrain" / "shakespeare" / "[a-c]*_gut.txt")))[:3]
  inputs = plays + [str(shared_data / "pretrain" / "bert_sample_text.txt")]
  config = _config(
    minilm_dir,
    input_format="text",
    dupe_factor=1,
    max_seq_lengths=(128,),
    max_predictions_per_seq=(20,),
    eval_fraction=0.2,
  )
  one = generate.generate(inputs, str(tmp_path / "one"), config, num_workers=1, progress=False)
  two = generate.generate(inputs, str(tmp_path / "two"), config, num_workers=2, progress=False)
  names = sorted(
    os.path.relpath(p, tmp_path / "one")
    for p in glob.glob(str(tmp_path / "one" / "seq_128" / "*.tfrecord"))
  )
  assert len(names) == 2 * len(inputs)
  match, mismatch, errors = filecmp.cmpfiles(
    tmp_path / "one", tmp_path / "two", names, shallow=False
  )
  assert not mismatch and not errors
  assert one["stats"]["per_length"] == two["stats"]["per_length"]
  assert one["stats"]["per_length"]["128"]["eval_examples"] > 0
  # Across hosts: host 0 of 2 and host 1 of 2 write exactly the shards of a one-host run.
  for host in (0, 1):
    generate.generate(
      inputs,
      str(tmp_path / "hosts"),
      config,
      num_workers=1,
      progress=False,
      process_index=host,
      process_count=2,
    )
  match, mismatch, errors = filecmp.cmpfiles(
    tmp_path / "one", tmp_path / "hosts", names, shallow=False
  )
  assert not mismatch and not errors
  # A rerun skips finished shards; other settings in the same directory are refused.
  again = generate.generate(inputs, str(tmp_path / "one"), config, num_workers=1, progress=False)
  assert again["stats"]["shards_skipped_existing"] == len(inputs)
  with pytest.raises(ValueError, match="different settings.*random_seed"):
    generate.generate(
      inputs,
      str(tmp_path / "one"),
      _config(
        minilm_dir,
        input_format="text",
        dupe_factor=1,
        max_seq_lengths=(128,),
        max_predictions_per_seq=(20,),
        eval_fraction=0.2,
        random_seed=8,
      ),
      num_workers=1,
      progress=False,
    )
  with open(tmp_path / "one" / "generation_config.json") as f:
    assert json.load(f)["random_seed"] == 7


@pytest.mark.parametrize("engine", generate.ENGINES)
def test_entry_point_makes_both_lengths(engine, tmp_path, small_corpus, minilm_dir):
  import subprocess
  import sys

  out = tmp_path / "cli"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.create_pretraining_data",
      f"--input_file={small_corpus[0]}",
      f"--output_dir={out}",
      f"--vocab_file={minilm_dir / 'vocab.txt'}",
      "--max_seq_length=128,512",
      "--max_predictions_per_seq=20,80",
      "--dupe_factor=1",
      "--num_workers=1",
      f"--engine={engine}",
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "seq 128: examples" in proc.stdout and "seq 512: examples" in proc.stdout
  assert glob.glob(str(out / "seq_128" / "train-00000-of-00001.tfrecord"))
  assert glob.glob(str(out / "seq_512" / "train-00000-of-00001.tfrecord"))
  with open(out / "generation_config.json") as f:
    assert json.load(f).get("engine", "original") == engine


def test_original_engine_instances_serialize_like_tensorflow():
  """The original engine's instances (ragged lists) padded into rows and serialized in bulk,
  against TensorFlow's own Example built from the lists, padded as google-research/bert pads."""
  from bert_jax.data import examples, shard_records

  rng = np.random.default_rng(1)
  instances = []
  for _ in range(20):
    n = int(rng.integers(5, L + 1))
    k = int(rng.integers(0, P + 1))
    instances.append(
      examples.Instance(
        input_ids=[int(x) for x in rng.integers(0, 30522, n)],
        segment_ids=[0] * (n // 2) + [1] * (n - n // 2),
        masked_positions=sorted(int(x) for x in rng.choice(n, size=min(k, n), replace=False)),
        masked_ids=[int(x) for x in rng.integers(0, 30522, min(k, n))],
        is_random_next=bool(rng.integers(0, 2)),
        short_target=False,
        chunk_sentences=1,
      )
    )
  rows = shard_records._padded(instances, L, P, pad_id=0)
  ours = shard_records._serialize(rows)
  feat = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
  for inst, got in zip(instances, ours, strict=True):
    ids, positions = inst.input_ids, inst.masked_positions
    n, pad, mpad = len(ids), L - len(ids), P - len(positions)
    reference = tf.train.Example(
      features=tf.train.Features(
        feature={
          "input_ids": feat(ids + [0] * pad),
          "input_mask": feat([1] * n + [0] * pad),
          "segment_ids": feat(inst.segment_ids + [0] * pad),
          "masked_lm_positions": feat(positions + [0] * mpad),
          "masked_lm_ids": feat(inst.masked_ids + [0] * mpad),
          "masked_lm_weights": tf.train.Feature(
            float_list=tf.train.FloatList(value=[1.0] * len(positions) + [0.0] * mpad)
          ),
          "next_sentence_labels": feat([int(inst.is_random_next)]),
        }
      )
    )
    assert got == reference.SerializeToString(deterministic=True)
  too_long = dataclasses.replace(instances[0], input_ids=[1] * (L + 1))
  with pytest.raises(ValueError, match="exceeds max_seq_length"):
    shard_records._padded([too_long], L, P, pad_id=0)


def test_bulk_serialization_matches_tensorflow():
  """serialize_arrays (every row at once) against TensorFlow's own Example, row by row: lengths
  and mask counts from 1 to full, values up to the widest (4-byte) varint."""
  from bert_jax.data import example_proto

  rng = np.random.default_rng(2)
  n = 300
  lengths = rng.integers(1, L + 1, n)
  lengths[:2] = (1, L)
  num_masked = rng.integers(0, P + 1, n)
  num_masked[:2] = (0, P)
  top = np.array([1 << 7, 1 << 14, 1 << 21, 1 << 28])[rng.integers(0, 4, (n, 1))]
  ids = (rng.random((n, L)) * top).astype(np.int64)
  segments = rng.integers(0, 2, (n, L)).astype(np.int8)
  positions = rng.integers(0, L, (n, P))
  labels = (rng.random((n, P)) * top).astype(np.int64)
  random_next = rng.integers(0, 2, n).astype(bool)
  outside = np.arange(L)[None] >= lengths[:, None]
  segments[outside] = 0
  unused = np.arange(P)[None] >= num_masked[:, None]
  positions[unused], labels[unused] = 0, 0
  ours = example_proto.serialize_arrays(
    ids, lengths, segments, positions, labels, num_masked, random_next
  )
  feat = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in v]))
  for i in range(n):
    k = int(num_masked[i])
    reference = tf.train.Example(
      features=tf.train.Features(
        feature={
          "input_ids": feat(ids[i]),
          "input_mask": feat(np.arange(L) < lengths[i]),
          "segment_ids": feat(segments[i]),
          "masked_lm_positions": feat(positions[i]),
          "masked_lm_ids": feat(labels[i]),
          "masked_lm_weights": tf.train.Feature(
            float_list=tf.train.FloatList(value=[1.0] * k + [0.0] * (P - k))
          ),
          "next_sentence_labels": feat([int(random_next[i])]),
        }
      )
    )
    assert ours[i] == reference.SerializeToString(deterministic=True), i
  with pytest.raises(ValueError, match=r"\[0, 2\*\*28\)"):
    example_proto.serialize_arrays(
      ids - 1, lengths, segments, positions, labels, num_masked, random_next
    )


def test_fast_engine_is_deterministic_and_recorded(tmp_path, shared_data, minilm_dir, monkeypatch):
  """The fast engine: the same bytes for one and two workers (these tokenizing with
  tensorflow-text, as workers with much input do); its name in generation_config.json, so a
  rerun with the other engine is refused."""
  plays = sorted(glob.glob(str(shared_data / "pretrain" / "shakespeare" / "[a-c]*_gut.txt")))[:2]
  kw = dict(
    input_format="text", dupe_factor=1, max_seq_lengths=(128,), max_predictions_per_seq=(20,)
  )
  config = _config(minilm_dir, engine="fast", **kw)
  one = generate.generate(plays, str(tmp_path / "one"), config, num_workers=1, progress=False)
  monkeypatch.setattr(generate, "WORKER_FAST_TOKENIZER_MIN_BYTES", 0)
  generate.generate(plays, str(tmp_path / "two"), config, num_workers=2, progress=False)
  names = [os.path.join("seq_128", f"train-0000{i}-of-00002.tfrecord") for i in range(2)]
  match, mismatch, errors = filecmp.cmpfiles(
    tmp_path / "one", tmp_path / "two", names, shallow=False
  )
  assert match == names
  assert one["stats"]["per_length"]["128"]["train_examples"] > 1000
  with open(tmp_path / "one" / "generation_config.json") as f:
    assert json.load(f)["engine"] == "fast"
  with pytest.raises(ValueError, match="different settings.*engine"):
    generate.generate(
      plays, str(tmp_path / "one"), _config(minilm_dir, **kw), num_workers=1, progress=False
    )
  with pytest.raises(ValueError, match="engine must be one of original, fast"):
    _config(minilm_dir, engine="numpy")
