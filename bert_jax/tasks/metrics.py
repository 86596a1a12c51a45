"""Classification and regression metrics of GLUE, in numpy (checked against scikit-learn/scipy).

accuracy; binary F1 of the positive class (MRPC, QQP); Matthews correlation (CoLA); Pearson and
Spearman correlation (STS-B; Spearman with average ranks for ties, as scipy).
"""

from __future__ import annotations

import numpy as np


def _check(y_true, y_pred) -> tuple[np.ndarray, np.ndarray]:
  y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
  if y_true.shape != y_pred.shape or y_true.ndim != 1:
    raise ValueError(f"labels {y_true.shape} and predictions {y_pred.shape} must be equal 1-D")
  if not y_true.size:
    raise ValueError("no examples to score")
  return y_true, y_pred


def accuracy(y_true, y_pred) -> float:
  y_true, y_pred = _check(y_true, y_pred)
  return float(np.mean(y_true == y_pred))


def f1_binary(y_true, y_pred, positive=1) -> float:
  """F1 of the positive class; 0 when there are no true or predicted positives."""
  y_true, y_pred = _check(y_true, y_pred)
  tp = np.sum((y_pred == positive) & (y_true == positive))
  fp = np.sum((y_pred == positive) & (y_true != positive))
  fn = np.sum((y_pred != positive) & (y_true == positive))
  return float(2 * tp / (2 * tp + fp + fn)) if tp else 0.0


def matthews_corrcoef(y_true, y_pred) -> float:
  """Multi-class Matthews correlation (Gorodkin's R_K); 0 when undefined, as scikit-learn."""
  y_true, y_pred = _check(y_true, y_pred)
  classes, idx = np.unique(np.concatenate([y_true, y_pred]), return_inverse=True)
  k, n = len(classes), len(y_true)
  conf = np.zeros((k, k), np.float64)
  np.add.at(conf, (idx[:n], idx[n:]), 1)
  t_k, p_k = conf.sum(axis=1), conf.sum(axis=0)
  c, s = np.trace(conf), conf.sum()
  denom = np.sqrt((s * s - p_k @ p_k) * (s * s - t_k @ t_k))
  return float((c * s - t_k @ p_k) / denom) if denom else 0.0


def pearson(x, y) -> float:
  x, y = _check(x, y)
  x, y = x.astype(np.float64) - x.mean(), y.astype(np.float64) - y.mean()
  denom = np.sqrt((x * x).sum() * (y * y).sum())
  return float((x * y).sum() / denom) if denom else float("nan")


def average_ranks(x) -> np.ndarray:
  """1-based ranks, ties sharing their average rank."""
  x = np.asarray(x)
  order = np.argsort(x, kind="mergesort")
  sorted_x = x[order]
  first = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
  group = np.cumsum(first) - 1
  starts = np.flatnonzero(first)
  ends = np.r_[starts[1:], len(x)]
  avg = (starts + ends + 1) / 2.0  # mean of 1-based positions start+1 .. end
  ranks = np.empty(len(x), np.float64)
  ranks[order] = avg[group]
  return ranks


def spearman(x, y) -> float:
  x, y = _check(x, y)
  return pearson(average_ranks(x), average_ranks(y))
