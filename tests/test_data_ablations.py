"""Data for the paper's pre-training ablations: mask rates (Table 8: MASK / SAME / RND), packed
single-segment data without NSP pairs (Table 5: "No NSP", "LTR & No NSP"), the pair-data check
and unmasked reading for the left-to-right LM.

Statistics are checked against the rates the procedure implies with binomial bounds of 4.5
standard deviations (exactly where a rate is 0 or 1); the default static rates against a
verbatim copy of the previous (80/10/10-only) code; dynamic masks, given their random numbers,
against google-research/bert's procedure written out here.
"""

import json
import math
import random

import numpy as np
import pytest

from bert_jax.data import (
  batch_instances,
  corpus,
  dynamic_masking,
  examples,
  generate,
  masking,
  pipeline,
  tfrecord,
)

SIGMAS = 4.5
L, P = 128, 20
RATES = [(0.8, 0.1, 0.1), (1.0, 0.0, 0.0), (0.8, 0.0, 0.2), (0.0, 0.0, 1.0), (0.5, 0.3, 0.2)]


def assert_binomial(successes: int, trials: int, p: float, what: str) -> None:
  """Within SIGMAS standard deviations (+1 for small counts); exact when p is 0 or 1."""
  if p <= 0.0 or p >= 1.0:
    assert successes == round(trials * p), (what, successes, trials, p)
    return
  sd = math.sqrt(trials * p * (1 - p))
  assert abs(successes - trials * p) <= SIGMAS * sd + 1, (what, successes, trials, p)


def budget(length: int, prob: float = 0.15, max_predictions: int = P) -> int:
  # The paper/original: min(max_predictions_per_seq, max(1, round(len(tokens) * prob))).
  return min(max_predictions, max(1, int(round(length * prob))))


ENGINES = generate.ENGINES  # "original": examples; "fast": batch_instances


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
  from bert_jax.tokenize import load_tokenizer

  return load_tokenizer(minilm_dir / "vocab.txt", do_lower_case=True)


@pytest.fixture(scope="module")
def spec(tokenizer):
  return masking.MaskingSpec.from_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def documents(shared_data, tokenizer):
  """Tokenized documents: the BERT sample text and a Shakespeare play."""
  pretrain = shared_data / "pretrain"
  stats = {}
  docs = list(corpus.read_original_format(str(pretrain / "bert_sample_text.txt"), stats))
  docs += list(corpus.read_plain_text(str(pretrain / "shakespeare" / "tempest_gut.txt"), stats))
  tokenized = [[ids for ids in tokenizer.encode_batch(d) if ids] for d in docs]
  return [d for d in tokenized if d]


@pytest.fixture(scope="module")
def sequences(documents, spec):
  """[CLS] tokens [SEP] sequences of random lengths cut from the documents' token stream."""
  stream = [t for d in documents for s in d for t in s]
  rng = random.Random(0)
  out, at = [], 0
  while len(out) < 900:
    n = rng.randint(40, L - 2)
    if at + n > len(stream):
      at = 0
    out.append([spec.cls_id] + stream[at : at + n] + [spec.sep_id])
    at += n
  return out


def words_of(ids: list[int], spec) -> list[list[int]]:
  """Independent grouping: a continuation piece joins the word of the token before it."""
  words: list[list[int]] = []
  for i, t in enumerate(ids):
    if t in (spec.cls_id, spec.sep_id, spec.pad_id):
      continue
    if spec.continuation_V[t] and words and words[-1][-1] == i - 1:
      words[-1].append(i)
    else:
      words.append([i])
  return words


def classify(original, masked, positions, spec, counts):
  for p in positions:
    if masked[p] == spec.mask_id:
      counts["mask"] += 1
    elif masked[p] == original[p]:
      counts["same"] += 1
    else:
      counts["random"] += 1
      assert 0 <= masked[p] < spec.vocab_size
      assert masked[p] not in (spec.cls_id, spec.sep_id, spec.mask_id, spec.pad_id)


