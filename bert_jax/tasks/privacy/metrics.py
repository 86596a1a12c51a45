"""The privacy probe's metrics (Coavoux, Narayan and Cohen 2018, section 4.2), in numpy.

An attacker predicts a vector z of K binary private attributes for every example; ``z_NxK`` and
``pred_NxK`` are 0/1 arrays. For one split:

``per_attribute``  for each attribute k: accuracy, precision, recall and F1 of the positive class
                   (value 1), the number of gold positives (``support``) and of rows; precision
                   is null (None) where the attacker predicts no positive (a ratio over no
                   prediction).
``mean_accuracy``  X, the mean over the K attributes of their accuracy.
``f1_micro``       F, the F-score "computed over the set of binary variables in z" (the seed's
                   words): true positives, false positives and false negatives pooled over every
                   (example, attribute) cell, ``F = 2 TP / (2 TP + FP + FN)``.
``f1_macro``       the mean of the K attributes' F1 (reported, not used for privacy).
``privacy``        ``1 - X`` for a metric "accuracy" (demographic-style attributes, each example
                   has one value of each) or ``1 - F`` (micro) for "f1" (presence attributes).

Every attribute must have at least one gold positive in the split: an attribute without one
is refused with an error naming it and the split (its recall and F1, and a privacy figure that
includes it, would be computed from zero positives: 1 - F = 1 from nothing to find).

Baselines: ``majority_predictions`` predicts each attribute's most frequent value on the
attacker's training rows (a tie predicts 0), for every row: the seed's "most frequent class"
lower bound on the attacker (the upper bound on privacy).

Model selection: ``select_epoch`` keeps the epoch with the worst privacy on dev (the most
successful attacker); the earliest such epoch on a tie.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax.tasks.privacy.attributes import check_support

PRIVACY_METRICS = ("accuracy", "f1")


def _check(z_NxK: np.ndarray, pred_NxK: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  z, p = np.asarray(z_NxK), np.asarray(pred_NxK)
  if z.ndim != 2 or z.shape != p.shape:
    raise ValueError(f"attributes {z.shape} and predictions {p.shape} must be equal N x K shapes")
  for name, a in (("attributes", z), ("predictions", p)):
    if a.size and not np.isin(a, (0, 1)).all():
      raise ValueError(f"{name} must be 0/1, got values {sorted(set(np.unique(a).tolist()))}")
  return z.astype(bool), p.astype(bool)


def _f1(tp: int, fp: int, fn: int) -> float:
  return 2.0 * tp / (2 * tp + fp + fn)  # tp + fn > 0: every attribute has a gold positive


def attack_metrics(
  z_NxK: np.ndarray,
  pred_NxK: np.ndarray,
  names: Sequence[str],
  privacy_metric: str,
  where: str = "the split",
) -> dict[str, Any]:
  """The attacker's metrics on one split, ``where`` (see the module docstring)."""
  if privacy_metric not in PRIVACY_METRICS:
    raise ValueError(f"privacy metric {privacy_metric!r} is not one of {PRIVACY_METRICS}")
  z, p = _check(z_NxK, pred_NxK)
  if z.shape[1] != len(names):
    raise ValueError(f"{z.shape[1]} attribute columns but {len(names)} names {list(names)}")
  if z.shape[0] == 0:
    raise ValueError(f"{where}: no rows to evaluate the attacker on")
  check_support(z, names, where)
  tp_K = (z & p).sum(0)
  fp_K = (~z & p).sum(0)
  fn_K = (z & ~p).sum(0)
  acc_K = (z == p).mean(0)
  per = {}
  for k, name in enumerate(names):
    tp, fp, fn = int(tp_K[k]), int(fp_K[k]), int(fn_K[k])
    per[name] = {
      "accuracy": float(acc_K[k]),
      "precision": tp / (tp + fp) if tp + fp else None,
      "recall": tp / (tp + fn),
      "f1": _f1(tp, fp, fn),
      "support": tp + fn,
      "rows": int(z.shape[0]),
    }
  mean_accuracy = float(acc_K.mean())
  f1_micro = _f1(int(tp_K.sum()), int(fp_K.sum()), int(fn_K.sum()))
  x = mean_accuracy if privacy_metric == "accuracy" else f1_micro
  return {
    "privacy": 1.0 - x,
    "privacy_metric": privacy_metric,
    "mean_accuracy": mean_accuracy,
    "f1_micro": f1_micro,
    "f1_macro": float(np.mean([v["f1"] for v in per.values()])),
    "per_attribute": per,
  }


def majority_values(z_train_NxK: np.ndarray) -> np.ndarray:
  """int32 [K]: each attribute's most frequent value on the attacker's training rows (0 on a
  tie)."""
  z = np.asarray(z_train_NxK)
  if z.ndim != 2 or z.shape[0] == 0:
    raise ValueError(f"need a non-empty N x K attribute matrix, got shape {z.shape}")
  return (2 * z.sum(0) > z.shape[0]).astype(np.int32)


def majority_predictions(z_train_NxK: np.ndarray, num_rows: int) -> np.ndarray:
  """int32 [num_rows, K]: the most-frequent-class attacker's predictions."""
  return np.tile(majority_values(z_train_NxK), (num_rows, 1))


def select_epoch(dev_privacy: Sequence[float]) -> int:
  """Index of the epoch with the worst (lowest) privacy on dev; the earliest on a tie."""
  values = np.asarray(dev_privacy, np.float64)
  if values.size == 0:
    raise ValueError("no epochs to select from")
  return int(np.argmin(values))
