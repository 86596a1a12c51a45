"""SQuAD reading, sliding-window features, post-processing and loss, on the shared samples.

References are independent of the code under test: windows, max-context flags and spans are
recomputed here from run_squad.py's definitions with different code; gold answers are checked
through the tokenizer's own decode and the official normalisation; the loss against PyTorch's
cross-entropy as Hugging Face's BertForQuestionAnswering computes it.
"""

import json
import logging

import numpy as np
import pytest

from bert_jax.tasks.squad import evaluation as squad_eval
from bert_jax.tasks.squad.examples import SquadFormatError, read_squad_examples
from bert_jax.tasks.squad.features import convert_examples_to_features
from bert_jax.tasks.squad.postprocess import (
  compute_predictions,
  get_final_text,
  write_prediction_files,
)
from bert_jax.tokenize import load_tokenizer

SAMPLES = [("sample-v1.1.json", False), ("sample-v2.0.json", True), ("sample2-v2.0.json", True)]
# (max_seq_length, doc_stride, max_query_length): the paper's setting, and a small one that
# cuts every context into many overlapping windows.
SETTINGS = [(384, 128, 64), (64, 16, 16), (48, 8, 12)]


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
  return load_tokenizer(minilm_dir / "vocab.txt", do_lower_case=True)


def _squeeze(text):
  return squad_eval.normalize_answer(text).replace(" ", "")


@pytest.mark.parametrize("name,v2", SAMPLES)
@pytest.mark.parametrize("max_seq_length,doc_stride,max_query_length", SETTINGS)
def test_windows_match_run_squad_definition(
  shared_data, tokenizer, name, v2, max_seq_length, doc_stride, max_query_length
):
  examples = read_squad_examples(str(shared_data / "squad" / name), False, v2)
  arrays, features = convert_examples_to_features(
    examples, tokenizer, max_seq_length, doc_stride, max_query_length
  )
  assert arrays["input_ids"].shape == (len(features), max_seq_length)
  rows_of = {}
  for row, f in enumerate(features):
    rows_of.setdefault(f.example_index, []).append(row)
  assert sorted(rows_of) == list(range(len(examples)))

  recovered = 0
  for index, example in enumerate(examples):
    # Reference: every word's pieces, the question's pieces, windows at multiples of doc_stride.
    word_pieces = [tokenizer.tokenize(w) for w in example.doc_tokens]
    doc = [(p, w) for w, pieces in enumerate(word_pieces) for p in pieces]
    query = tokenizer.tokenize(example.question_text)[:max_query_length]
    room = max_seq_length - len(query) - 3
    starts = [0]
    while starts[-1] + room < len(doc):
      starts.append(starts[-1] + doc_stride)
    rows = rows_of[index]
    assert len(rows) == len(starts)
    # Max context: score = min(left, right) + 0.01 * window length; the first best window wins.
    scores = np.full((len(starts), len(doc)), -np.inf)
    for k, s in enumerate(starts):
      n = min(room, len(doc) - s)
      pos = np.arange(s, s + n)
      scores[k, s : s + n] = np.minimum(pos - s, s + n - 1 - pos) + 0.01 * n
    owner = np.argmax(scores, axis=0)

    for k, (row, s) in enumerate(zip(rows, starts)):
      f = features[row]
      n = min(room, len(doc) - s)
      ids = arrays["input_ids"][row]
      mask = arrays["input_mask"][row]
      expect = ["[CLS]"] + query + ["[SEP]"] + [p for p, _ in doc[s : s + n]] + ["[SEP]"]
      assert tokenizer.convert_ids_to_tokens(ids[: len(expect)].tolist()) == expect
      assert len(expect) <= max_seq_length
      assert ids[: len(expect)].tolist() == tokenizer.convert_tokens_to_ids(expect)
      assert mask.tolist() == [1] * len(expect) + [0] * (max_seq_length - len(expect))
      segments = arrays["segment_ids"][row].tolist()
      assert segments == (
        [0] * (len(query) + 2) + [1] * (n + 1) + [0] * (max_seq_length - len(expect))
      )
      offset = len(query) + 2
      assert f.context_offset == offset
      token_to_orig = f.token_to_orig(max_seq_length)
      assert token_to_orig[offset : offset + n].tolist() == [w for _, w in doc[s : s + n]]
      assert (token_to_orig[:offset] == -1).all() and (token_to_orig[offset + n :] == -1).all()
      assert f.max_context.tolist() == (owner[s : s + n] == k).tolist()
      if k:  # consecutive windows overlap: the next starts doc_stride pieces later
        assert s - starts[k - 1] == doc_stride

      # Gold span in this window: it decodes to the gold answer.
      sp, ep = int(arrays["start_positions"][row]), int(arrays["end_positions"][row])
      if example.is_impossible or not example.answers:
        assert sp == ep == 0
      elif sp:
        assert offset <= sp <= ep < offset + n
        assert _squeeze(tokenizer.decode(ids[sp : ep + 1].tolist())) == _squeeze(example.answers[0])
        recovered += 1
    # Every piece position is scored by exactly one window.
    flags = sum(int(features[r].max_context.sum()) for r in rows)
    assert flags == len(doc)
    if example.answers:
      assert any(arrays["start_positions"][r] for r in rows), example.qas_id
  assert recovered > 0