def check_rates(counts, rates, spec):
  """A random replacement equals the original with p = 1/|R| (|R| ~ 30k): it is seen as "same"."""
  n = sum(counts.values())
  r = 1.0 / len(spec.replacement_ids)
  mask, same, rnd = rates
  assert_binomial(counts["mask"], n, mask, "mask")
  assert_binomial(counts["same"], n, same + rnd * r, "same")
  assert_binomial(counts["random"], n, rnd * (1 - r), "random")


# -- MaskRates --------------------------------------------------------------------------------------


def test_mask_rates_validation():
  assert masking.MaskRates() == masking.MaskRates(0.8, 0.1, 0.1)
  with pytest.raises(ValueError, match=r"sum to 1: mask=0\.8 \+ same=0\.1 \+ random=0\.2 = 1\.1"):
    masking.MaskRates(0.8, 0.1, 0.2)
  with pytest.raises(ValueError, match=r"mask rate mask must be a number in \[0, 1\], got 1.1"):
    masking.MaskRates(1.1, 0.0, -0.1)
  with pytest.raises(ValueError, match=r"mask rate random must be .*got -0.1"):
    masking.MaskRates(0.9, 0.2, -0.1)
  with pytest.raises(ValueError, match="mask=0.5"):
    masking.MaskRates.parse("0.5,0.1,0.1")
  assert masking.MaskRates.parse("1,0,0") == masking.MaskRates(1.0, 0.0, 0.0)
  with pytest.raises(ValueError, match="three numbers"):
    masking.MaskRates.parse((0.9, 0.1))
  with pytest.raises(ValueError, match="mask rates must sum to 1"):
    generate.GenerationConfig(tokenizer_path="x", mask_rates=(0.8, 0.1, 0.2))
  assert generate.GenerationConfig(tokenizer_path="x", mask_rates=[1, 0, 0]).mask_rates == (
    1.0,
    0.0,
    0.0,
  )


# -- static masking ---------------------------------------------------------------------------------


def old_mask_tokens(ids, spec, masked_lm_prob, max_predictions_per_seq, whole_word, rng):
  """Verbatim copy of mask_tokens before MaskRates (80/10/10 only)."""
  groups = masking.candidate_groups(ids, spec, whole_word)
  rng.shuffle(groups)
  budget = masking.num_to_predict(len(ids), masked_lm_prob, max_predictions_per_seq)
  output = list(ids)
  chosen: list[int] = []
  for group in groups:
    if len(chosen) >= budget:
      break
    if len(chosen) + len(group) > budget:
      continue
    for index in group:
      if rng.random() < 0.8:
        output[index] = spec.mask_id
      elif rng.random() < 0.5:
        pass  # Keep the original token.
      else:
        output[index] = int(spec.replacement_ids[rng.randrange(len(spec.replacement_ids))])
      chosen.append(index)
  chosen.sort()
  return output, chosen, [ids[i] for i in chosen]


def test_default_static_masks_are_the_previous_ones(sequences, documents, spec, monkeypatch, ww):
  whole_word = ww
  new, old = random.Random(5), random.Random(5)
  for ids in sequences[:300]:
    got = masking.mask_tokens(ids, spec, 0.15, P, whole_word, new)
    assert got == old_mask_tokens(ids, spec, 0.15, P, whole_word, old)
  assert new.random() == old.random()
  # Whole pair instances too (the generator's stream is the same call for call).
  made = examples.instances_from_documents(
    documents[:40], L, 2, 0.1, 0.15, P, spec, whole_word, random.Random(9)
  )

  def old_with_default_rates(*args):
    assert args[6:] in ((), (masking.MaskRates(),))
    return old_mask_tokens(*args[:6])

  monkeypatch.setattr(masking, "mask_tokens", old_with_default_rates)
  before = examples.instances_from_documents(
    documents[:40], L, 2, 0.1, 0.15, P, spec, whole_word, random.Random(9)
  )
  assert made == before


@pytest.fixture(params=[False, True], ids=["pieces", "whole_word"])
def ww(request):
  return request.param


