"""SQuAD v1.1 and v2.0 extractive question answering as a ``bert_jax.tasks.base.Task``.

Config keys read (see configs/squad.py; google-research/bert's run_squad.py names): ``task``
("squad_v1" | "squad_v2"), ``train_file`` (split "train"), ``predict_file`` (split "dev"),
``max_seq_length`` (384), ``doc_stride`` (128), ``max_query_length`` (64), ``n_best_size``
(20), ``max_answer_length`` (30), ``null_score_diff_threshold`` (0.0, v2), and
``max_train_examples`` / ``max_eval_examples`` (0 = all; questions, for quick runs).

Rows are windows (``squad_features``); the loss is the mean of the start and the end
cross-entropies over all positions, with windows that do not hold the answer pointing at
[CLS]. Evaluation turns the windows' logits into one answer per question
(``squad_postprocess``) and scores it with the official scripts' logic (``squad_eval``):
v1.1 gives ``exact_match`` and ``f1``; v2.0 gives ``exact``, ``f1``, the ``HasAns_*`` /
``NoAns_*`` breakdown and ``best_f1_thresh`` etc. of the official script run with
null_odds.json, plus ``tuned_exact`` / ``tuned_f1`` and their thresholds: the best
``null_score_diff_threshold`` for this model, found by the official ``find_best_thresh`` over
each question's best non-null answer (set ``null_score_diff_threshold`` to ``tuned_f1_thresh``
and predict again to get ``tuned_f1``). Files written for a split: predictions.json,
nbest_predictions.json and (v2) null_odds.json.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.model import BertConfig, BertForQuestionAnswering
from bert_jax.tasks.base import SplitData, Task
from bert_jax.tasks.squad import evaluation as squad_eval
from bert_jax.tasks.squad.examples import SquadExample, load_squad_json, read_squad_examples
from bert_jax.tasks.squad.features import convert_examples_to_features
from bert_jax.tasks.squad.postprocess import (
  SquadPredictions,
  compute_predictions,
  write_prediction_files,
)

VERSIONS = {"squad_v1": False, "squad_v2": True}  # task -> version_2_with_negative


@dataclasses.dataclass
class SquadSplitExamples:
  """What ``SplitData.examples`` holds for SQuAD: the examples and the file's ``data`` list."""

  examples: list[SquadExample]
  dataset: list[dict[str, Any]]
  path: str


