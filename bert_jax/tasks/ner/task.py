"""Named-entity recognition (token classification) on CoNLL-format files, scored as conlleval.

Config keys read (configs/ner.py): ``train_file``, ``dev_file``, ``test_file`` (CoNLL files;
"" = none), ``dev_fraction`` and ``split_seed`` (when there is no dev file, e.g. the shared
ner_sci/bert_paper.bio: a seeded random share of the training sentences is held out as "dev"),
``labels`` (comma-separated tag set; "" = the tags of the train and dev splits),
``skip_malformed_lines`` (drop and count lines without a valid tag), ``max_seq_length``,
``max_train_examples``/``max_eval_examples`` (sentences; 0 = all).

The label of each word sits on its first piece; the loss is the mean cross-entropy over those
positions only. With ``config.packing.enabled`` (bert_jax/runs/finetuning/inputs.py: ``Packer``) several rows share a
packed row, their labels and weights at their tokens' positions there, so the loss is the same
mean over the same labelled pieces. Evaluation maps the argmax at each word's first piece back to the word and
scores entity chunks with ``ner_conlleval.conlleval`` (primary metric: F1). Predictions are
written as ``<split>_predictions.txt`` in conlleval's input format: ``word gold predicted``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.model import BertConfig, BertForTokenClassification
from bert_jax.tasks.base import INPUT_KEYS, SplitData, Task
from bert_jax.tasks.ner.conlleval import conlleval
from bert_jax.tasks.ner.data import (
  check_labels,
  label_list,
  pack_sentences,
  read_conll,
  split_sentences,
  unpack_predictions,
)


def masked_token_loss(logits_BxLxC, label_ids_BxL, weights_BxL):
  """Mean cross-entropy and accuracy over positions of weight 1 (words' first pieces)."""
  logits = logits_BxLxC.astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, label_ids_BxL)
  denom = jnp.maximum(weights_BxL.sum(), 1.0)
  loss = (ce * weights_BxL).sum() / denom
  acc = ((jnp.argmax(logits, -1) == label_ids_BxL) * weights_BxL).sum() / denom
  return loss, {"token_accuracy": acc}


class NerTask(Task):
  name = "ner"
  head = "token_classification"
  primary_metric = "f1"
  eval_splits = ("dev",)
  test_splits = ("test",)

  def __init__(self, config, tokenizer):
    super().__init__(config, tokenizer)
    self._cache: dict[str, list] = {}
    self._read_stats: dict[str, dict] = {}
    self._labels: list[str] | None = None

  packed_inputs = ("position_ids", "sequence_ids")  # no pooled output: no cls_positions

  def packing_unsupported(self) -> str:
    # A subclass with its own model (the feature-based BiLSTM) would read across sequences.
    if type(self).build_model is not NerTask.build_model:
      return f"task {self.name!r} cannot be packed (its model reads across packed sequences)"
    return ""

  # --- data ---------------------------------------------------------------------------------
  def sentences(self, split: str):
    if split in self._cache:
      return self._cache[split]
    c = self.config
    if split == "train" or (split == "dev" and not c.dev_file and c.dev_fraction > 0):
      if not c.train_file:
        raise ValueError("config.train_file is empty: set it to a CoNLL-format file")
      train = read_conll(
        c.train_file, c.skip_malformed_lines, self._read_stats.setdefault("train", {})
      )
      if not c.dev_file and c.dev_fraction > 0:
        train, dev = split_sentences(train, c.dev_fraction, c.split_seed)
        self._cache["dev"] = dev
      self._cache["train"] = train
    else:
      key = {"dev": "dev_file", "test": "test_file"}.get(split)
      if key is None:
        raise ValueError(f"NER has no split {split!r}; splits: train, dev, test")
      if not c[key]:
        raise ValueError(
          f"config.{key} is empty: no {split} split (for a file without a dev "
          "split set config.dev_fraction)"
        )
      self._cache[split] = read_conll(
        c[key], c.skip_malformed_lines, self._read_stats.setdefault(split, {})
      )
    return self._cache[split]

  @property
  def labels(self) -> list[str]:
    if self._labels is None:
      extra = [t.strip() for t in self.config.labels.split(",") if t.strip()]
      if extra:
        self._labels = label_list([], extra)
      else:  # the tags of train and dev, so that every tag scored can be predicted
        has_dev = bool(self.config.dev_file) or self.config.dev_fraction > 0
        seen = self.sentences("train") + (self.sentences("dev") if has_dev else [])
        self._labels = label_list(seen)
    return self._labels

  def load_split(self, split: str) -> SplitData:
    sentences = self.sentences(split)
    limit = (
      self.config.max_train_examples if split == self.train_split else self.config.max_eval_examples
    )
    if limit:
      sentences = sentences[:limit]
    check_labels(sentences, self.labels)
    arrays, rows, stats = pack_sentences(
      self.tokenizer, sentences, self.labels, int(self.config.max_seq_length)
    )
    return SplitData(
      split,
      arrays,
      examples=sentences,
      features=rows,
      stats={
        "examples": len(sentences),
        "rows": len(rows),
        **stats,
        **self._read_stats.get(split, self._read_stats.get("train", {})),
      },
    )

  @property
  def sequence_axes(self) -> dict[str, int]:
    return {k: 1 for k in (*INPUT_KEYS, "label_ids", "label_weights")}

  @property
  def prediction_axes(self) -> dict[str, int]:
    return {"label_ids": 1}

  # --- model ----------------------------------------------------------------------------------
  def build_model(self, bert_config: BertConfig):
    return BertForTokenClassification(
      bert_config, num_labels=self.num_labels, head_init=self.config.head_init
    )

  def target_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    shape = (batch_size, int(self.config.max_seq_length))
    return {
      "label_ids": jax.ShapeDtypeStruct(shape, np.int32),
      "label_weights": jax.ShapeDtypeStruct(shape, np.float32),
    }

  def loss(self, outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]):
    return masked_token_loss(outputs["logits"], batch["label_ids"], batch["label_weights"])

  def predict(self, outputs):
    return {"label_ids": jnp.argmax(outputs["logits"], -1).astype(jnp.int32)}

  def evaluate(self, data: SplitData, predictions: Mapping[str, np.ndarray]):
    pred_tags = unpack_predictions(
      np.asarray(predictions["label_ids"]), data.features, data.examples, self.labels
    )
    scores = conlleval([s.tags for s in data.examples], pred_tags)
    return scores, pred_tags

  def write_predictions(self, data: SplitData, predictions: Any, out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{data.split}_predictions.txt")
    with open(path, "w", encoding="utf-8") as f:
      for s, tags in zip(data.examples, predictions):
        for w, g, p in zip(s.words, s.tags, tags):
          f.write(f"{w} {g} {p}\n")
        f.write("\n")
    return [path]
