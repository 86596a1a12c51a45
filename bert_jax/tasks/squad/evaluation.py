"""Exact match and F1 as the official SQuAD v1.1 and v2.0 evaluation scripts compute them.

Both take the dataset's ``data`` list (articles -> paragraphs -> qas) and predictions keyed by
question id, and return what the official script prints:

* v1.1 (``evaluate_v1``): answers normalised (lower case, punctuation and the articles a/an/the
  removed, whitespace collapsed); EM and bag-of-tokens F1 of the prediction against each gold
  answer, the max over gold answers; a question without a prediction scores 0. Returns
  {"exact_match", "f1"} in percent.
* v2.0 (``evaluate_v2``): gold answers that normalise to "" are dropped and an unanswerable
  question's gold is [""], so predicting "" scores 1 there and 0 where there is an answer; F1
  with an empty side is 1 only if both are empty. ``na_probs`` (the null_odds.json values) above
  ``na_prob_thresh`` turn a prediction into "no answer". Returns {"exact", "f1", "total"}, the
  "HasAns_*" and "NoAns_*" breakdown, and with ``na_probs`` the best thresholds
  ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh") found by sweeping the
  threshold over the questions sorted by ``na_probs``, as ``find_best_thresh`` does. A question
  id that occurs twice counts once (the last occurrence), as in the official script's dicts.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from bert_jax.tasks.squad.examples import SquadFormatError, load_squad_json

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
  """Lower case, drop punctuation, drop articles, collapse whitespace (both scripts)."""
  s = s.lower()
  s = "".join(c for c in s if c not in _PUNCTUATION)
  s = _ARTICLES.sub(" ", s)
  return " ".join(s.split())


def _iter_qas(dataset: Sequence[Mapping[str, Any]]):
  for article in dataset:
    for paragraph in article["paragraphs"]:
      yield from paragraph["qas"]


# ---------------------------------------------------------------- v1.1


def f1_score_v1(prediction: str, ground_truth: str) -> float:
  pred_tokens = normalize_answer(prediction).split()
  gold_tokens = normalize_answer(ground_truth).split()
  num_same = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
  if num_same == 0:
    return 0.0
  precision, recall = num_same / len(pred_tokens), num_same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def exact_match_score_v1(prediction: str, ground_truth: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def evaluate_v1(
  dataset: Sequence[Mapping[str, Any]], predictions: Mapping[str, str]
) -> dict[str, float]:
  """The official v1.1 script's {"exact_match", "f1"} (percent)."""
  exact = f1 = 0.0
  total = 0
  for qa in _iter_qas(dataset):
    total += 1
    if qa["id"] not in predictions:
      continue  # the official script prints "Unanswered question" and scores it 0
    golds = [a["text"] for a in qa["answers"]]
    pred = predictions[qa["id"]]
    exact += max(exact_match_score_v1(pred, g) for g in golds)
    f1 += max(f1_score_v1(pred, g) for g in golds)
  total = max(total, 1)
  return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


# ---------------------------------------------------------------- v2.0


def get_tokens(s: str) -> list[str]:
  return normalize_answer(s).split() if s else []


def compute_exact(a_gold: str, a_pred: str) -> int:
  return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
  gold, pred = get_tokens(a_gold), get_tokens(a_pred)
  if not gold or not pred:
    return float(gold == pred)
  num_same = sum((collections.Counter(gold) & collections.Counter(pred)).values())
  if num_same == 0:
    return 0.0
  precision, recall = num_same / len(pred), num_same / len(gold)
  return 2 * precision * recall / (precision + recall)


def qid_to_has_ans(dataset: Sequence[Mapping[str, Any]]) -> dict[str, bool]:
  return {qa["id"]: bool(qa["answers"]) for qa in _iter_qas(dataset)}


def get_raw_scores(
  dataset: Sequence[Mapping[str, Any]], preds: Mapping[str, str]
) -> tuple[dict[str, float], dict[str, float]]:
  """Per question id: max EM and max F1 over its (non-empty-normalised) gold answers."""
  exact, f1 = {}, {}
  for qa in _iter_qas(dataset):
    qid = qa["id"]
    golds = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])] or [""]
    if qid not in preds:
      continue  # the official script prints "Missing prediction"
    exact[qid] = max(compute_exact(g, preds[qid]) for g in golds)
    f1[qid] = max(compute_f1(g, preds[qid]) for g in golds)
  return exact, f1


def apply_no_ans_threshold(
  scores: Mapping[str, float],
  na_probs: Mapping[str, float],
  has_ans: Mapping[str, bool],
  na_prob_thresh: float,
) -> dict[str, float]:
  return {
    qid: float(not has_ans[qid]) if na_probs[qid] > na_prob_thresh else s
    for qid, s in scores.items()
  }


def make_eval_dict(
  exact: Mapping[str, float], f1: Mapping[str, float], qid_list: Sequence[str] | None = None
) -> dict[str, float]:
  if not qid_list:
    total = len(exact)
    return {
      "exact": 100.0 * sum(exact.values()) / total,
      "f1": 100.0 * sum(f1.values()) / total,
      "total": total,
    }
  total = len(qid_list)
  return {
    "exact": 100.0 * sum(exact[k] for k in qid_list) / total,
    "f1": 100.0 * sum(f1[k] for k in qid_list) / total,
    "total": total,
  }