def _gold_logits(arrays, features, examples):
  """Logits that point at the gold span in its max-context window, else at [CLS]."""
  start = np.zeros(arrays["input_ids"].shape, np.float32)
  end = np.zeros_like(start)
  for row, f in enumerate(features):
    sp, ep = int(arrays["start_positions"][row]), int(arrays["end_positions"][row])
    start[row, 0] = end[row, 0] = 2.0
    if sp and f.max_context[sp - f.context_offset]:
      start[row, sp] = end[row, ep] = 8.0
    # A decoy span elsewhere in the context, weaker than the gold one.
    ctx = np.flatnonzero(f.token_to_orig(start.shape[1]) >= 0)
    start[row, ctx[0]] += 1.0
    end[row, ctx[min(2, len(ctx) - 1)]] += 1.0
  return start, end


@pytest.mark.parametrize("name,v2", SAMPLES)
@pytest.mark.parametrize("max_seq_length,doc_stride,max_query_length", SETTINGS[:2])
def test_gold_logits_give_gold_answers(
  shared_data, tokenizer, tmp_path, name, v2, max_seq_length, doc_stride, max_query_length
):
  path = shared_data / "squad" / name
  examples = read_squad_examples(str(path), False, v2)
  arrays, features = convert_examples_to_features(
    examples, tokenizer, max_seq_length, doc_stride, max_query_length
  )
  start, end = _gold_logits(arrays, features, examples)
  preds = compute_predictions(
    examples,
    features,
    start,
    end,
    tokenizer,
    n_best_size=20,
    max_answer_length=30,
    version_2_with_negative=v2,
  )
  for e in examples:  # the original text, case and punctuation included
    if e.answers:
      assert preds.predictions[e.qas_id] == e.answers[0]
    nbest = preds.nbest[e.qas_id]
    assert len(nbest) <= 20
    assert abs(sum(x["probability"] for x in nbest) - 1) < 1e-6
  dataset = json.loads(path.read_text())["data"]
  if v2:
    metrics = squad_eval.evaluate_v2(dataset, preds.predictions, preds.null_odds, 0.0)
    assert metrics["exact"] == metrics["f1"] == 100.0
  else:
    assert squad_eval.evaluate_v1(dataset, preds.predictions) == {"exact_match": 100.0, "f1": 100.0}
  files = write_prediction_files(preds, str(tmp_path), version_2_with_negative=v2)
  names = sorted(p.split("/")[-1] for p in files)
  assert names == sorted(
    ["predictions.json", "nbest_predictions.json"] + (["null_odds.json"] if v2 else [])
  )
  assert json.loads((tmp_path / "predictions.json").read_text()) == preds.predictions


def test_postprocess_constraints(shared_data, tokenizer):
  """End before start, spans over max_answer_length, the question and non-max-context starts
  are never predicted; the v2 null answer wins by the threshold rule."""
  examples = read_squad_examples(str(shared_data / "squad" / "sample-v2.0.json"), False, True)
  examples = examples[:1]
  arrays, features = convert_examples_to_features(examples, tokenizer, 384, 128, 64)
  (row,) = range(len(features))
  f = features[row]
  ctx = np.flatnonzero(f.token_to_orig(384) >= 0)
  start = np.full((1, 384), -100.0, np.float32)
  end = np.full_like(start, -100.0)
  start[0, 1] = end[0, 1] = 50.0  # inside the question
  start[0, ctx[30]], end[0, ctx[5]] = 40.0, 40.0  # end before start
  end[0, ctx[23] + 40] = 30.0  # too long (41 pieces > 30)
  start[0, ctx[23]], end[0, ctx[25]] = 10.0, 9.0  # the valid best: pieces "people who in"
  assert f.pieces(ctx[23], ctx[25]) == ["people", "who", "in"]
  preds = compute_predictions(examples, features, start, end, tokenizer, 20, 30, True, 0.0)
  qid = examples[0].qas_id
  assert preds.predictions[qid] == "people who in"
  null = float(start[0, 0] + end[0, 0])
  assert preds.null_odds[qid] == pytest.approx(null - 19.0)
  # Raising the [CLS] score above the best span by more than the threshold predicts "".
  start[0, 0] = end[0, 0] = 11.0
  assert (
    compute_predictions(examples, features, start, end, tokenizer, 20, 30, True, 2.0).predictions[
      qid
    ]
    == ""
  )
  assert (
    compute_predictions(examples, features, start, end, tokenizer, 20, 30, True, 3.5).predictions[
      qid
    ]
    != ""
  )


