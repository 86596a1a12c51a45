"""PretrainInput: exact resumption, epochs, dynamic masking, host split, eval reading, bad shards."""

import json
import math
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from bert_jax.data import generate, masking, pipeline, tfrecord

L, P = 128, 20


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
  from bert_jax.tokenize import load_tokenizer

  return load_tokenizer(minilm_dir / "vocab.txt", do_lower_case=True)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, shared_data, minilm_dir):
  """Four shards made from the BERT sample text and three Shakespeare plays."""
  out = tmp_path_factory.mktemp("pipeline_data")
  plays = shared_data / "pretrain" / "shakespeare"
  inputs = [str(shared_data / "pretrain" / "bert_sample_text.txt")] + [
    str(plays / name) for name in ("macbeth_gut.txt", "tempest_gut.txt", "sonnets_gut.txt")
  ]
  config = generate.GenerationConfig(
    tokenizer_path=str(minilm_dir / "vocab.txt"),
    do_lower_case=True,
    input_format="text",
    max_seq_lengths=(L,),
    max_predictions_per_seq=(P,),
    dupe_factor=1,
    random_seed=3,
  )
  generate.generate(inputs, str(out), config, num_workers=1, progress=False)
  return out


def train_files(data_dir):
  return str(data_dir / "seq_128" / "train-*.tfrecord")


def make(data_dir, batch_size=16, **kw):
  kw.setdefault("process_index", 0)
  kw.setdefault("process_count", 1)
  kw.setdefault("shuffle_buffer_size", 256)
  return pipeline.PretrainInput(kw.pop("files", train_files(data_dir)), batch_size, L, P, **kw)


def key_of(batch, i):
  """An example's identity: its original tokens (static masks undone) and segment ids."""
  ids = batch["input_ids"][i].copy()
  w = batch["masked_lm_weights"][i] > 0
  ids[batch["masked_lm_positions"][i][w]] = batch["masked_lm_ids"][i][w]
  return ids.tobytes() + batch["segment_ids"][i].tobytes()


def assert_batches_equal(a, b):
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def epoch_size(data_dir):
  return sum(tfrecord.check_record_framing(str(p)) for p in (data_dir / "seq_128").glob("train-*"))


@pytest.mark.parametrize("dynamic", [False, True])
def test_resume_gives_exactly_the_next_batch(data_dir, tokenizer, dynamic):
  n = epoch_size(data_dir)
  batch = 64
  crossing = n // batch  # batch index (0-based) that straddles the end of epoch 0
  assert n % batch, "pick a batch size that does not divide the epoch"
  reference = make(data_dir, batch, seed=5, dynamic_masking=dynamic, tokenizer=tokenizer)
  states, batches = [], []
  for _ in range(crossing + 3):
    states.append(reference.get_state())
    batches.append(next(reference))
  for resume_at in (3, crossing, crossing + 1):
    state = json.loads(json.dumps(states[resume_at]))  # JSON round trip: small and plain.
    resumed = make(data_dir, batch, seed=5, dynamic_masking=dynamic, tokenizer=tokenizer)
    resumed.set_state(state)
    assert_batches_equal(next(resumed), batches[resume_at])
    assert_batches_equal(next(resumed), batches[resume_at + 1])
  assert states[crossing + 1]["epoch"] == 1  # The straddling batch ended in epoch 1.


def read_epoch(inp):
  """All examples (identities) of the first epoch, in order (batch_size 1)."""
  keys = []
  while True:
    b = next(inp)
    if inp.get_state()["epoch"] > 0:
      return keys
    keys.append(key_of(b, 0))


def test_epochs_reshuffle_and_cover_the_data(data_dir):
  inp = make(data_dir, 1, seed=1)
  first = read_epoch(inp)
  second = [key_of(next(inp), 0) for _ in range(len(first) - 1)]
  assert len(first) == epoch_size(data_dir)
  assert len(set(first)) == len(first)
  assert set(second) <= set(first) and second != first[1:]
  other_seed = read_epoch(make(data_dir, 1, seed=2))
  assert other_seed != first and sorted(other_seed) == sorted(first)