@pytest.mark.parametrize("rates", RATES)
def test_static_mask_rates(sequences, spec, rates, ww):
  rng = random.Random(hash((rates, ww)) & 0xFFFF)
  counts = {"mask": 0, "same": 0, "random": 0}
  for ids in sequences:
    masked, positions, labels = masking.mask_tokens(
      ids, spec, 0.15, P, ww, rng, masking.MaskRates(*rates)
    )
    k = budget(len(ids))
    assert positions == sorted(set(positions))
    assert labels == [ids[p] for p in positions]
    assert not {0, len(ids) - 1} & set(positions)
    if ww:
      assert 1 <= len(positions) <= k
      chosen = set(positions)
      for word in words_of(ids, spec):
        assert all(i in chosen for i in word) or not any(i in chosen for i in word)
    else:
      assert len(positions) == k
    untouched = set(range(len(ids))) - set(positions)
    assert all(masked[i] == ids[i] for i in untouched)
    classify(ids, masked, positions, spec, counts)
  assert sum(counts.values()) > 10_000
  check_rates(counts, rates, spec)


# -- dynamic masking --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def features(sequences):
  """The sequences as parsed, unmasked, padded features (int32 numpy, [N, L])."""
  n = len(sequences)
  ids = np.zeros([n, L], np.int32)
  for i, s in enumerate(sequences):
    ids[i, : len(s)] = s
  return {
    "input_ids": ids,
    "input_mask": (ids != 0).astype(np.int32),
    "segment_ids": np.zeros([n, L], np.int32),
    "masked_lm_positions": np.zeros([n, P], np.int32),
    "masked_lm_ids": np.zeros([n, P], np.int32),
    "masked_lm_weights": np.zeros([n, P], np.float32),
    "next_sentence_labels": np.zeros([n], np.int32),
  }


def run_masker(masker, features) -> dict:
  """The whole set as one batch (the masker works on batches)."""
  return masker(features, [17, 0])


def reference_dynamic_mask(ids, spec, randoms, i, rates, whole_word):
  """google-research/bert's create_masked_lm_predictions for row i, with its shuffle replaced by
  the order of the drawn scores (a word by its first piece) and its rng by the drawn r1, r2 and
  replacement tokens of the prediction slots (the chosen positions in increasing order)."""
  if whole_word:
    groups = words_of(ids, spec)
  else:
    groups = [[j] for j, t in enumerate(ids) if t not in (spec.cls_id, spec.sep_id, spec.pad_id)]
  groups.sort(key=lambda g: randoms["score"][i][g[0]])
  k = budget(len(ids))
  chosen = []
  for group in groups:
    if len(chosen) >= k:
      break
    if len(chosen) + len(group) > k:
      continue
    chosen.extend(group)
  chosen.sort()
  output = list(ids)
  for slot, j in enumerate(chosen):
    if randoms["r1"][i][slot] < np.float32(rates.mask):
      output[j] = spec.mask_id
    elif randoms["r2"][i][slot] >= np.float32(rates.same_share):
      output[j] = int(randoms["replacement"][i][slot])
  return output, chosen, [ids[j] for j in chosen]


@pytest.mark.parametrize("tied", [False, True], ids=["drawn", "tied"])
@pytest.mark.parametrize("rates", [RATES[0], RATES[4]])
def test_dynamic_masks_follow_the_reference_procedure(features, sequences, spec, rates, ww, tied):
  rates = masking.MaskRates(*rates)
  masker = dynamic_masking.DynamicMasker(spec, 0.15, P, ww, rates)
  randoms = masker.draw(features["input_ids"].shape, [23, 5])
  if tied:  # Four distinct scores: candidates of equal score are taken in position order.
    randoms["score"] = np.floor(randoms["score"] * 4) / 4
  out = masker.apply(features, randoms)
  for i, ids in enumerate(sequences):
    masked, positions, labels = reference_dynamic_mask(ids, spec, randoms, i, rates, ww)
    k = len(positions)
    assert out["input_ids"][i][: len(ids)].tolist() == masked
    assert (out["input_ids"][i][len(ids) :] == 0).all()
    assert out["masked_lm_positions"][i].tolist() == positions + [0] * (P - k)
    assert out["masked_lm_ids"][i].tolist() == labels + [0] * (P - k)
    assert out["masked_lm_weights"][i].tolist() == [1.0] * k + [0.0] * (P - k)
  # Statically masked input is restored first: the same batch masked by the generator's
  # procedure gives exactly the same output.
  static = {k: v.copy() for k, v in features.items()}
  rng = random.Random(3)
  for i, ids in enumerate(sequences):
    masked, positions, labels = masking.mask_tokens(ids, spec, 0.15, P, ww, rng)
    static["input_ids"][i][: len(ids)] = masked
    static["masked_lm_positions"][i][: len(positions)] = positions
    static["masked_lm_ids"][i][: len(positions)] = labels
    static["masked_lm_weights"][i][: len(positions)] = 1.0
  assert (static["input_ids"] != features["input_ids"]).any()
  again = masker.apply(static, randoms)
  for key in out:
    np.testing.assert_array_equal(again[key], out[key], err_msg=key)