def find_best_thresh(
  preds: Mapping[str, str],
  scores: Mapping[str, float],
  na_probs: Mapping[str, float],
  has_ans: Mapping[str, bool],
) -> tuple[float, float]:
  """(best score in percent, its threshold): predict "" for questions with na_prob > thresh."""
  cur = best = float(sum(1 for v in has_ans.values() if not v))
  best_thresh = 0.0
  for qid in sorted(na_probs, key=lambda k: na_probs[k]):
    if qid not in scores:
      continue
    if has_ans[qid]:
      diff = scores[qid]
    else:
      diff = -1 if preds[qid] else 0
    cur += diff
    if cur > best:
      best, best_thresh = cur, na_probs[qid]
  return 100.0 * best / len(scores), best_thresh


def evaluate_v2(
  dataset: Sequence[Mapping[str, Any]],
  preds: Mapping[str, str],
  na_probs: Mapping[str, float] | None = None,
  na_prob_thresh: float = 1.0,
) -> dict[str, float]:
  """The official v2.0 script's output dict (see the module docstring)."""
  has_ans = qid_to_has_ans(dataset)
  missing = [k for k in has_ans if k not in preds]
  if missing:  # the official script fails on these (KeyError); say which
    raise ValueError(
      f"no prediction for {len(missing)} of {len(has_ans)} questions (e.g. "
      f"{missing[:3]}); SQuAD v2.0 scoring needs one per question "
      '("" = no answer)'
    )
  probs = na_probs if na_probs is not None else {k: 0.0 for k in preds}
  missing = [k for k in preds if k not in probs]
  if missing:
    raise ValueError(
      f"no na_prob (null odds) for {len(missing)} predicted questions (e.g. {missing[:3]})"
    )
  has_ans_qids = [k for k, v in has_ans.items() if v]
  no_ans_qids = [k for k, v in has_ans.items() if not v]
  exact_raw, f1_raw = get_raw_scores(dataset, preds)
  exact_thresh = apply_no_ans_threshold(exact_raw, probs, has_ans, na_prob_thresh)
  f1_thresh = apply_no_ans_threshold(f1_raw, probs, has_ans, na_prob_thresh)
  out = make_eval_dict(exact_thresh, f1_thresh)
  for prefix, qids in (("HasAns", has_ans_qids), ("NoAns", no_ans_qids)):
    if qids:
      for k, v in make_eval_dict(exact_thresh, f1_thresh, qid_list=qids).items():
        out[f"{prefix}_{k}"] = v
  if na_probs is not None:
    out["best_exact"], out["best_exact_thresh"] = find_best_thresh(
      preds, exact_raw, na_probs, has_ans
    )
    out["best_f1"], out["best_f1_thresh"] = find_best_thresh(preds, f1_raw, na_probs, has_ans)
  return out


# ---------------------------------------------------------------- command line


def _read_json_object(path: str, what: str) -> dict[str, Any]:
  try:
    with open(path, encoding="utf-8") as f:
      obj = json.load(f)
  except OSError as e:
    raise SystemExit(f"{path}: cannot read the {what}: {e.strerror}") from None
  except json.JSONDecodeError as e:
    raise SystemExit(
      f"{path}:{e.lineno}:{e.colno}: the {what} is not valid JSON ({e.msg})"
    ) from None
  if not isinstance(obj, dict):
    raise SystemExit(f"{path}: the {what} must be a JSON object keyed by question id")
  return obj


def is_v2_dataset(dataset: Sequence[Mapping[str, Any]]) -> bool:
  """Whether a dataset has unanswerable questions (SQuAD v2.0)."""
  return any("is_impossible" in qa for qa in _iter_qas(dataset))


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
  """``python -m bert_jax.tasks.squad.evaluation DATA.json predictions.json [--na-prob-file ...]``.

  The official scripts' command line: prints their JSON (v1.1 or v2.0 logic, chosen by whether
  the data file has unanswerable questions, or by --version).
  """
  parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
  parser.add_argument("data_file", help="SQuAD JSON (e.g. dev-v2.0.json)")
  parser.add_argument("pred_file", help="predictions.json: {question id: answer text}")
  parser.add_argument("--version", choices=("1.1", "2.0"), default=None)
  parser.add_argument("--na-prob-file", default=None, help="null_odds.json (v2.0)")
  parser.add_argument(
    "--na-prob-thresh",
    type=float,
    default=1.0,
    help="predict no answer above this na_prob (v2.0; the official default)",
  )
  args = parser.parse_args(argv)
  try:
    dataset = load_squad_json(args.data_file)
  except SquadFormatError as e:
    raise SystemExit(str(e)) from None
  preds = _read_json_object(args.pred_file, "predictions file")
  v2 = is_v2_dataset(dataset) if args.version is None else args.version == "2.0"
  if not v2:
    out = evaluate_v1(dataset, preds)
  else:
    na_probs = _read_json_object(args.na_prob_file, "na-prob file") if args.na_prob_file else None
    try:
      out = evaluate_v2(dataset, preds, na_probs, args.na_prob_thresh)
    except ValueError as e:
      raise SystemExit(f"{args.pred_file}: {e}") from None
  print(json.dumps(out, indent=2))
  return out


if __name__ == "__main__":
  main()
