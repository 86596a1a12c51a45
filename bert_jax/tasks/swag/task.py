"""SWAG: choose the continuation of a sentence among four endings (BertForMultipleChoice).

Files: the original CSV (``train.csv``/``val.csv``/``test.csv``: columns ``sent1``, ``sent2``,
``ending0``..``ending3`` and, except in test, ``label``) or JSON lines with the same keys,
chosen by the file's extension (.csv, .jsonl/.json). A CSV row with more or fewer fields than
the header, a missing field or a label outside 0..3 is an error naming the file and line; a file
with no example is an error naming it. Each choice is packed as
``[CLS] sent1 [SEP] sent2 + " " + ending_i [SEP]`` (the paper: the given sentence, then a
possible continuation), truncated longer-first as GLUE pairs (counted in ``stats``); the four
rows of an example form one [4, L] input. Scored by accuracy. Predictions go to
``<split>_predictions.csv``: ``index,prediction,score0..score3``.

Config keys read (configs/swag.py): ``train_file``, ``dev_file``, ``test_file``,
``max_seq_length``, ``max_train_examples``/``max_eval_examples`` (0 = all).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.model import BertConfig, BertForMultipleChoice
from bert_jax.tasks import metrics as M
from bert_jax.tasks.base import INPUT_KEYS, SplitData, Task
from bert_jax.tasks.glue.features import encode_texts

NUM_CHOICES = 4
ENDINGS = tuple(f"ending{i}" for i in range(NUM_CHOICES))


class SwagInputError(ValueError):
  """Bad SWAG input; the message names the file and line."""


def read_swag(path: str, labelled: bool) -> list[dict]:
  """Rows of a SWAG CSV or JSON-lines file as dicts (sent1, sent2, endings, label, index)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"SWAG file not found: {path}")
  needed = ("sent1", "sent2") + ENDINGS + (("label",) if labelled else ())
  rows = []
  with open(path, encoding="utf-8", newline="") as f:
    if path.endswith((".jsonl", ".json")):
      records = []
      for line_no, line in enumerate(f, start=1):
        if line.strip():
          try:
            records.append((line_no, json.loads(line)))
          except json.JSONDecodeError as e:
            raise SwagInputError(f"{path}:{line_no}: not valid JSON: {e}") from None
    else:
      reader = csv.DictReader(f)
      missing = [k for k in needed if k not in (reader.fieldnames or [])]
      if missing:
        raise SwagInputError(f"{path}:1: missing column(s) {missing} in header {reader.fieldnames}")
      records = []
      width = len(reader.fieldnames or [])
      for r in reader:
        line_no = reader.line_num  # physical line of the row's end (quoted fields may span lines)
        fields = width + len(r.get(None, [])) - sum(v is None for v in r.values())
        if fields != width:
          raise SwagInputError(f"{path}:{line_no}: {fields} fields, expected {width}")
        records.append((line_no, r))
  for line_no, r in records:
    missing = [k for k in needed if r.get(k) is None]
    if missing:
      raise SwagInputError(f"{path}:{line_no}: missing field(s) {missing}")
    label = None
    if labelled:
      try:
        label = int(r["label"])
      except (TypeError, ValueError):
        label = -1
      if not 0 <= label < NUM_CHOICES:
        raise SwagInputError(f"{path}:{line_no}: label {r['label']!r} is not one of 0..3")
    index = r.get("") or r.get("fold-ind") or str(len(rows))
    rows.append(
      {
        "index": str(index),
        "sent1": r["sent1"],
        "sent2": r["sent2"],
        "endings": [r[k] for k in ENDINGS],
        "label": label,
      }
    )
  if not rows:
    raise SwagInputError(f"{path}: no examples; a split that is read must not be empty")
  return rows


class SwagTask(Task):
  name = "swag"
  head = "multiple_choice"
  primary_metric = "accuracy"

  @property
  def labels(self) -> list[str]:
    return list(ENDINGS)

  def build_model(self, bert_config: BertConfig):
    return BertForMultipleChoice(bert_config, head_init=self.config.head_init)

  def load_split(self, split: str) -> SplitData:
    key = {"train": "train_file", "dev": "dev_file", "test": "test_file"}.get(split)
    if key is None:
      raise ValueError(f"SWAG has no split {split!r}; splits: train, dev, test")
    if not self.config[key]:
      raise ValueError(f"config.{key} is empty: set it to a SWAG .csv or .jsonl file")
    labelled = split != "test"
    rows = read_swag(self.config[key], labelled)
    limit = self.config.max_train_examples if split == "train" else self.config.max_eval_examples
    rows = rows[:limit] if limit else rows
    L = int(self.config.max_seq_length)
    texts_a = [r["sent1"] for r in rows for _ in range(NUM_CHOICES)]
    texts_b = [f"{r['sent2']} {e}".strip() for r in rows for e in r["endings"]]
    flat, truncated = encode_texts(self.tokenizer, texts_a, texts_b, L)
    arrays = {k: v.reshape(len(rows), NUM_CHOICES, L) for k, v in flat.items()}
    arrays["label"] = np.array([r["label"] if labelled else -1 for r in rows], np.int32)
    return SplitData(
      split,
      arrays,
      examples=rows,
      has_labels=labelled,
      stats={"examples": len(rows), "truncated": truncated},
    )

  @property
  def sequence_axes(self) -> dict[str, int]:
    return {k: 2 for k in INPUT_KEYS}  # B x C x L

  def init_batch(self, batch_size: int) -> dict[str, np.ndarray]:
    L = int(self.config.max_seq_length)
    return {k: np.zeros((batch_size, NUM_CHOICES, L), np.int32) for k in INPUT_KEYS}

  def loss(self, outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]):
    logits = outputs["logits"].astype(jnp.float32)
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]))
    acc = jnp.mean((jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32))
    return loss, {"accuracy": acc}

  def predict(self, outputs):
    return {"logits": outputs["logits"].astype(jnp.float32)}

  def evaluate(self, data: SplitData, predictions: Mapping[str, np.ndarray]):
    logits = np.asarray(predictions["logits"])
    preds = logits.argmax(-1)
    out = (preds, logits)
    if not data.has_labels:
      return {}, out
    return {"accuracy": M.accuracy(data.arrays["label"], preds)}, out

  def write_predictions(self, data: SplitData, predictions: Any, out_dir: str) -> list[str]:
    preds, logits = predictions
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{data.split}_predictions.csv")
    with open(path, "w", encoding="utf-8", newline="") as f:
      w = csv.writer(f)
      w.writerow(["index", "prediction"] + [f"score{i}" for i in range(NUM_CHOICES)])
      for r, p, s in zip(data.examples, preds, logits):
        w.writerow([r["index"], int(p)] + [f"{float(x):.5f}" for x in s])
    return [path]
