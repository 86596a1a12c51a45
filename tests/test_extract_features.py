"""Feature extraction against Hugging Face (MiniLM) and google-research/bert's output format.

References: ``transformers``' BertTokenizer (tokens, segment ids, longest-first truncation of
pairs, as the original's ``_truncate_seq_pair``) and PyTorch BertModel hidden states; the
original's rounding ``round(float(x), 6)`` and its JSON layout.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers
from float_tolerance import float64_bound, sum_bound

from bert_jax.tools import features

LINES = [
  "The quick brown fox jumps over the lazy dog.",
  "Who was Jim Henson? ||| Jim Henson was a puppeteer.",
  "Unbelievably, tokenization splits rare words like perplexingly.",
  "a ||| b",
]


@pytest.fixture(scope="module")
def hf_minilm(minilm_dir):
  return (
    transformers.BertTokenizer.from_pretrained(minilm_dir),
    transformers.BertModel.from_pretrained(minilm_dir).eval(),
  )


def hf_reference(hf_minilm, line, layers, max_seq_length=128, float64=False):
  tok, model = hf_minilm
  model = model.to(torch.float64 if float64 else torch.float32)
  a, _, b = line.partition(" ||| ")
  enc = tok(
    a, b or None, truncation="longest_first", max_length=max_seq_length, return_tensors="pt"
  )
  with torch.no_grad():
    hidden = model(**enc, output_hidden_states=True).hidden_states[1:]  # encoder layers only
  tokens = tok.convert_ids_to_tokens(enc["input_ids"][0])
  return tokens, {i: hidden[i][0].numpy() for i in layers}


def test_output_matches_hf_in_the_original_layout(minilm_dir, hf_minilm, tmp_path):
  inp = tmp_path / "in.txt"
  inp.write_text("\n".join(LINES) + "\n", encoding="utf-8")
  out = tmp_path / "out.jsonl"
  layers = (-1, -2, 0)
  summary = features.extract_features(
    str(inp), str(out), str(minilm_dir), layers=layers, batch_size=3
  )
  assert summary["num_lines"] == len(LINES) and summary["checkpoint_source"] == "huggingface"
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["linex_index"] for r in rows] == list(range(len(LINES)))
  for row, line in zip(rows, LINES):
    assert list(row) == ["linex_index", "features"]
    tokens, ref = hf_reference(hf_minilm, line, layers)
    _, ref64 = hf_reference(hf_minilm, line, layers, float64=True)
    assert [f["token"] for f in row["features"]] == tokens
    for t, feat in enumerate(row["features"]):
      assert list(feat) == ["token", "layers"]
      assert [layer["index"] for layer in feat["layers"]] == list(layers)
      for layer in feat["layers"]:
        assert list(layer) == ["index", "values"]
        # Off Hugging Face's float64 by at most 4x its float32's error (float_tolerance, rule 1),
        # plus the written values' rounding to 6 decimals.
        want64, want32 = ref64[layer["index"]][t], ref[layer["index"]][t]
        bound = float64_bound(np.abs(want32 - want64).max(), np.abs(want64).max()) + 5e-7
        np.testing.assert_allclose(layer["values"], want64, atol=bound, rtol=0)


def test_pairs_are_truncated_longest_first(minilm_dir, hf_minilm):
  from bert_jax.formats import load_pretrained

  pre = load_pretrained(minilm_dir, task="encoder")
  hf_tok = hf_minilm[0]
  long_a = "word " * 30
  examples = [
    features.InputExample(0, long_a.strip(), "a short second segment here"),
    features.InputExample(1, "short", "the second one is " + "much " * 20 + "longer"),
    features.InputExample(2, long_a.strip()),
  ]
  feats = features.convert_examples(examples, pre.tokenizer, max_seq_length=16)
  for e, f in zip(examples, feats):
    enc = hf_tok(e.text_a, e.text_b, truncation="longest_first", max_length=16)
    assert f.input_ids == enc["input_ids"]
    assert f.segment_ids == enc["token_type_ids"]
    assert f.tokens == hf_tok.convert_ids_to_tokens(enc["input_ids"])
    assert f.truncated


def test_rounding_is_the_originals():
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.standard_normal(3000) * s for s in (1e-6, 1e-4, 0.3, 5.0, 4e3)])
  x = np.concatenate([x, [0.0, -0.0, -1e-9, 5e-7, 1.5e-6, 2.5e-6, -0.0000005, 0.1234565]])
  x = x.astype(np.float32)
  ours = features.round_like_original(x)
  ref = [round(float(v), 6) for v in x]
  assert json.dumps(ours) == json.dumps(ref)  # same floats, same text (incl. -0.0, 5e-07)


def test_one_compiled_program_per_length_bucket(minilm_dir):
  from bert_jax.formats import load_pretrained

  pre = load_pretrained(minilm_dir, task="encoder")
  texts = [" ".join(["word"] * n) for n in range(1, 20)]
  feats = features.convert_examples(
    [features.InputExample(i, t) for i, t in enumerate(texts)], pre.tokenizer, max_seq_length=64
  )
  extractor = features.FeatureExtractor(
    pre.params, pre.config, layers=(-1,), max_seq_length=64, batch_size=4
  )
  out = list(extractor(feats, window=2))
  assert [f.unique_id for f, _ in out] == list(range(len(texts)))  # input order kept
  assert all(v.shape == (1, len(f.tokens), 384) for f, v in out)
  buckets = features.bucket_lengths(64)  # each row is padded to the smallest bucket holding it
  used = {min(b for b in buckets if b >= len(f.input_ids)) for f in feats}
  # pylint: disable=protected-access
  assert extractor._run._cache_size() <= len(used) <= len(features.bucket_lengths(64))


def test_bad_input_names_file_and_line(tmp_path):
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"fine line\nsecond \xff\xfe line\n")
  with pytest.raises(ValueError, match=r"bad\.txt:2: not valid UTF-8"):
    features.read_examples(bad)
  empty = tmp_path / "empty_line.txt"
  empty.write_text("one\n\nthree\n")
  with pytest.raises(ValueError, match=r"empty_line\.txt:2: empty line"):
    features.read_examples(empty)
  examples = features.read_examples(empty, allow_empty_lines=True)
  assert [(e.unique_id, e.text_a) for e in examples] == [(0, "one"), (1, ""), (2, "three")]
  (tmp_path / "nothing.txt").write_text("")
  with pytest.raises(ValueError, match="nothing.txt: the input file is empty"):
    features.read_examples(tmp_path / "nothing.txt")


def test_empty_line_as_the_original_when_allowed(minilm_dir, tmp_path):
  inp = tmp_path / "in.txt"
  inp.write_text("hello\n\nworld\n")
  out = tmp_path / "out.jsonl"
  summary = features.extract_features(
    str(inp), str(out), str(minilm_dir), layers=(-1,), allow_empty_lines=True, chunk_lines=2
  )  # 2 chunks
  assert (summary["num_lines"], summary["num_tokens"]) == (3, 8)
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["linex_index"] for r in rows] == [0, 1, 2]
  assert [[f["token"] for f in r["features"]] for r in rows] == [
    ["[CLS]", "hello", "[SEP]"],
    ["[CLS]", "[SEP]"],
    ["[CLS]", "world", "[SEP]"],
  ]


def test_cli_reports_errors_and_keeps_existing_output(minilm_dir, tmp_path):
  repo = pathlib.Path(__file__).resolve().parent.parent
  inp = tmp_path / "in.txt"
  inp.write_bytes(b"good\n\xc3\x28 broken\n")
  out = tmp_path / "out.jsonl"
  out.write_text("previous results\n")
  env = {**os.environ, "PYTHONPATH": str(repo)}
  cmd = [
    sys.executable,
    "-m",
    "bert_jax.extract_features",
    f"--input_file={inp}",
    f"--output_file={out}",
    f"--checkpoint={minilm_dir}",
    "--layers=-1",
  ]
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=repo, timeout=300)
  assert proc.returncode == 1  # bert_jax.cli: 1 for a user error, 2 for usage
  assert "in.txt:2: not valid UTF-8" in proc.stderr and "Traceback" not in proc.stderr
  assert out.read_text() == "previous results\n"
  inp.write_text("good\nalso good ||| and a pair\n")
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=repo, timeout=300)
  assert proc.returncode == 0, proc.stderr
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert summary["num_lines"] == 2
  assert [json.loads(x)["linex_index"] for x in out.read_text().splitlines()] == [0, 1]


def test_scalar_mix_entry_matches_numpy_mix(minilm_dir, hf_minilm, tmp_path):
  """--scalar_mix_weights: the extra layer entry "mix" is the numpy mix of the layers written
  beside it, and of Hugging Face's hidden states (embeddings included)."""
  inp = tmp_path / "in.txt"
  inp.write_text("\n".join(LINES[:2]) + "\n", encoding="utf-8")
  out = tmp_path / "out.jsonl"
  layers = tuple(range(-1, -7, -1))  # all six MiniLM layers
  weights = [1.0, 0.0, 1.0, 0.0, 2.0, 0.0, 4.0]  # embeddings, layers 0..5; divided by 8
  features.extract_features(
    str(inp), str(out), str(minilm_dir), layers, scalar_mix_weights=weights, scalar_mix_gamma=3.0
  )
  s = np.asarray(weights) / 8.0
  tok, model = hf_minilm
  for row, line in zip([json.loads(x) for x in out.read_text().splitlines()], LINES):
    a, _, b = line.partition(" ||| ")
    with torch.no_grad():
      hf = model(**tok(a, b or None, return_tensors="pt"), output_hidden_states=True)
    hf_hidden = [h[0].numpy().astype(np.float64) for h in hf.hidden_states]  # 7: emb + 6
    for t, feat in enumerate(row["features"]):
      assert [entry["index"] for entry in feat["layers"]] == [*layers, "mix"]
      written = {entry["index"]: np.asarray(entry["values"]) for entry in feat["layers"]}
      mixed = written["mix"]
      # the written layers (k = 1..6 is layer k - 1, i.e. index k - 7) + HF's embeddings
      ref_written = 3.0 * (s[0] * hf_hidden[0][t] + sum(s[k] * written[k - 7] for k in range(1, 7)))
      # The written layers' and the mix's rounding to 6 decimals, and float32's sum of Hugging
      # Face's embeddings and ours (their LayerNorm: 2 D terms) and of the 7-term mix (float_tolerance,
      # rule 2), magnitude 3 sum s_k |h_k|.
      h = [np.abs(hf_hidden[0][t])] + [np.abs(written[k - 7]) for k in range(1, 7)]
      magnitude = 3.0 * sum(s[k] * h[k] for k in range(7))
      atol = 4 * 5e-7 + sum_bound(magnitude, 2 * model.config.hidden_size + 7)
      assert np.all(np.abs(mixed - ref_written) <= atol), np.abs(mixed - ref_written).max()
      ref_hf = 3.0 * sum(s[k] * hf_hidden[k][t] for k in range(7))
      np.testing.assert_allclose(mixed, ref_hf, atol=1e-4, rtol=0)


