"""NER: conlleval scoring against seqeval, CoNLL reading, word-piece packing, bad input."""

import re

import numpy as np
import pytest
from ml_collections import ConfigDict

from bert_jax.tasks import create_task
from bert_jax.tasks.ner.conlleval import chunks, conlleval
from bert_jax.tasks.ner.data import ConllInputError, pack_sentences, read_conll, unpack_predictions


def _perturb(sentences, rng, rate, labels):
  out = []
  for tags in sentences:
    tags = list(tags)
    for i in range(len(tags)):
      if rng.random() < rate:
        tags[i] = labels[rng.integers(len(labels))]
    out.append(tags)
  return out


def _seqeval(gold, pred):
  from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

  report = classification_report(gold, pred, output_dict=True, zero_division=0)
  return (precision_score(gold, pred), recall_score(gold, pred), f1_score(gold, pred), report)


@pytest.mark.parametrize("rate", [0.02, 0.1, 0.3])
def test_conlleval_matches_seqeval_on_conll_dev(shared_data, rate):
  sentences = read_conll(str(shared_data / "conll2003/dev.txt"))
  assert len(sentences) == 3250
  gold = [s.tags for s in sentences]
  labels = sorted({t for g in gold for t in g})
  pred = _perturb(gold, np.random.default_rng(int(rate * 100)), rate, labels)
  ours = conlleval(gold, pred)
  p, r, f, report = _seqeval(gold, pred)
  assert (ours["precision"], ours["recall"], ours["f1"]) == pytest.approx((p, r, f), abs=1e-12)
  for t, s in ours["per_type"].items():
    assert s["f1"] == pytest.approx(report[t]["f1-score"], abs=1e-12)
    assert s["gold"] == report[t]["support"]


def test_conlleval_iob1_and_iobes_match_seqeval():
  rng = np.random.default_rng(0)
  for labels in (
    ["O", "I-PER", "I-LOC", "B-PER", "B-LOC"],  # IOB1
    ["O", "B-X", "I-X", "E-X", "S-X", "B-Y", "E-Y", "S-Y"],
  ):  # IOBES
    gold = [
      [labels[i] for i in rng.integers(0, len(labels), rng.integers(1, 12))] for _ in range(300)
    ]
    pred = _perturb(gold, rng, 0.2, labels)
    ours = conlleval(gold, pred)
    p, r, f, _ = _seqeval(gold, pred)
    assert (ours["precision"], ours["recall"], ours["f1"]) == pytest.approx((p, r, f), abs=1e-12)


def test_chunks_by_hand():
  # IOB1: I- after O starts a chunk; a type change ends one; B- splits same-type neighbours.
  assert chunks(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"]) == {
    ("PER", 0, 1),
    ("PER", 2, 2),
    ("LOC", 4, 4),
    ("ORG", 5, 5),
  }
  assert conlleval([["B-PER", "I-PER", "O"]], [["B-PER", "O", "O"]])["f1"] == 0.0
  perfect = conlleval([["B-PER", "I-PER", "O"]], [["B-PER", "I-PER", "O"]])
  assert perfect["f1"] == perfect["accuracy"] == 1.0


def test_read_conll_formats_and_errors(tmp_path, shared_data):
  path = str(shared_data / "ner_sci/bert_paper.bio")
  with pytest.raises(ConllInputError, match=r"bert_paper\.bio:8880: token 'A;' has no tag"):
    read_conll(path)  # the real file has one line without a tag
  stats = {}
  sci = read_conll(path, skip_malformed=True, stats=stats)
  assert stats == {"skipped_lines": 1}
  assert len(sci) > 100 and any(t != "O" for s in sci for t in s.tags)
  p = tmp_path / "a.conll"
  p.write_text(
    "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\n"
    "Peter B-PER\nBlackburn I-PER\n"
  )
  s = read_conll(str(p))
  assert [x.words for x in s] == [["EU", "rejects"], ["Peter", "Blackburn"]]
  assert [x.tags for x in s] == [["B-ORG", "O"], ["B-PER", "I-PER"]]
  p.write_text("EU B-ORG\nrejects\n")
  with pytest.raises(ConllInputError, match=r"a\.conll:2: token 'rejects' has no tag"):
    read_conll(str(p))
  p.write_text("EU B-ORG\nrejects X-Y\n")
  with pytest.raises(ConllInputError, match=r"a\.conll:2: malformed tag 'X-Y'"):
    read_conll(str(p))


