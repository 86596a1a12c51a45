"""SWAG: CSV and JSON-lines readers, [CLS] context [SEP] ending [SEP] packing, bad input."""

import numpy as np
import pytest
from ml_collections import ConfigDict

from bert_jax.tasks import create_task
from bert_jax.tasks.swag.task import SwagInputError, read_swag


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
  from bert_jax.tokenize import load_tokenizer

  return load_tokenizer(minilm_dir)


def _config(**kw):
  c = dict(
    task="swag",
    train_file="",
    dev_file="",
    test_file="",
    max_seq_length=64,
    max_train_examples=0,
    max_eval_examples=0,
  )
  c.update(kw)
  return ConfigDict(c)


def test_read_csv_and_jsonl(shared_data):
  rows = read_swag(str(shared_data / "swag/sample.csv"), True)
  assert len(rows) == 11 and rows[0]["label"] == 2 and rows[0]["index"] == "0"
  assert rows[0]["sent1"] == "Students lower their eyes nervously." and rows[0]["sent2"] == "She"
  assert rows[0]["endings"][0] == "pats her shoulder, then saunters toward someone."
  rows = read_swag(str(shared_data / "swag/sample.jsonl"), True)
  assert len(rows) == 10 and [r["label"] for r in rows[:2]] == [0, 3]


def test_packing_matches_hf(shared_data, minilm_dir, tokenizer):
  from transformers import BertTokenizer

  hf = BertTokenizer(str(minilm_dir / "vocab.txt"), do_lower_case=True)
  task = create_task(_config(dev_file=str(shared_data / "swag/sample.csv")), tokenizer)
  data = task.load_split("dev")
  assert data.arrays["input_ids"].shape == (11, 4, 64) and data.stats["truncated"] == 0
  assert task.labels == ["ending0", "ending1", "ending2", "ending3"]
  for i, row in enumerate(data.examples[:3]):
    for j, ending in enumerate(row["endings"]):
      ref = hf(row["sent1"], f"{row['sent2']} {ending}", padding="max_length", max_length=64)
      assert data.arrays["input_ids"][i, j].tolist() == ref["input_ids"]
      assert data.arrays["segment_ids"][i, j].tolist() == ref["token_type_ids"]
      assert data.arrays["input_mask"][i, j].tolist() == ref["attention_mask"]
  metrics, preds = task.evaluate(data, {"logits": np.eye(4)[data.arrays["label"]]})
  assert metrics == {"accuracy": 1.0}


def test_bad_swag_input(tmp_path):
  p = tmp_path / "bad.csv"
  p.write_text("sent1,sent2,ending0,ending1,ending2,label\na,b,c,d,e,1\n")
  with pytest.raises(SwagInputError, match=r"bad\.csv:1: missing column.*ending3"):
    read_swag(str(p), True)
  p.write_text("sent1,sent2,ending0,ending1,ending2,ending3,label\na,b,c,d,e,f,1\na,b,c,d,e,f,7\n")
  with pytest.raises(SwagInputError, match=r"bad\.csv:3: label '7' is not one of 0..3"):
    read_swag(str(p), True)
  p = tmp_path / "bad.jsonl"
  p.write_text(
    '{"sent1": "a", "sent2": "b", "ending0": "c", "ending1": "d", "ending2": "e", '
    '"ending3": "f", "label": 0}\n{"sent1": "a"\n'
  )
  with pytest.raises(SwagInputError, match=r"bad\.jsonl:2: not valid JSON"):
    read_swag(str(p), True)