@pytest.mark.parametrize("split", ["files", "records"])
def test_hosts_are_disjoint_and_cover_the_data(data_dir, tmp_path, split):
  files = train_files(data_dir)
  if split == "records":  # One file for two hosts: split by record.
    merged = str(tmp_path / "merged.tfrecord")
    with tf.io.TFRecordWriter(merged) as w:
      for r in tf.data.TFRecordDataset(tf.io.gfile.glob(files)):
        w.write(r.numpy())
    files = merged
  hosts = [
    make(data_dir, 1, files=files, seed=9, process_index=i, process_count=2) for i in range(2)
  ]
  assert [h.by_record for h in hosts] == [split == "records"] * 2
  keys = [read_epoch(h) for h in hosts]
  assert not set(keys[0]) & set(keys[1])
  assert len(keys[0]) + len(keys[1]) == epoch_size(data_dir)
  assert abs(len(keys[0]) - len(keys[1])) <= (1 if split == "records" else epoch_size(data_dir))


def test_dynamic_masking_follows_the_procedure(data_dir, tokenizer):
  static = make(data_dir, 32, seed=4, shuffle=False)
  dynamic = make(data_dir, 32, seed=4, shuffle=False, dynamic_masking=True, tokenizer=tokenizer)
  n_mask = n_kept = n_total = 0
  for _ in range(20):
    s, d = next(static), next(dynamic)
    for i in range(32):
      assert key_of(s, i) == key_of(d, i)  # Same example, same original tokens.
      length = int(d["input_mask"][i].sum())
      k = int(d["masked_lm_weights"][i].sum())
      assert k == min(P, max(1, round(length * 0.15)))
      positions = d["masked_lm_positions"][i][:k]
      original = d["input_ids"][i].copy()
      original[positions] = d["masked_lm_ids"][i][:k]
      assert (np.diff(positions) > 0).all()
      assert not np.isin(original[positions], [tokenizer.cls_id, tokenizer.sep_id]).any()
      n_total += k
      n_mask += int((d["input_ids"][i][positions] == tokenizer.mask_id).sum())
      n_kept += int((d["input_ids"][i][positions] == original[positions]).sum())
  sd = math.sqrt(n_total * 0.16)
  assert abs(n_mask - 0.8 * n_total) < 5 * sd
  assert abs(n_kept - 0.1 * n_total) < 5 * math.sqrt(n_total * 0.09)


def test_dynamic_masks_change_each_epoch(data_dir, tokenizer):
  n = epoch_size(data_dir)
  inp = make(data_dir, n, seed=4, shuffle=False, dynamic_masking=True, tokenizer=tokenizer)
  a, b = next(inp), next(inp)  # Epoch 0 and epoch 1, same order (no shuffle).
  assert all(key_of(a, i) == key_of(b, i) for i in range(0, n, 50))
  same = np.mean(
    [np.array_equal(a["masked_lm_positions"][i], b["masked_lm_positions"][i]) for i in range(n)]
  )
  assert same < 0.05


def test_dynamic_whole_word_masking_keeps_words_whole(data_dir, tokenizer):
  inp = make(data_dir, 64, seed=4, dynamic_masking=True, tokenizer=tokenizer, whole_word_mask=True)
  multi_piece = 0
  for _ in range(3):
    b = next(inp)
    for i in range(64):
      k = int(b["masked_lm_weights"][i].sum())
      positions = b["masked_lm_positions"][i][:k]
      masked = set(positions.tolist())
      original = b["input_ids"][i].copy()
      original[positions] = b["masked_lm_ids"][i][:k]
      tokens = tokenizer.convert_ids_to_tokens(original[: int(b["input_mask"][i].sum())].tolist())
      assert 1 <= k <= min(P, max(1, round(len(tokens) * 0.15)))
      for p, tok in enumerate(tokens):
        if tok.startswith("##") and p - 1 >= 0 and tokens[p - 1] not in ("[CLS]", "[SEP]"):
          assert (p in masked) == (p - 1 in masked), (
            tokens[max(p - 3, 0) : p + 2],
            p,
            sorted(masked),
          )
          multi_piece += p in masked
  assert multi_piece > 10