@pytest.mark.parametrize(
  "pred,orig,expect",
  [
    ("steve smith", "Steve Smith's", "Steve Smith"),
    ("1895", "(1895-1943).", "1895"),
    ("cafe", "Café", "Café"),
    ("nineteen", "Ninety-nine", "Ninety-nine"),  # not found: the whole original text
    ("the eiffel tower", "The Eiffel Tower,", "The Eiffel Tower"),
  ],
)
def test_get_final_text(tokenizer, pred, orig, expect):
  assert get_final_text(pred, orig, tokenizer) == expect


def test_answer_offset_mismatch_is_skipped_and_counted(tmp_path, caplog):
  data = {
    "version": "v2.0",
    "data": [
      {
        "title": "t",
        "paragraphs": [
          {
            "context": "The cat sat on the mat in Paris today.",
            "qas": [
              {
                "id": "good",
                "question": "Where?",
                "answers": [{"text": "Paris", "answer_start": 26}],
              },
              {"id": "bad", "question": "What?", "answers": [{"text": "mat", "answer_start": 4}]},
              {"id": "out", "question": "Who?", "answers": [{"text": "cat", "answer_start": 400}]},
            ],
          }
        ],
      }
    ],
  }
  path = tmp_path / "bad.json"
  path.write_text(json.dumps(data))
  stats = {}
  with caplog.at_level(logging.WARNING):
    train = read_squad_examples(str(path), True, False, stats)
  assert [e.qas_id for e in train] == ["good"]
  assert stats["answer_mismatch"] == 2
  assert "bad.json" in caplog.text and "'bad'" in caplog.text and "'out'" in caplog.text
  assert train[0].doc_tokens[train[0].start_position] == "Paris"
  # At evaluation every question is kept (scoring uses the gold texts).
  assert len(read_squad_examples(str(path), False, False)) == 3


@pytest.mark.parametrize(
  "content,match",
  [
    ('{"data": [{"paragraphs": [', r"bad\.json:1:\d+: not valid JSON"),
    ("[1, 2]", r"bad\.json: the top level"),
    (
      '{"data": [{"paragraphs": [{"qas": []}]}]}',
      r"bad\.json: data\[0\]\.paragraphs\[0\]: "
      r"missing key 'context'",
    ),
    (
      '{"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "q7", "answers": []}]}]}]}',
      r"bad\.json: question id 'q7'.*missing key 'question'",
    ),
    ('{"data": [{"paragraphs": [{"context": "caf\xe9", "qas": []}]}]}', r"bad\.json: not UTF-8"),
  ],
)
def test_malformed_files_name_the_file(tmp_path, content, match):
  path = tmp_path / "bad.json"
  path.write_bytes(content.encode("latin-1"))
  with pytest.raises(SquadFormatError, match=match):
    read_squad_examples(str(path), False, True)


def test_unanswerable_question_in_v1_run_is_an_error(shared_data):
  with pytest.raises(
    SquadFormatError,
    match=r"sample-v2\.0\.json: question id "
    r"'5ad39d53604f3c001a3fe8d3'.*squad_v2",
  ):
    read_squad_examples(str(shared_data / "squad" / "sample-v2.0.json"), True, False)


def test_duplicate_question_ids_are_counted(shared_data):
  stats = {}
  read_squad_examples(str(shared_data / "squad" / "sample2-v2.0.json"), False, True, stats)
  assert stats["duplicate_ids"] == 1


def test_training_features_point_at_cls_outside_the_answer(shared_data, tokenizer):
  examples = read_squad_examples(str(shared_data / "squad" / "sample-v2.0.json"), True, True)
  arrays, features = convert_examples_to_features(examples, tokenizer, 64, 16, 16)
  answered = set()
  for row, f in enumerate(features):
    e = examples[f.example_index]
    sp, ep = int(arrays["start_positions"][row]), int(arrays["end_positions"][row])
    words = set(f.doc.piece_to_word[f.span_start : f.span_start + f.span_length].tolist())
    if e.is_impossible:
      assert sp == ep == 0
    elif sp:
      answered.add(e.qas_id)
      ids = arrays["input_ids"][row, sp : ep + 1].tolist()
      assert _squeeze(tokenizer.decode(ids)) == _squeeze(e.orig_answer_text)
    else:  # [CLS]: the window does not hold the whole answer
      assert ep == 0
      assert not {e.start_position, e.end_position} <= words
  assert answered == {e.qas_id for e in examples if not e.is_impossible}


