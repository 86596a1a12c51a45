"""``python -m bert_jax.predict_next``: next-piece predictions for every prefix of every line.

References: Hugging Face ``transformers``' slow BertTokenizer (the pieces, hence the number of
prefixes) and PyTorch BertLMHeadModel / BertForMaskedLM (the log-softmax of their logits on the
documented input of each prefix, including the windows of lines longer than the model); a
unigram baseline counted from the training text with the tokenizer (a briefly trained causal
LM must beat it on held-out lines).
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers
from conftest import subprocess_env_for

from bert_jax.tools import next_token

REPO = pathlib.Path(__file__).resolve().parent.parent

SMALL = dict(
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=4,
  intermediate_size=37,
  max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory, shared_data):
  """A WordPiece vocabulary built from the original BERT demo corpus."""
  from bert_jax.tokenize.vocab import build_wordpiece_vocab

  out = tmp_path_factory.mktemp("vocab")
  build_wordpiece_vocab(
    [str(shared_data / "pretrain" / "bert_sample_text.txt")], str(out / "vocab.txt"), 400
  )
  return out / "vocab.txt"


def _hf_model(cls, vocab, directory, is_decoder):
  """A random PyTorch model (perturbed, so logits are spread), saved with the vocabulary."""
  torch.manual_seed(0)
  size = len(vocab.read_text().splitlines())
  model = cls(transformers.BertConfig(vocab_size=size, is_decoder=is_decoder, **SMALL)).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(directory)
  (directory / "vocab.txt").write_text(vocab.read_text())
  (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  return model, directory


@pytest.fixture(scope="module")
def hf_models(vocab, tmp_path_factory):
  return {
    "causal": _hf_model(
      transformers.BertLMHeadModel, vocab, tmp_path_factory.mktemp("causal"), True
    ),
    "mlm": _hf_model(transformers.BertForMaskedLM, vocab, tmp_path_factory.mktemp("mlm"), False),
  }


def _lines(shared_data):
  text = (shared_data / "pretrain" / "bert_sample_text.txt").read_text().splitlines()
  sentences = [t for t in text if t.strip()]
  return [
    sentences[0],
    "",  # an empty line: no prefixes
    sentences[1],
    " ".join(sentences[2:6]),  # longer than max_seq_length: windows
    "   ",  # blank: no pieces either
    sentences[6],
  ]


def _reference_input(mode, pieces_ids, j, max_seq_length, cls, sep, mask):
  """The documented input of prefix j and the position its prediction is read at."""
  if mode == "causal":
    context, stride = max_seq_length - 1, (max_seq_length - 1) // 2
    s = 0 if j <= context else stride * math.ceil((j - context) / stride)
    return [cls] + pieces_ids[s:j], j - s
  a = max(0, j - (max_seq_length - 3))
  return [cls] + pieces_ids[a:j] + [mask, sep], j - a + 1


def _reference_logprobs(hf_model, inputs):
  """PyTorch's log-softmax at each (input ids, position), in one right-padded batch."""
  length = max(len(ids) for ids, _ in inputs)
  ids = torch.tensor([x + [0] * (length - len(x)) for x, _ in inputs])
  mask = torch.tensor([[1] * len(x) + [0] * (length - len(x)) for x, _ in inputs])
  with torch.no_grad():
    logits = hf_model(input_ids=ids, attention_mask=mask).logits.double()
  rows = logits[torch.arange(len(inputs)), torch.tensor([p for _, p in inputs])]
  return torch.log_softmax(rows, -1).numpy()