def test_eval_batches_fixed_order_padded(data_dir):
  files = str(data_dir / "seq_128" / "train-*.tfrecord")
  n = epoch_size(data_dir)
  batches = list(pipeline.eval_batches(files, 100, L, P, process_index=0, process_count=1))
  assert len(batches) == math.ceil(n / 100)
  weights = np.concatenate([b["example_weights"] for b in batches])
  assert weights.sum() == n and (weights[:n] == 1).all()
  last = batches[-1]
  assert (last["masked_lm_weights"][last["example_weights"] == 0] == 0).all()
  again = list(pipeline.eval_batches(files, 100, L, P, process_index=0, process_count=1))
  assert all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(batches, again))
  parts = [
    list(pipeline.eval_batches(files, 100, L, P, process_index=i, process_count=2))
    for i in range(2)
  ]
  counts = [sum(int(b["example_weights"].sum()) for b in p) for p in parts]
  assert sum(counts) == n and abs(counts[0] - counts[1]) <= 1


def test_truncated_shard_is_named(data_dir, tmp_path):
  src = sorted((data_dir / "seq_128").glob("train-*"))
  for f in src:
    shutil.copy(f, tmp_path / f.name)
  victim = tmp_path / src[1].name
  size = os.path.getsize(victim)
  with open(victim, "r+b") as f:
    f.truncate(size - 100)  # Cut inside the last record.
  with pytest.raises(ValueError, match=f"{victim.name}.*truncated"):
    tfrecord.check_record_framing(str(victim))
  inp = make(data_dir, 64, files=str(tmp_path / "train-*"), seed=0)
  with pytest.raises(ValueError, match=f"{victim.name}.*truncated"):
    for _ in range(200):
      next(inp)
  with pytest.raises(ValueError, match=f"{victim.name}.*truncated"):
    list(
      pipeline.eval_batches(str(tmp_path / "train-*"), 64, L, P, process_index=0, process_count=1)
    )


def test_empty_and_mismatched_inputs(data_dir, tmp_path):
  empty = tmp_path / "empty.tfrecord"
  empty.write_bytes(b"")
  with pytest.raises(ValueError, match="all empty"):
    make(data_dir, files=str(empty))
  with pytest.raises(ValueError, match="matches no file"):
    make(data_dir, files=str(tmp_path / "nothing-*.tfrecord"))
  # An empty shard among good ones is simply a shard with no records.
  inp = make(data_dir, 16, files=[train_files(data_dir), str(empty)])
  assert next(inp)["input_ids"].shape == (16, L)
  wrong = pipeline.PretrainInput(
    train_files(data_dir), 4, 512, 80, process_index=0, process_count=1
  )
  with pytest.raises(ValueError, match="max_seq_length=512"):
    next(wrong)
  with pytest.raises(ValueError, match="records for 3 hosts"):
    make(data_dir, files=str(empty), process_index=0, process_count=3)
  with pytest.raises(ValueError, match="needs the tokenizer"):
    make(data_dir, dynamic_masking=True)


def test_vectorised_whole_word_selection_matches_the_sequential_rule():

  def sequential(lengths, budget):  # google-research/bert's loop over shuffled candidates.
    taken, count = [], 0
    for n in lengths:
      if count >= budget:
        taken.append(False)
        continue
      fits = count + n <= budget
      taken.append(fits)
      count += n if fits else 0
    return taken

  rng = np.random.default_rng(0)
  for _ in range(200):
    lengths = rng.choice([1, 1, 1, 2, 2, 3, 4, 6], size=int(rng.integers(0, 40)))
    budget = int(rng.integers(1, 21))
    got = masking.greedy_take(lengths, budget)
    assert got.tolist() == sequential(lengths.tolist(), budget), (lengths, budget)