def test_read_conll_names_a_file_that_is_not_utf8(tmp_path):
  from configs import ner

  p = tmp_path / "latin1.conll"
  p.write_bytes("EU B-ORG\nrejects O\n\nK\u00f6ln B-LOC\n".encode("latin-1"))
  with pytest.raises(ConllInputError) as e:
    read_conll(str(p))
  assert str(e.value).startswith(f"{p}:4: not UTF-8 text (byte 0xf6); a CoNLL file is UTF-8")
  # The NER task's advice for a line without a tag names a key its config has.
  p.write_text("EU B-ORG\nrejects\n")
  with pytest.raises(ConllInputError) as e:
    read_conll(str(p))
  keys = re.findall(r"config\.(\w+)", str(e.value))
  assert keys == ["skip_malformed_lines"] and "skip_malformed_lines" in ner.get_config()


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
  from bert_jax.tokenize import load_tokenizer

  return load_tokenizer(minilm_dir)


def test_packing_first_piece_and_round_trip(shared_data, tokenizer):
  sentences = read_conll(str(shared_data / "conll2003/dev.txt"))[:300]
  labels = ["O"] + sorted({t for s in sentences for t in s.tags} - {"O"})
  arrays, rows, stats = pack_sentences(tokenizer, sentences, labels, 24)
  assert stats["sentences_split"] > 0 and len(rows) > len(sentences)
  # Gold label ids as "predictions" give back the gold tags of every word.
  assert unpack_predictions(arrays["label_ids"], rows, sentences, labels) == [
    s.tags for s in sentences
  ]
  assert arrays["label_weights"].sum() == sum(len(s.words) for s in sentences)
  # The labelled position of a word holds its first piece.
  s0, r0 = sentences[0], rows[0]
  for j, pos in enumerate(r0.positions):
    assert arrays["input_ids"][0, pos] == tokenizer.encode(s0.words[r0.first_word + j])[0]
  assert (arrays["input_mask"].sum(1) <= 24).all()


def test_long_word_truncated_with_count(tmp_path, tokenizer):
  p = tmp_path / "long.bio"
  p.write_text("Pneumonoultramicroscopicsilicovolcanoconiosis B-X\nis O\nlong O\n")
  arrays, rows, stats = pack_sentences(tokenizer, read_conll(str(p)), ["O", "B-X"], 6)
  assert stats["words_truncated"] == 1
  assert [r.positions for r in rows] == [[1], [1, 2]]  # the long word alone, then the rest
  assert (arrays["input_mask"].sum(1) <= 6).all()


def _ner_config(**kw):
  c = dict(
    task="ner",
    train_file="",
    dev_file="",
    test_file="",
    dev_fraction=0.0,
    split_seed=0,
    labels="",
    skip_malformed_lines=True,
    max_seq_length=32,
    max_train_examples=0,
    max_eval_examples=0,
  )
  c.update(kw)
  return ConfigDict(c)


def test_dev_fraction_split_and_unknown_label(tmp_path, shared_data, tokenizer):
  path = str(shared_data / "ner_sci/bert_paper.bio")
  task = create_task(_ner_config(train_file=path, dev_fraction=0.1, split_seed=3), tokenizer)
  train, dev = task.load_split("train"), task.load_split("dev")
  n = len(read_conll(path, skip_malformed=True))
  assert train.stats["skipped_lines"] == 1
  assert train.stats["examples"] + dev.stats["examples"] == n
  assert dev.stats["examples"] == round(0.1 * n)
  assert {id(s) for s in train.examples}.isdisjoint({id(s) for s in dev.examples})
  assert task.labels[0] == "O" and "B-MethodName" in task.labels
  bad = tmp_path / "dev.txt"
  bad.write_text("EU B-ORG\n\nParis B-CITY\n")
  task = create_task(_ner_config(train_file=path, dev_file=str(bad), labels="O,B-X,I-X"), tokenizer)
  with pytest.raises(
    ConllInputError, match=r"dev\.txt:1: tag 'B-ORG' is not among the task's labels \['O', 'B-X'"
  ):
    task.load_split("dev")
  with pytest.raises(ValueError, match="config.test_file is empty"):
    task.load_split("test")


def test_feature_selection_modes():
  import jax.numpy as jnp

  from bert_jax.tasks.ner.feature_based import select_features

  hidden = tuple(jnp.full((1, 2, 3), float(i)) for i in range(7))  # embeddings + 6 layers
  assert float(select_features(hidden, "layer", -1)[0, 0, 0]) == 6
  assert float(select_features(hidden, "layer", -2)[0, 0, 0]) == 5
  assert float(select_features(hidden, "sum_last_four")[0, 0, 0]) == 3 + 4 + 5 + 6
  assert float(select_features(hidden, "sum_all")[0, 0, 0]) == sum(range(1, 7))
  concat = select_features(hidden, "concat_last_four")
  assert concat.shape == (1, 2, 12)
  assert concat[0, 0].tolist() == [3] * 3 + [4] * 3 + [5] * 3 + [6] * 3
  with pytest.raises(ValueError, match="feature_mode 'mean'"):
    select_features(hidden, "mean")
