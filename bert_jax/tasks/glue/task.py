"""GLUE fine-tuning: the nine tasks as sequence classification (STS-B as regression).

Config keys read (see configs/glue.py): ``task``, ``data_source`` ("tsv" | "tfds"),
``data_dir`` (GLUE root holding CoLA/, SST-2/, ... or one task's folder), ``tfds_data_dir``,
``max_seq_length``, ``skip_malformed_rows``, ``max_train_examples``/``max_eval_examples``
(0 = all; slices for quick runs; ``train_sample_seed`` >= 0 makes the training slice a
uniform sample drawn with that seed instead of the first rows); ``private_attributes``, ``num_private_attributes``,
``private_attributes_file`` (bert_jax/tasks/privacy/attributes.py: each split gains an int32
[N, K] array ``private``). Pairs are packed ``[CLS] A [SEP] B [SEP]``; a pair that does not fit
is truncated (longer text first) and counted in the split's ``stats["truncated"]``.

With ``config.packing.enabled`` (bert_jax/runs/finetuning/inputs.py: ``Packer``) several pairs
share a row; the logits are then [R, S, N] (one per packed sequence) and the loss the mean over
the sequences (``sequence_weights``), as unpacked over the same pairs.

``GlueClassification`` is the plain task; ``GlueTask`` (the registry's) opts into
``config.defence`` with the ``PrivacyDefended`` mix-in (bert_jax/tasks/privacy/defended.py).

Test predictions are written in the GLUE server's format: ``<Task>.tsv`` (CoLA.tsv, SST-2.tsv,
MRPC.tsv, STS-B.tsv, QQP.tsv, MNLI-m.tsv, MNLI-mm.tsv, QNLI.tsv, RTE.tsv, WNLI.tsv, AX.tsv)
with a header ``index\tprediction`` and label names (entailment, ...), 0/1, or a score.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.data.packing import SEQUENCE_WEIGHTS
from bert_jax.model import BertConfig, BertForSequenceClassification
from bert_jax.tasks import metrics as M
from bert_jax.tasks.base import SplitData, Task
from bert_jax.tasks.glue.data import SPECS, GlueSpec, labels_array, read_tfds, read_tsv
from bert_jax.tasks.glue.features import encode_texts
from bert_jax.tasks.privacy import attributes as PA
from bert_jax.tasks.privacy.defended import PrivacyDefended


def glue_metrics(spec: GlueSpec, labels: np.ndarray, preds: np.ndarray) -> dict[str, float]:
  """The task's official metrics on label indices (or scores for STS-B)."""
  if spec.is_regression:
    return {
      "pearson": M.pearson(labels, preds),
      "spearman": M.spearman(labels, preds),
      "corr": (M.pearson(labels, preds) + M.spearman(labels, preds)) / 2,
    }
  out = {"accuracy": M.accuracy(labels, preds)}
  if spec.name == "cola":
    out["mcc"] = M.matthews_corrcoef(labels, preds)
  if spec.name in ("mrpc", "qqp"):
    out["f1"] = M.f1_binary(labels, preds)
    out["acc_and_f1"] = (out["accuracy"] + out["f1"]) / 2
  return out