def qa_loss(
  start_logits_BxL: jax.Array,
  end_logits_BxL: jax.Array,
  start_positions_B: jax.Array,
  end_positions_B: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(mean of the start and end cross-entropies, metrics), as run_squad.py's loss."""
  start_ce = optax.softmax_cross_entropy_with_integer_labels(
    start_logits_BxL.astype(jnp.float32), start_positions_B
  )
  end_ce = optax.softmax_cross_entropy_with_integer_labels(
    end_logits_BxL.astype(jnp.float32), end_positions_B
  )
  start_loss, end_loss = jnp.mean(start_ce), jnp.mean(end_ce)
  exact = (jnp.argmax(start_logits_BxL, -1) == start_positions_B) & (
    jnp.argmax(end_logits_BxL, -1) == end_positions_B
  )
  return (start_loss + end_loss) / 2, {
    "start_loss": start_loss,
    "end_loss": end_loss,
    "span_accuracy": jnp.mean(exact.astype(jnp.float32)),
  }


class SquadTask(Task):
  """SQuAD v1.1 (``task="squad_v1"``) or v2.0 with unanswerable questions (``"squad_v2"``)."""

  head = "question_answering"
  primary_metric = "f1"
  higher_is_better = True
  train_split = "train"
  eval_splits = ("dev",)
  test_splits = ()
  # Length bucketing (off by default in configs/squad.py: windows are mostly full) keeps the
  # answer positions inside the cut; the logits are padded back for post-processing.
  position_keys = ("start_positions", "end_positions")

  @property
  def prediction_axes(self) -> dict[str, int]:
    return {"start_logits": 1, "end_logits": 1}

  def __init__(self, config, tokenizer):
    super().__init__(config, tokenizer)
    if config.task not in VERSIONS:
      raise ValueError(
        f"config.task {config.task!r} is not a SQuAD task; one of {sorted(VERSIONS)}"
      )
    self.name = config.task
    self.version_2_with_negative = VERSIONS[config.task]

  @property
  def num_labels(self) -> int:
    return 2  # start and end logits (qa_outputs), as Hugging Face's config for this head

  def head_info(self) -> dict[str, Any]:
    info = super().head_info()
    info["version_2_with_negative"] = self.version_2_with_negative
    return info

  def build_model(self, bert_config: BertConfig):
    return BertForQuestionAnswering(bert_config, head_init=self.config.head_init)

  # --- data ---------------------------------------------------------------------------------
  def _path(self, split: str) -> str:
    keys = {self.train_split: "train_file", "dev": "predict_file"}
    if split not in keys:
      raise ValueError(f"{self.name} has no split {split!r}; splits: {sorted(keys)}")
    path = self.config[keys[split]]
    if not path:
      version = "2.0" if self.version_2_with_negative else "1.1"
      raise ValueError(
        f"config.{keys[split]} is empty: set it to a SQuAD JSON file for the "
        f"{split!r} split (e.g. {split}-v{version}.json)"
      )
    return path

  def load_split(self, split: str) -> SplitData:
    path = self._path(split)
    is_training = split == self.train_split
    stats: dict[str, int] = {}
    examples = read_squad_examples(path, is_training, self.version_2_with_negative, stats)
    limit = int(self.config.max_train_examples if is_training else self.config.max_eval_examples)
    if limit:
      examples = examples[:limit]
      stats["examples"] = len(examples)
    c = self.config
    arrays, features = convert_examples_to_features(
      examples,
      self.tokenizer,
      int(c.max_seq_length),
      int(c.doc_stride),
      int(c.max_query_length),
      stats,
    )
    dataset = [] if is_training else load_squad_json(path)
    if limit and not is_training:
      kept = {e.qas_id for e in examples}
      dataset = _restrict(dataset, kept)
    has_labels = any(e.answers or e.is_impossible for e in examples)
    return SplitData(
      split,
      arrays,
      examples=SquadSplitExamples(examples, dataset, path),
      features=features,
      stats=stats,
      has_labels=has_labels,
    )

  # --- model outputs ------------------------------------------------------------------------
  def target_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {
      k: jax.ShapeDtypeStruct((batch_size,), np.int32) for k in ("start_positions", "end_positions")
    }

  def loss(self, outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]):
    return qa_loss(
      outputs["start_logits"],
      outputs["end_logits"],
      batch["start_positions"],
      batch["end_positions"],
    )

  def predict(self, outputs: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    return {
      "start_logits": outputs["start_logits"].astype(jnp.float32),
      "end_logits": outputs["end_logits"].astype(jnp.float32),
    }

  def postprocess(
    self,
    data: SplitData,
    predictions: Mapping[str, np.ndarray],
    null_score_diff_threshold: float | None = None,
  ) -> SquadPredictions:
    """Answer texts from the split's logits (threshold: the config's unless given)."""
    c = self.config
    threshold = (
      float(c.null_score_diff_threshold)
      if null_score_diff_threshold is None
      else null_score_diff_threshold
    )
    return compute_predictions(
      data.examples.examples,
      data.features,
      np.asarray(predictions["start_logits"]),
      np.asarray(predictions["end_logits"]),
      self.tokenizer,
      int(c.n_best_size),
      int(c.max_answer_length),
      self.version_2_with_negative,
      threshold,
    )

  def evaluate(self, data: SplitData, predictions: Mapping[str, np.ndarray]):
    preds = self.postprocess(data, predictions)
    if not data.has_labels:
      return {}, preds
    return squad_metrics(
      data.examples.dataset,
      preds,
      self.version_2_with_negative,
      float(self.config.null_score_diff_threshold),
    ), preds

  def write_predictions(
    self, data: SplitData, predictions: SquadPredictions, out_dir: str
  ) -> list[str]:
    return write_prediction_files(predictions, out_dir, "", self.version_2_with_negative)


def squad_metrics(
  dataset: list[dict[str, Any]],
  preds: SquadPredictions,
  version_2_with_negative: bool,
  null_score_diff_threshold: float = 0.0,
) -> dict[str, float]:
  """The official script's metrics for the predictions (see the module docstring)."""
  if not version_2_with_negative:
    return squad_eval.evaluate_v1(dataset, preds.predictions)
  # With na_prob_thresh = the threshold the predictions were made with, the official script's
  # headline numbers are exactly those of predictions.json.
  out = squad_eval.evaluate_v2(
    dataset, preds.predictions, preds.null_odds, na_prob_thresh=null_score_diff_threshold
  )
  has_ans = squad_eval.qid_to_has_ans(dataset)
  exact_raw, f1_raw = squad_eval.get_raw_scores(dataset, preds.best_non_null)
  null_odds = {k: v for k, v in preds.null_odds.items() if k in exact_raw}
  out["tuned_exact"], out["tuned_exact_thresh"] = squad_eval.find_best_thresh(
    preds.best_non_null, exact_raw, null_odds, has_ans
  )
  out["tuned_f1"], out["tuned_f1_thresh"] = squad_eval.find_best_thresh(
    preds.best_non_null, f1_raw, null_odds, has_ans
  )
  return out


def _restrict(dataset: list[dict[str, Any]], qids: set[str]) -> list[dict[str, Any]]:
  """The dataset with only the given questions (for evaluating a slice)."""
  out = []
  for article in dataset:
    paragraphs = []
    for paragraph in article["paragraphs"]:
      qas = [qa for qa in paragraph["qas"] if str(qa["id"]) in qids]
      if qas:
        paragraphs.append({**paragraph, "qas": qas})
    if paragraphs:
      out.append({**article, "paragraphs": paragraphs})
  return out