@pytest.mark.parametrize("mode", ["causal", "mlm"])
def test_every_prefix_matches_pytorch_including_windows(
  mode, hf_models, vocab, shared_data, tmp_path
):
  hf_model, directory = hf_models[mode]
  lines = _lines(shared_data)
  inp = tmp_path / "in.txt"
  inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
  out = tmp_path / "out.jsonl"
  max_seq_length, k = 16, 4
  summary = next_token.predict_next(
    str(inp),
    str(out),
    str(directory),
    top_k=k,
    max_seq_length=max_seq_length,
    batch_size=3,  # rounded up to the 8 test devices
    mode="auto",
    chunk_rows=8,  # several chunks
  )
  hf_tok = transformers.BertTokenizer(str(vocab), do_lower_case=True)
  pieces = [hf_tok.tokenize(line) for line in lines]
  assert max(len(p) for p in pieces) > 2 * max_seq_length  # at least three windows
  records = [json.loads(r) for r in out.read_text().splitlines()]
  # Exactly one record per piece, by line then prefix, in input order.
  assert len(records) == sum(len(p) for p in pieces)
  expected = [(i, j) for i, p in enumerate(pieces) for j in range(len(p))]
  assert [(r["line"], r["prefix_len"]) for r in records] == expected
  assert [r["gold"] for r in records] == [p[j] for i, p in enumerate(pieces) for j in range(len(p))]
  assert summary["mode"] == mode and summary["k"] == k
  assert (summary["lines"], summary["empty_lines"], summary["prefixes"]) == (6, 2, len(records))

  cls, sep, mask = hf_tok.convert_tokens_to_ids(["[CLS]", "[SEP]", "[MASK]"])
  line_ids = [hf_tok.convert_tokens_to_ids(p) for p in pieces]
  inputs = [
    _reference_input(mode, line_ids[r["line"]], r["prefix_len"], max_seq_length, cls, sep, mask)
    for r in records
  ]
  assert max(len(x) for x, _ in inputs) <= max_seq_length
  ref_logp = _reference_logprobs(hf_model, inputs)
  hits, gold_sum = [0, 0], 0.0
  for r, ref in zip(records, ref_logp):
    gold = line_ids[r["line"]][r["prefix_len"]]
    np.testing.assert_allclose(r["gold_logprob"], ref[gold], atol=1e-4)
    ours = r["topk"]
    assert len(ours) == k
    # The k largest values, in order, and each piece carries its own log-probability (robust
    # to near-ties in the order of pieces).
    np.testing.assert_allclose([lp for _, lp in ours], np.sort(ref)[::-1][:k], atol=1e-4)
    for piece, lp in ours:
      np.testing.assert_allclose(lp, ref[hf_tok.convert_tokens_to_ids(piece)], atol=1e-4)
    top = [hf_tok.convert_tokens_to_ids(p) for p, _ in ours]
    assert r["gold_rank"] == (top.index(gold) + 1 if gold in top else None)
    hits[0] += int(np.argmax(ref) == gold)
    hits[1] += int(ref[gold] >= np.sort(ref)[-k] - 1e-6)
    gold_sum += ref[gold]
  n = len(records)
  assert summary["top1_accuracy"] == pytest.approx(hits[0] / n, abs=1.5 / n)
  assert summary["topk_accuracy"] == pytest.approx(hits[1] / n, abs=1.5 / n)
  assert summary["mean_gold_logprob"] == pytest.approx(gold_sum / n, abs=1e-5)
  assert summary["perplexity"] == pytest.approx(math.exp(-gold_sum / n), rel=1e-4)
  assert json.loads((tmp_path / "out.jsonl.summary.json").read_text()) == summary