def test_loss_matches_pytorch_cross_entropy():
  import torch

  from bert_jax.tasks.squad.task import qa_loss

  rng = np.random.default_rng(0)
  start = rng.normal(size=(4, 16)).astype(np.float32)
  end = rng.normal(size=(4, 16)).astype(np.float32)
  sp = np.array([0, 3, 5, 15], np.int32)
  ep = np.array([0, 4, 9, 15], np.int32)
  loss, metrics = qa_loss(start, end, sp, ep)
  ce = torch.nn.CrossEntropyLoss()
  expect = (
    ce(torch.from_numpy(start), torch.from_numpy(sp).long())
    + ce(torch.from_numpy(end), torch.from_numpy(ep).long())
  ) / 2
  assert float(loss) == pytest.approx(float(expect), rel=1e-5)
  assert set(metrics) == {"start_loss", "end_loss", "span_accuracy"}


@pytest.mark.parametrize("name,v2", SAMPLES)
@pytest.mark.parametrize("seed", [0, 1])
def test_postprocess_matches_hugging_face_on_random_logits(
  shared_data, tokenizer, minilm_dir, tmp_path, name, v2, seed
):
  """Hugging Face's transcription of run_squad.py's write_predictions (compute_predictions_logits,
  with its own BasicTokenizer-based get_final_text) on the same windows and random logits."""
  import types

  from transformers import BertTokenizer
  from transformers.data.metrics.squad_metrics import compute_predictions_logits

  examples = read_squad_examples(str(shared_data / "squad" / name), False, v2)
  arrays, features = convert_examples_to_features(examples, tokenizer, 64, 16, 16)
  rng = np.random.default_rng(seed)
  start = rng.normal(size=arrays["input_ids"].shape).astype(np.float32) * 3
  end = rng.normal(size=start.shape).astype(np.float32) * 3
  hf_features, hf_results = [], []
  for row, f in enumerate(features):
    n = int(arrays["input_mask"][row].sum())
    positions = range(f.context_offset, f.context_offset + f.span_length)
    hf_features.append(
      types.SimpleNamespace(
        unique_id=row,
        example_index=f.example_index,
        tokens=tokenizer.convert_ids_to_tokens(arrays["input_ids"][row, :n].tolist()),
        token_to_orig_map={p: f.word_index(p) for p in positions},
        token_is_max_context={p: bool(f.max_context[p - f.context_offset]) for p in positions},
      )
    )
    hf_results.append(
      types.SimpleNamespace(
        unique_id=row, start_logits=start[row].tolist(), end_logits=end[row].tolist()
      )
    )

  class OriginalDetokenization(BertTokenizer):
    """run_squad.py removes every "##" (HF keeps one that starts the span, then fails to align
    "##hm 's brother" and falls back to the whole words; the original gives "hm's brother")."""

    def convert_tokens_to_string(self, tokens):
      return " ".join(tokens).replace(" ##", "").replace("##", "")

  hf_tokenizer = OriginalDetokenization(str(minilm_dir / "vocab.txt"), do_lower_case=True)
  for threshold in (0.0, -1.5):
    expect = compute_predictions_logits(
      examples,
      hf_features,
      hf_results,
      20,
      30,
      True,
      None,
      str(tmp_path / "nbest.json"),
      str(tmp_path / "null_odds.json"),
      False,
      v2,
      threshold,
      hf_tokenizer,
    )
    expect_nbest = json.loads((tmp_path / "nbest.json").read_text())
    expect_odds = json.loads((tmp_path / "null_odds.json").read_text()) if v2 else {}
    got = compute_predictions(examples, features, start, end, tokenizer, 20, 30, v2, threshold)
    assert got.predictions == dict(expect)
    assert got.nbest.keys() == expect_nbest.keys()
    for qid, entries in expect_nbest.items():
      assert [e["text"] for e in got.nbest[qid]] == [e["text"] for e in entries], qid
      for key in ("probability", "start_logit", "end_logit"):
        assert [e[key] for e in got.nbest[qid]] == pytest.approx([e[key] for e in entries])
    assert got.null_odds == pytest.approx(expect_odds)