class GlueClassification(Task):
  """One GLUE task, chosen by ``config.task`` (cola, sst2, mrpc, stsb, qqp, mnli, qnli, ...)."""

  head = "sequence_classification"

  def __init__(self, config, tokenizer):
    super().__init__(config, tokenizer)
    if config.task not in SPECS:
      raise ValueError(f"config.task {config.task!r} is not a GLUE task; one of {sorted(SPECS)}")
    self.spec = SPECS[config.task]
    self.name = self.spec.name
    self.primary_metric = self.spec.primary_metric
    self.eval_splits = tuple(s for s, _ in self.spec.eval_files)
    self.test_splits = tuple(s for s, _, _ in self.spec.test_files)
    if config.private_attributes:
      PA.check_kind(config.private_attributes)
    self._examples: dict[str, tuple] = {}

  @property
  def labels(self) -> list[str]:
    return list(self.spec.labels)

  @property
  def num_labels(self) -> int:
    return max(1, len(self.spec.labels))

  def build_model(self, bert_config: BertConfig):
    return BertForSequenceClassification(
      bert_config, num_labels=self.num_labels, head_init=self.config.head_init
    )

  def packing_unsupported(self) -> str:
    return ""

  def describe_split(self, split: str) -> str:
    """How errors name a split of the task's data, e.g. "CoLA train"."""
    return f"{self.spec.dir_name} {split}"

  # --- private attributes -------------------------------------------------------------------
  @functools.cached_property
  def private_attributes(self) -> PA.PrivateAttributes | None:
    """The task's private attributes (fitted on the training split), or None."""
    c = self.config
    if not c.private_attributes:
      return None
    train = [] if c.private_attributes == "conll_per" else self.read_examples(self.train_split)[0]
    return PA.fit(
      c.private_attributes,
      int(c.num_private_attributes),
      [e.columns for e in train],
      c.private_attributes_file,
      where=self.describe_split(self.train_split),
    )

  def _private_matrix(self, split: str, examples) -> np.ndarray:
    return PA.matrix(
      self.private_attributes,
      [e.columns for e in examples],
      [(e.text_a, e.text_b) for e in examples],
      where=self.describe_split(split),
    )

  # --- data ---------------------------------------------------------------------------------
  def _task_dir(self) -> str:
    root = self.config.data_dir
    if not root:
      raise ValueError(
        "config.data_dir is empty: set it to a GLUE directory "
        f"(holding {self.spec.dir_name}/) or to the {self.spec.dir_name} folder"
      )
    sub = os.path.join(root, self.spec.dir_name)
    return sub if os.path.isdir(sub) else root

  def read_examples(self, split: str):
    """(examples, labelled, skipped) of a split from the configured source (read once)."""
    if split not in self._examples:
      self._examples[split] = self._read_examples(split)
    return self._examples[split]

  def _read_examples(self, split: str):
    spec = self.spec
    labelled = split == self.train_split or split in self.eval_splits
    if split not in (self.train_split, *self.eval_splits, *self.test_splits):
      raise ValueError(
        f"{spec.name} has no split {split!r}; splits: "
        f"{[self.train_split, *self.eval_splits, *self.test_splits]}"
      )
    source = self.config.data_source
    if source == "tfds":
      if not self.config.tfds_data_dir:
        raise ValueError(
          "config.data_source='tfds' needs config.tfds_data_dir (a local TFDS "
          "data_dir with glue/* prepared; nothing is downloaded)"
        )
      return read_tfds(spec, split, self.config.tfds_data_dir), labelled, 0
    if source != "tsv":
      raise ValueError(f"config.data_source must be 'tsv' or 'tfds', got {source!r}")
    files = dict(spec.eval_files) | {s: f for s, f, _ in spec.test_files} | {"train": "train.tsv"}
    path = os.path.join(self._task_dir(), files[split])
    if split == "ax" and not os.path.isfile(path):  # GLUE also ships it as AX.tsv
      path = os.path.join(os.path.dirname(self._task_dir()), "AX", "AX.tsv")
    examples, skipped = read_tsv(spec, path, labelled, self.config.skip_malformed_rows)
    return examples, labelled, skipped

  def load_split(self, split: str) -> SplitData:
    examples, labelled, skipped = self.read_examples(split)
    limit = (
      self.config.max_train_examples if split == self.train_split else self.config.max_eval_examples
    )
    seed = int(self.config.train_sample_seed)
    if limit and split == self.train_split and seed >= 0 and limit < len(examples):
      # A uniform sample (files are often grouped, e.g. CoLA by source), kept in file order.
      keep = np.sort(np.random.default_rng(seed).choice(len(examples), limit, replace=False))
      examples = [examples[i] for i in keep]
    elif limit:
      examples = examples[:limit]
    arrays, truncated = encode_texts(
      self.tokenizer,
      [e.text_a for e in examples],
      [e.text_b for e in examples] if self.spec.text_b else None,
      int(self.config.max_seq_length),
    )
    arrays["label"] = labels_array(self.spec, examples)
    if self.private_attributes is not None:
      try:
        arrays["private"] = self._private_matrix(split, examples)
      except ValueError:
        if labelled:  # train/dev must have them; a test file may lack the column
          raise
    return SplitData(
      split,
      arrays,
      examples=examples,
      has_labels=labelled,
      stats={"examples": len(examples), "truncated": truncated, "skipped_malformed": skipped},
    )

  # --- model outputs ------------------------------------------------------------------------
  def target_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    dtype = np.float32 if self.spec.is_regression else np.int32
    return {"label": jax.ShapeDtypeStruct((batch_size,), dtype)}

  def loss(self, outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]):
    logits = outputs["logits"].astype(jnp.float32)
    if SEQUENCE_WEIGHTS in batch:  # packed: [R, S, N] logits, [R, S] labels and weights
      return self._packed_loss(logits, batch["label"], batch[SEQUENCE_WEIGHTS])
    if self.spec.is_regression:
      pred = logits[:, 0]
      loss = jnp.mean(jnp.square(pred - batch["label"]))
      metrics = {"mse": loss}
    else:
      loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]))
      acc = jnp.mean((jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32))
      metrics = {"accuracy": acc}
    return loss, metrics

  def _packed_loss(self, logits_RxSxN, label_RxS, weight_RxS):
    """The unpacked loss and metrics over the packed sequences (weight 1; empty slots 0)."""
    count = jnp.maximum(weight_RxS.sum(), 1.0)
    if self.spec.is_regression:
      loss = (jnp.square(logits_RxSxN[..., 0] - label_RxS) * weight_RxS).sum() / count
      return loss, {"mse": loss}
    ce_RxS = optax.softmax_cross_entropy_with_integer_labels(logits_RxSxN, label_RxS)
    loss = (ce_RxS * weight_RxS).sum() / count
    right_RxS = (jnp.argmax(logits_RxSxN, -1) == label_RxS).astype(jnp.float32)
    return loss, {"accuracy": (right_RxS * weight_RxS).sum() / count}

  def predict(self, outputs: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    return {"logits": outputs["logits"].astype(jnp.float32)}

  def evaluate(self, data: SplitData, predictions: Mapping[str, np.ndarray]):
    logits = np.asarray(predictions["logits"])
    preds = logits[:, 0] if self.spec.is_regression else logits.argmax(-1)
    if not data.has_labels:
      return {}, preds
    labels = data.arrays["label"]
    metrics = glue_metrics(self.spec, labels, preds)
    if self.spec.is_regression:
      metrics["loss"] = float(np.mean(np.square(preds - labels)))
    else:  # mean cross-entropy, as the training loss
      z = logits - logits.max(-1, keepdims=True)
      log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
      metrics["loss"] = float(-np.mean(log_p[np.arange(len(labels)), labels]))
    return metrics, preds

  def write_predictions(self, data: SplitData, predictions: Any, out_dir: str) -> list[str]:
    """GLUE submission files for test splits; ``<split>_predictions.tsv`` for labelled ones."""
    names = {s: sub for s, _, sub in self.spec.test_files}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, names.get(data.split, f"{data.split}_predictions.tsv"))
    with open(path, "w", encoding="utf-8") as f:
      f.write("index\tprediction\n")
      for ex, p in zip(data.examples, predictions):
        value = f"{float(p):.3f}" if self.spec.is_regression else self.spec.labels[int(p)]
        f.write(f"{ex.index}\t{value}\n")
    return [path]


class GlueTask(PrivacyDefended, GlueClassification):
  """A GLUE task with ``config.defence`` (bert_jax/tasks/privacy/defended.py) available."""

  # Keys GLUE configs gained after workdirs were written (their defaults: configs/glue.py).
  added_config_keys = types.MappingProxyType(
    {
      "train_sample_seed": -1,
      "private_attributes": "",
      "num_private_attributes": 5,
      "private_attributes_file": "",
      "defence": {
        "name": "",
        "alpha": 1.0,
        "beta": 1.0,
        "declustering_lambda": 0.1,
        "adversary_hidden_size": 64,
        "adversary_learning_rate": 1e-3,
      },
    }
  )