@pytest.mark.parametrize("rates", RATES)
def test_dynamic_mask_rates(features, sequences, spec, rates, ww):
  masker = dynamic_masking.DynamicMasker(spec, 0.15, P, ww, masking.MaskRates(*rates))
  out = run_masker(masker, features)
  counts = {"mask": 0, "same": 0, "random": 0}
  for i, ids in enumerate(sequences):
    k = int(out["masked_lm_weights"][i].sum())
    positions = out["masked_lm_positions"][i][:k].tolist()
    assert positions == sorted(set(positions))
    assert out["masked_lm_ids"][i][:k].tolist() == [ids[p] for p in positions]
    assert not {0, len(ids) - 1} & set(positions)
    if ww:
      assert 1 <= k <= budget(len(ids))
      chosen = set(positions)
      for word in words_of(ids, spec):
        assert all(j in chosen for j in word) or not any(j in chosen for j in word)
    else:
      assert k == budget(len(ids))
    masked = out["input_ids"][i].tolist()
    untouched = set(range(L)) - set(positions)
    assert all(masked[j] == features["input_ids"][i][j] for j in untouched)
    classify(ids, masked, positions, spec, counts)
  assert sum(counts.values()) > 10_000
  check_rates(counts, rates, spec)


# -- packed data (no sentence pairs) ----------------------------------------------------------------


def expected_items(documents, sep_id):
  """The stream of units: ("s", tokens) per sentence, ("d", [sep]) between documents."""
  items = []
  for d, document in enumerate(documents):
    if d:
      items.append(("d", [sep_id]))
    items.extend(("s", sentence) for sentence in document)
  return items


def restored(inst):
  ids = list(inst.input_ids)
  for p, label in zip(inst.masked_positions, inst.masked_ids):
    ids[p] = label
  return ids


def check_packed(instances, documents, spec, max_seq_length, max_predictions, whole_word):
  """The segments, concatenated, are the documents' stream with separators between documents (a
  separator is left out only at a segment start); a segment ends only when the next unit does
  not fit its target (a piece of an overlong sentence fills it exactly)."""
  for inst in instances:
    ids = restored(inst)
    assert inst.segment_ids == [0] * len(ids) and not inst.is_random_next
    assert ids[0] == spec.cls_id and ids[-1] == spec.sep_id and 3 <= len(ids) <= max_seq_length
    assert len(ids) - 2 <= inst.target_length
    if inst.short_target:
      assert 2 <= inst.target_length <= max_seq_length - 2
    else:
      assert inst.target_length == max_seq_length - 2
    k = budget(len(ids), max_predictions=max_predictions)
    assert len(inst.masked_positions) <= k if whole_word else len(inst.masked_positions) == k
  items = expected_items(documents, spec.sep_id)
  segments = [restored(inst)[1:-1] for inst in instances]
  item, offset = 0, 0  # Where the stream is: unit index, tokens of it already seen.
  for s, segment in enumerate(segments):
    at = 0
    while at < len(segment):
      kind, tokens = items[item]
      if kind == "d":
        assert segment[at] == spec.sep_id and at > 0, (s, at)  # Never starts a segment.
        item, at = item + 1, at + 1
        continue
      n = min(len(tokens) - offset, len(segment) - at)
      assert segment[at : at + n] == tokens[offset : offset + n], (s, at)
      at += n
      offset += n
      if offset == len(tokens):
        item, offset = item + 1, 0
      else:  # The segment ends inside a sentence: an overlong sentence's piece fills it whole.
        assert at == len(segment) == instances[s].target_length and n == len(segment), s
    if item == len(items):
      assert s == len(segments) - 1
      break
    kind, tokens = items[item]
    if offset == 0:
      if kind == "d":  # Left out: a full segment ends at the document's end.
        assert len(segment) == instances[s].target_length
        item += 1
      else:  # The whole next sentence did not fit what was left.
        assert len(segment) + len(tokens) > instances[s].target_length
  assert item == len(items) and offset == 0