def test_corrupt_record_is_named(data_dir, tmp_path):
  src = sorted((data_dir / "seq_128").glob("train-*"))
  for f in src:
    shutil.copy(f, tmp_path / f.name)
  victim = tmp_path / src[2].name
  data = bytearray(victim.read_bytes())
  data[len(data) // 2] ^= 0xFF  # Flip a byte inside a record: the CRC no longer matches.
  victim.write_bytes(bytes(data))
  inp = make(data_dir, 64, files=str(tmp_path / "train-*"), seed=0)
  with pytest.raises(ValueError, match=f"{victim.name}.*corrupt"):
    for _ in range(200):
      next(inp)


def test_fast_stable_argsort_matches_numpys_stable_argsort():

  rng = np.random.default_rng(1)
  for length in (1, 2, 3, 128, 512, 513):
    for levels in (None, 4):  # Distinct scores; four levels (many ties).
      score = rng.random((7, length), np.float32)
      if levels:
        score = np.floor(score * levels) / levels
      score[:, ::5] = np.inf
      want = np.argsort(score, axis=1, kind="stable")
      np.testing.assert_array_equal(masking.stable_argsort(score), want)
      score[0, 0] = -1.0  # A negative score: the general sort.
      want = np.argsort(score, axis=1, kind="stable")
      np.testing.assert_array_equal(masking.stable_argsort(score), want)


@pytest.mark.parametrize("position", [L, -1])
def test_static_mask_outside_the_sequence_is_named(tmp_path, tokenizer, position):
  """A record whose masked_lm_positions point outside the sequence: dynamic masking (which
  restores the static masks first) refuses it with the files and the position, the reader's
  position unchanged."""
  n = 4
  path = str(tmp_path / "bad.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for row in range(n):
      ids = [tokenizer.cls_id] + [2000 + i for i in range(8)] + [tokenizer.sep_id]
      ints = {
        "input_ids": ids + [0] * (L - 10),
        "input_mask": [1] * 10 + [0] * (L - 10),
        "segment_ids": [0] * L,
        "masked_lm_positions": [3, position if row == 2 else 4] + [0] * (P - 2),
        "masked_lm_ids": [2000] * 2 + [0] * (P - 2),
        "next_sentence_labels": [0],
      }
      feature = {
        k: tf.train.Feature(int64_list=tf.train.Int64List(value=v)) for k, v in ints.items()
      }
      feature["masked_lm_weights"] = tf.train.Feature(
        float_list=tf.train.FloatList(value=[1.0, 1.0] + [0.0] * (P - 2))
      )
      writer.write(
        tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
      )
  inp = pipeline.PretrainInput(
    path,
    n,
    L,
    P,
    seed=0,
    shuffle=False,
    process_index=0,
    process_count=1,
    dynamic_masking=True,
    tokenizer=tokenizer,
  )
  with pytest.raises(ValueError, match=rf"bad\.tfrecord.*holds {position} .*outside \[0, {L}\)"):
    next(inp)
  assert inp.get_state() == {"epoch": 0, "position": 0}


def test_dynamic_masking_with_more_prediction_slots_than_positions(tokenizer):
  """Sequences of 8 with 20 prediction slots: every slot array keeps its 20 columns, and the six
  maskable tokens are all chosen (the budget, round(8 x 0.9) = 7, exceeds them)."""
  from bert_jax.data import dynamic_masking, masking

  rows, length, slots = 3, 8, 20
  ids = np.full((rows, length), 2000, np.int32)
  ids[:, 0], ids[:, -1] = tokenizer.cls_id, tokenizer.sep_id
  batch = {
    "input_ids": ids,
    "input_mask": np.ones((rows, length), np.int32),
    "masked_lm_positions": np.zeros((rows, slots), np.int32),
    "masked_lm_ids": np.zeros((rows, slots), np.int32),
    "masked_lm_weights": np.zeros((rows, slots), np.float32),
  }
  spec = masking.MaskingSpec.from_tokenizer(tokenizer)
  out = dynamic_masking.DynamicMasker(spec, 0.9, slots, False)(batch, [1, 2])
  for key in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
    assert out[key].shape == (rows, slots), key
  np.testing.assert_array_equal(out["masked_lm_weights"].sum(axis=1), [6] * rows)
  np.testing.assert_array_equal(out["masked_lm_positions"][:, :6], [[1, 2, 3, 4, 5, 6]] * rows)
  np.testing.assert_array_equal(out["masked_lm_ids"][:, :6], 2000)