def test_an_output_over_the_input_is_refused_before_any_work(tmp_path):
  inp = tmp_path / "in.txt"
  inp.write_text("hello\n")
  missing = str(tmp_path / "no_checkpoint")  # never loaded: the output is checked first
  for out, expected in [
    (inp, f"--output_file={inp} is the input --input_file={inp}"),
    (tmp_path, f"--output_file={tmp_path} contains the input --input_file={inp}"),
    (tmp_path / "a" / "out.jsonl", f"--output_file={tmp_path / 'a' / 'out.jsonl'}: the folder"),
  ]:
    with pytest.raises(ValueError) as e:
      features.extract_features(str(inp), str(out), missing)
    assert str(e.value).startswith(expected), str(e.value)
  assert inp.read_text() == "hello\n" and os.listdir(tmp_path) == ["in.txt"]


def test_long_work_logs_progress_with_an_eta(minilm_dir, tmp_path, monkeypatch):
  import functools

  from bert_jax.train.progress import Progress

  inp = tmp_path / "in.txt"
  inp.write_text("hello world\n" * 40)
  lines = []
  monkeypatch.setattr(features, "PROGRESS_INTERVAL_SEC", 0.0)  # a line at every line written
  monkeypatch.setattr(features, "Progress", functools.partial(Progress, log=lines.append))
  features.extract_features(
    str(inp), str(tmp_path / "out.jsonl"), str(minilm_dir), layers=(-1,), batch_size=8
  )
  assert all(line.startswith(f"extract_features {inp}: ") for line in lines)
  assert [line.split(": ", 1)[1].split(" lines")[0] for line in lines[:2]] == ["1/40", "2/40"]
  assert ", eta " in lines[0] and lines[-1].endswith("(done)") and len(lines) == 41