def pack(engine, docs, L, short_seq_prob, P, ww, seed, spec):
  """One pass packing `docs` in order, by either engine."""
  if engine == "original":
    rng = random.Random(seed)
    return examples.packed_instances(docs, L, short_seq_prob, 0.15, P, spec, ww, rng)
  arrays = batch_instances.instances_from_documents(
    docs, L, 1, short_seq_prob, 0.15, P, spec, ww, seed, sentence_pairs=False,
    shuffle=False,
  )  # fmt: skip
  return arrays.instances()


@pytest.mark.parametrize("engine", ENGINES)
def test_packed_segments_reproduce_the_stream(engine, documents, spec, ww):
  assert all(spec.sep_id not in s for d in documents for s in d)
  docs = documents[:25]
  instances = pack(engine, docs, 64, 0.1, 10, ww, 4, spec)
  assert len(instances) > 200
  check_packed(instances, docs, spec, 64, 10, ww)
  fill = [(len(i.input_ids) - 2) / i.target_length for i in instances[:-1]]
  assert np.mean(fill) > 0.8


@pytest.mark.parametrize("engine", ENGINES)
def test_packed_overlong_and_tiny_sentences(engine, spec):
  docs = [
    [[1000 + i for i in range(150)]],  # longer than two segments
    [[2000, 2001], [2100 + i for i in range(40)], [2200]],
    [[3000 + i for i in range(61)]],  # exactly fills a segment of 62 (max 64)
    [[4000 + i for i in range(7)], [4100 + i for i in range(62)], [4200 + i for i in range(63)]],
  ]
  for seed in range(30):
    instances = pack(engine, docs, 64, 0.3, 10, False, seed, spec)
    check_packed(instances, docs, spec, 64, 10, False)


@pytest.mark.parametrize("engine", ENGINES)
def test_packed_short_targets(engine, documents, spec):
  instances = []
  for seed in range(3):
    one_pass = pack(engine, documents, 32, 0.1, 5, False, 8 + seed, spec)
    check_packed(one_pass, documents, spec, 32, 5, False)
    instances += one_pass
  assert len(instances) > 3000
  # Each segment draws its own target: short with probability short_seq_prob, then uniform.
  assert_binomial(sum(i.short_target for i in instances), len(instances), 0.1, "short targets")
  short = [i.target_length for i in instances if i.short_target]
  assert min(short) == 2 and max(short) == 30 and np.mean(short) == pytest.approx(16, abs=2)


def test_packed_passes_and_masks(documents, spec):
  docs = documents[:20]
  made = examples.instances_from_documents(
    docs, 64, 3, 0.0, 0.15, 10, spec, False, random.Random(2), sentence_pairs=False
  )
  one = examples.instances_from_documents(
    docs, 64, 1, 0.0, 0.15, 10, spec, False, random.Random(2), sentence_pairs=False
  )
  assert len(made) == 3 * len(one)  # No short targets: every pass packs the same segments...
  keys = [tuple(restored(i)) for i in made]
  assert sorted(keys) == sorted(k for k in [tuple(restored(i)) for i in one] for _ in range(3))
  by_key = {}
  for inst in made:
    by_key.setdefault(tuple(restored(inst)), set()).add(tuple(inst.masked_positions))
  assert np.mean([len(v) > 1 for v in by_key.values()]) > 0.9  # ...with fresh masks.
  counts = {"mask": 0, "same": 0, "random": 0}
  rates = (0.8, 0.0, 0.2)
  for inst in examples.instances_from_documents(
    docs, 64, 2, 0.1, 0.15, 10, spec, True, random.Random(3), masking.MaskRates(*rates), False
  ):
    classify(restored(inst), inst.input_ids, inst.masked_positions, spec, counts)
  check_rates(counts, rates, spec)