def test_windows_cover_every_prefix_once_with_bounded_context():
  for max_seq_length in (4, 5, 16, 17):
    context = max_seq_length - 1
    for n in range(0, 60):
      seen = []
      for s, first, last in next_token.causal_windows(n, max_seq_length):
        assert last - s + 1 <= max_seq_length  # [CLS] t_{s+1} .. t_last fits
        for j in range(first, last + 1):
          assert j - s <= context and (j <= context or j - s >= context - context // 2 + 1)
          seen.append(j)
      assert seen == list(range(n))


def test_mode_follows_the_checkpoint_and_refuses_the_wrong_kind():
  assert next_token.resolve_mode("auto", True) == "causal"
  assert next_token.resolve_mode("auto", False) == "mlm"
  assert next_token.resolve_mode("causal", True) == "causal"
  assert next_token.resolve_mode("mlm", False) == "mlm"
  with pytest.raises(ValueError, match="--mode=causal needs a left-to-right checkpoint"):
    next_token.resolve_mode("causal", False)
  with pytest.raises(ValueError, match="--mode=mlm needs a bidirectional"):
    next_token.resolve_mode("mlm", True)
  with pytest.raises(ValueError, match="--mode='both' is not one of"):
    next_token.resolve_mode("both", True)


def test_a_failed_run_leaves_no_output(hf_models, tmp_path):
  _, directory = hf_models["causal"]
  inp = tmp_path / "in.txt"
  # 600 good lines: the first chunk (256 lines) is written before the bad line is read.
  inp.write_bytes(b"the first line.\n" * 600 + b"bad \xff byte\n")
  out = tmp_path / "out.jsonl"
  with pytest.raises(ValueError, match=r"in\.txt:601: not valid UTF-8"):
    next_token.predict_next(str(inp), str(out), str(directory), max_seq_length=64, chunk_rows=16)
  assert os.listdir(tmp_path) == ["in.txt"]


@pytest.fixture(scope="module")
def ltr_workdir(tmp_path_factory, shared_data, pretraining_data):
  """A tiny left-to-right LM (one layer, hidden 64) briefly pre-trained on Hamlet's first 4,000
  lines: vocabulary, packed single-segment records (no NSP pairs), objective ltr."""
  from bert_jax.config_files import add_import_root
  from bert_jax.runs.pretraining.runner import run_pretraining

  add_import_root(REPO / "configs" / "pretrain.py")  # `pytest` as well as `python -m pytest`
  from configs import pretrain as pretrain_config

  out = tmp_path_factory.mktemp("ltr")
  play = shared_data / "pretrain" / "shakespeare" / "hamlet_gut.txt"
  train = out / "train.txt"
  train.write_text("\n".join(play.read_text().splitlines()[:4000]) + "\n")
  data = pretraining_data(
    "hamlet4000_packed64",
    [train],
    vocab_size=1000,
    max_seq_lengths=(64,),
    max_predictions_per_seq=(10,),
    dupe_factor=1,
    sentence_pairs=False,
    model=dict(
      hidden_size=64,
      num_hidden_layers=1,
      num_attention_heads=2,
      intermediate_size=128,
      max_position_embeddings=128,
    ),
  )
  c = pretrain_config.get_config("tiny")
  c.objective = "ltr"
  c.input_files = c.eval_input_files = data["train"]
  c.vocab_file = data["vocab"]
  c.bert_config_file = data["bert_config"]
  c.max_seq_length, c.max_predictions_per_seq = 64, 10
  c.train_batch_size = c.eval_batch_size = 32
  c.num_train_steps, c.num_warmup_steps = STEPS, STEPS // 10
  c.phase2.fraction = 0.0
  c.max_eval_steps, c.eval_every_steps, c.save_checkpoints_steps = 1, 0, STEPS
  c.shuffle_buffer_size = 1000
  summary = run_pretraining(c, str(out / "work"))
  assert summary["status"] == "completed"
  return out


STEPS = 200


def test_a_briefly_trained_causal_lm_beats_the_unigram_baseline(ltr_workdir, shared_data):
  from bert_jax.tokenize import load_tokenizer

  tok = load_tokenizer(ltr_workdir / "work" / "vocab.txt")  # the run's copy of the vocabulary
  counts = {}
  for line in tok.tokenize_batch((ltr_workdir / "train.txt").read_text().splitlines()):
    for piece in line:
      counts[piece] = counts.get(piece, 0) + 1
  most_frequent = max(counts, key=counts.get)
  play = shared_data / "pretrain" / "shakespeare" / "macbeth_gut.txt"
  held_out = ltr_workdir / "held_out.txt"
  held_out.write_text("\n".join(play.read_text().splitlines()[200:500]) + "\n")
  pieces = tok.tokenize_batch(held_out.read_text().splitlines())
  n = sum(len(p) for p in pieces)
  baseline = sum(p.count(most_frequent) for p in pieces) / n
  out = ltr_workdir / "held_out.jsonl"
  summary = next_token.predict_next(str(held_out), str(out), str(ltr_workdir / "work"))
  assert summary["mode"] == "causal" and summary["prefixes"] == n
  assert summary["empty_lines"] == sum(not p for p in pieces)
  assert summary["top1_accuracy"] > baseline + 0.02, (summary, most_frequent, baseline)
  assert summary["topk_accuracy"] > summary["top1_accuracy"]


def _cli(*args):
  proc = subprocess.run(
    [sys.executable, "-m", "bert_jax.predict_next", *args],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=subprocess_env_for(1),
    timeout=300,
  )
  errors = [line for line in proc.stderr.splitlines() if "error:" in line]
  return proc.returncode, proc.stdout, proc.stderr, errors


def test_bad_input_is_one_line_naming_the_flag(hf_models, tmp_path):
  _, mlm_dir = hf_models["mlm"]
  inp = tmp_path / "in.txt"
  inp.write_text("one line of text.\n")
  out = str(tmp_path / "out.jsonl")
  cases = [
    (
      [f"--input_file={inp}", f"--checkpoint={tmp_path / 'nope'}"],
      f"predict_next: error: --checkpoint={tmp_path / 'nope'}: no such file or directory",
    ),
    (
      [f"--input_file={tmp_path / 'missing.txt'}", f"--checkpoint={mlm_dir}"],
      f"predict_next: error: --input_file={tmp_path / 'missing.txt'}: no such file",
    ),
    (
      [f"--input_file={inp}", f"--checkpoint={mlm_dir}", "--mode=causal"],
      "predict_next: error: --mode=causal needs a left-to-right checkpoint",
    ),
  ]
  for args, expected in cases:
    rc, _, err, errors = _cli(f"--output_file={out}", *args)
    assert rc == 1 and "Traceback" not in err, err
    assert len(errors) == 1 and errors[0].startswith(expected), err
    assert not os.path.exists(out)


def test_entry_point_prints_the_summary_as_one_line(hf_models, vocab, tmp_path):
  _, mlm_dir = hf_models["mlm"]
  lines = ["The cat sat on the mat.", "", "It was a sunny day."]
  inp = tmp_path / "in.txt"
  inp.write_text("\n".join(lines) + "\n")
  out, summary_file = tmp_path / "out.jsonl", tmp_path / "summary.json"
  rc, stdout, err, _ = _cli(
    f"--input_file={inp}",
    f"--output_file={out}",
    f"--checkpoint={mlm_dir}",
    f"--summary_file={summary_file}",
    "--max_seq_length=16",
    "--top_k=3",
  )
  assert rc == 0, err
  summary = json.loads(stdout.strip().splitlines()[-1])
  assert summary == json.loads(summary_file.read_text())
  hf_tok = transformers.BertTokenizer(str(vocab), do_lower_case=True)
  n = sum(len(hf_tok.tokenize(line)) for line in lines)
  assert (summary["lines"], summary["empty_lines"], summary["prefixes"]) == (3, 1, n)
  assert (summary["mode"], summary["k"]) == ("mlm", 3)
  assert len(out.read_text().splitlines()) == n


def test_outputs_over_the_input_or_each_other_are_refused_before_any_work(hf_models, tmp_path):
  _, directory = hf_models["causal"]
  inp = tmp_path / "in.txt"
  inp.write_text("the cat sat on the mat.\n")
  out = tmp_path / "out.jsonl"
  out.write_text("earlier predictions\n")
  missing = str(tmp_path / "no_checkpoint")  # never loaded: the outputs are checked first
  cases = [
    (
      dict(summary_file=str(inp)),
      f"--summary_file={inp} is the input --input_file={inp}: writing it would destroy the input",
    ),
    (
      dict(summary_file=str(out)),
      f"--output_file={out} and --summary_file={out} are the same path",
    ),
    (dict(output_file=str(tmp_path)), f"--output_file={tmp_path} contains the input"),
    (dict(output_file=str(tmp_path / "sub")), f"--output_file={tmp_path / 'sub'} is a folder"),
    (
      dict(output_file=str(tmp_path / "nope" / "out.jsonl")),
      f"--output_file={tmp_path / 'nope' / 'out.jsonl'}: the folder {tmp_path / 'nope'} does "
      "not exist",
    ),
  ]
  (tmp_path / "sub").mkdir()
  for kwargs, expected in cases:
    kwargs = {"output_file": str(out), **kwargs}
    with pytest.raises(ValueError) as e:
      next_token.predict_next(str(inp), checkpoint=missing, **kwargs)
    assert str(e.value).startswith(expected), str(e.value)
  # A checkpoint folder as the output: refused even though the file would be written inside.
  with pytest.raises(ValueError, match="is the input --checkpoint="):
    next_token.predict_next(str(inp), str(directory), str(directory))
  assert inp.read_text() == "the cat sat on the mat.\n"
  assert out.read_text() == "earlier predictions\n"
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.jsonl", "sub"]


def test_long_work_logs_progress_with_an_eta(hf_models, tmp_path, monkeypatch):
  import functools

  from bert_jax.train.progress import Progress

  _, directory = hf_models["causal"]
  inp = tmp_path / "in.txt"
  inp.write_text("the cat sat on the mat.\n" * 600)  # 3 chunks: 256, 256, 88 lines
  lines = []
  monkeypatch.setattr(next_token, "PROGRESS_INTERVAL_SEC", 0.0)  # a line at every chunk
  monkeypatch.setattr(next_token, "Progress", functools.partial(Progress, log=lines.append))
  next_token.predict_next(
    str(inp), str(tmp_path / "out.jsonl"), str(directory), max_seq_length=32, chunk_rows=16
  )
  assert all(line.startswith(f"predict_next {inp}: ") for line in lines)
  assert [line.split(": ", 1)[1].split(" lines")[0] for line in lines] == [
    "256/600",
    "512/600",
    "600/600",
    "600/600",
  ]
  assert ", eta " in lines[0] and lines[-1].endswith("(done)")