# -- generated files, the pair check, unmasked reading ----------------------------------------------


@pytest.fixture(scope="module")
def generated(tmp_path_factory, shared_data, minilm_dir):
  """Pair data (default settings) and packed data with other rates, from the same texts."""
  out = tmp_path_factory.mktemp("ablation_data")
  pretrain = shared_data / "pretrain"
  inputs = [
    str(pretrain / "bert_sample_text.txt"),
    str(pretrain / "shakespeare" / "tempest_gut.txt"),
  ]
  base = dict(
    tokenizer_path=str(minilm_dir / "vocab.txt"),
    do_lower_case=True,
    input_format="text",
    max_seq_lengths=(L,),
    max_predictions_per_seq=(P,),
    dupe_factor=1,
    random_seed=3,
    eval_fraction=0.2,
  )
  results = {}
  for name, extra in (
    ("pairs", {}),
    ("packed", dict(sentence_pairs=False, mask_rates=(0.8, 0.0, 0.2))),
    ("packed_fast", dict(sentence_pairs=False, mask_rates=(0.8, 0.0, 0.2), engine="fast")),
  ):
    config = generate.GenerationConfig(**base, **extra)
    results[name] = generate.generate(
      inputs, str(out / name), config, num_workers=1, progress=False
    )
  results["inputs"] = inputs
  return out, results


def files(out, name, split="train"):
  return str(out / name / f"seq_{L}" / f"{split}-*.tfrecord")


def test_generated_configs_and_summaries(generated, minilm_dir):
  out, results = generated
  pairs = json.loads((out / "pairs" / "generation_config.json").read_text())
  packed = json.loads((out / "packed" / "generation_config.json").read_text())
  # New settings are stored only away from their defaults (older directories stay valid).
  assert "mask_rates" not in pairs and "sentence_pairs" not in pairs
  assert packed["mask_rates"] == [0.8, 0.0, 0.2] and packed["sentence_pairs"] is False
  assert set(packed) - set(pairs) == {"mask_rates", "sentence_pairs"}
  assert "NSP random-next" in generate.summary_line(results["pairs"]["stats"])
  line = generate.summary_line(results["packed"]["stats"])
  assert "NSP random-next" not in line and "no NSP" in line
  # The same directory refuses other rates.
  config = generate.GenerationConfig(
    tokenizer_path=str(minilm_dir / "vocab.txt"),
    do_lower_case=True,
    input_format="text",
    max_seq_lengths=(L,),
    max_predictions_per_seq=(P,),
    dupe_factor=1,
    random_seed=3,
    eval_fraction=0.2,
    sentence_pairs=False,
    mask_rates=(1.0, 0.0, 0.0),
  )
  with pytest.raises(ValueError, match=r"different settings \(mask_rates\)"):
    generate.generate(results["inputs"], str(out / "packed"), config, progress=False, num_workers=1)


def test_records_have_sentence_pairs(generated):
  out, _ = generated
  assert tfrecord.records_have_sentence_pairs(files(out, "pairs"), L, P)
  assert tfrecord.records_have_sentence_pairs(files(out, "pairs", "eval"), L, P, max_records=1)
  assert not tfrecord.records_have_sentence_pairs(files(out, "packed"), L, P)
  assert not tfrecord.records_have_sentence_pairs(files(out, "packed", "eval"), L, P)
  assert not tfrecord.records_have_sentence_pairs(files(out, "packed_fast"), L, P)
  with pytest.raises(ValueError, match="matches no file"):
    tfrecord.records_have_sentence_pairs(str(out / "nothing-*"), L, P)


def all_records(pattern):
  batches = pipeline.eval_batches(pattern, 256, L, P, process_index=0, process_count=1)
  merged = {}
  for b in batches:
    keep = b["example_weights"] > 0
    for k, v in b.items():
      merged.setdefault(k, []).append(v[keep])
  return {k: np.concatenate(v) for k, v in merged.items()}


@pytest.mark.parametrize("name", ["packed", "packed_fast"])
def test_packed_records(name, generated, spec):
  out, results = generated
  data = all_records(files(out, name))
  n = len(data["input_ids"])
  stats = results[name]["stats"]["per_length"][str(L)]
  assert n == stats["train_examples"] > 50
  assert stats["packed"] == stats["examples"] and stats["random_next"] == 0
  assert stats["masked"] / stats["maskable"] == pytest.approx(0.15, abs=0.01)
  assert (data["segment_ids"] == 0).all() and (data["next_sentence_labels"] == 0).all()
  lengths = data["input_mask"].sum(1)
  assert (data["input_ids"][np.arange(n), lengths - 1] == spec.sep_id).all()
  assert (data["input_ids"][:, 0] == spec.cls_id).all()
  assert np.mean(lengths) > 0.75 * L  # Greedily filled segments (short targets: ~10%).


def test_unmask_reads_the_original_text(generated):
  out, _ = generated
  pattern = files(out, "pairs")
  plain = pipeline.PretrainInput(pattern, 32, L, P, process_index=0, process_count=1, seed=1)
  unmasked = pipeline.PretrainInput(
    pattern, 32, L, P, process_index=0, process_count=1, seed=1, unmask=True
  )
  masked_somewhere = 0
  for _ in range(4):
    a, b = next(plain), next(unmasked)
    original = a["input_ids"].copy()
    for i in range(32):  # Independent restore: position by position.
      for p, label, w in zip(
        a["masked_lm_positions"][i], a["masked_lm_ids"][i], a["masked_lm_weights"][i]
      ):
        if w > 0:
          original[i, p] = label
    masked_somewhere += int((original != a["input_ids"]).sum())
    np.testing.assert_array_equal(b["input_ids"], original)
    for k in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
      assert not b[k].any(), k
    for k in ("input_mask", "segment_ids", "next_sentence_labels"):
      np.testing.assert_array_equal(a[k], b[k])
  assert masked_somewhere > 100
  evals = list(
    pipeline.eval_batches(pattern, 64, L, P, process_index=0, process_count=1, unmask=True)
  )
  ref = list(pipeline.eval_batches(pattern, 64, L, P, process_index=0, process_count=1))
  for b, a in zip(evals, ref):
    np.testing.assert_array_equal(b["input_ids"], dynamic_masking.unmask(a)["input_ids"])
    assert not b["masked_lm_weights"].any() and not b["masked_lm_positions"].any()
    np.testing.assert_array_equal(b["example_weights"], a["example_weights"])
  with pytest.raises(ValueError, match="exclude each other"):
    pipeline.PretrainInput(
      pattern, 4, L, P, process_index=0, process_count=1, unmask=True, dynamic_masking=True
    )


@pytest.mark.parametrize("mode", ["unmask", "dynamic_rates"])
def test_resume_is_exact(generated, tokenizer, mode):
  out, _ = generated
  pattern = files(out, "packed")
  kw = (
    dict(unmask=True)
    if mode == "unmask"
    else dict(dynamic_masking=True, tokenizer=tokenizer, mask_rates=(0.8, 0.0, 0.2))
  )

  def make():
    return pipeline.PretrainInput(
      pattern, 48, L, P, process_index=0, process_count=1, seed=6, shuffle_buffer_size=64, **kw
    )

  reference = make()
  states, batches = [], []
  for _ in range(6):
    states.append(reference.get_state())
    batches.append(next(reference))
  for at in (1, 4):
    resumed = make()
    resumed.set_state(json.loads(json.dumps(states[at])))
    for offset in range(2):
      got = next(resumed)
      for k in got:
        np.testing.assert_array_equal(got[k], batches[at + offset][k], err_msg=k)
  if mode == "dynamic_rates":
    assert reference.masker.rates == masking.MaskRates(0.8, 0.0, 0.2)
    b = batches[0]
    rows, slots = np.nonzero(b["masked_lm_weights"] > 0)
    chosen = b["input_ids"][rows, b["masked_lm_positions"][rows, slots]]
    # same = 0: every chosen token is [MASK] or a random one (equal to the original ~1/|R|).
    assert np.mean(chosen == b["masked_lm_ids"][rows, slots]) < 0.01
