"""Start/end logits of every window -> one answer text per question (run_squad.py's logic).

Per question: in each of its windows take the ``n_best_size`` highest start and end logits and
keep the pairs that lie in the context, end at or after the start, span at most
``max_answer_length`` pieces, and start at a piece this window is the "max context" window for;
rank them by start + end logit across windows. Each candidate's pieces are turned back into the
original text of the context ("get_final_text": find the de-tokenised prediction inside the
normalised text of the whitespace words it spans and map its characters back, so "(1895-1943)."
gives "1895", with the original's case and accents). SQuAD v2.0 adds the null answer scored at
[CLS] (start + end logit at position 0, the minimum over windows); the question is predicted
unanswerable when ``null score - best non-null score > null_score_diff_threshold``, and that
difference is written to ``null_odds.json`` for the official script's threshold search.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax.tasks.squad.examples import SquadExample
from bert_jax.tasks.squad.features import SquadFeature

# null_odds of a question without any non-null candidate: it is predicted "" at any threshold.
NO_CANDIDATE_NULL_ODDS = 1e9


@dataclasses.dataclass
class SquadPredictions:
  """The contents of the prediction files, keyed by question id.

  Attributes:
    predictions: predictions.json (v2: "" where predicted unanswerable).
    nbest: nbest_predictions.json: up to n_best_size entries of text, probability, start_logit,
      end_logit, best first.
    null_odds: null_odds.json (v2 only, else {}): null score minus best non-null score.
    best_non_null: (v2) the best non-null answer, whatever the threshold (to tune it).
  """

  predictions: dict[str, str]
  nbest: dict[str, list[dict[str, Any]]]
  null_odds: dict[str, float]
  best_non_null: dict[str, str]


def detokenize(tokens: Sequence[str], tokenizer: Any) -> str:
  """Pieces -> text with one space between words ("##"/"\u2581" markers removed)."""
  out = []
  for token in tokens:
    piece = token[2:] if token.startswith("##") else token.lstrip("\u2581")
    if out and tokenizer.is_word_start(token):
      out.append(" ")
    out.append(piece)
  return " ".join("".join(out).split())


def _strip_spaces(text: str) -> tuple[str, list[int]]:
  """text without spaces, and for each of its characters the index in ``text``."""
  chars, index = [], []
  for i, c in enumerate(text):
    if c != " ":
      chars.append(c)
      index.append(i)
  return "".join(chars), index


def get_final_text(pred_text: str, orig_text: str, tokenizer: Any) -> str:
  """The part of ``orig_text`` (original words) that the de-tokenised ``pred_text`` covers.

  ``orig_text`` is normalised as the tokenizer sees it (lower-casing, accent stripping,
  punctuation split) and de-tokenised the same way as the prediction; ``pred_text`` is found in
  it, and its first and last characters are mapped back through the space-free texts. When the
  two space-free texts differ in length (normalisation changed the characters' count) or the
  prediction is not found, the whole ``orig_text`` is returned, as in the original.
  """
  tok_text = detokenize(tokenizer.tokenize(orig_text), tokenizer)
  start = tok_text.find(pred_text)
  if start == -1:
    return orig_text
  end = start + len(pred_text) - 1
  orig_ns, orig_ns_to_s = _strip_spaces(orig_text)
  tok_ns, tok_ns_to_s = _strip_spaces(tok_text)
  if len(orig_ns) != len(tok_ns):
    return orig_text
  tok_s_to_ns = {s: ns for ns, s in enumerate(tok_ns_to_s)}
  if start not in tok_s_to_ns or end not in tok_s_to_ns:
    return orig_text
  return orig_text[orig_ns_to_s[tok_s_to_ns[start]] : orig_ns_to_s[tok_s_to_ns[end]] + 1]


def _best_indexes(logits_L: np.ndarray, n: int) -> np.ndarray:
  return np.argsort(-logits_L, kind="stable")[:n]


def _softmax(scores: Sequence[float]) -> list[float]:
  if not scores:
    return []
  x = np.asarray(scores, np.float64)
  e = np.exp(x - x.max())
  return (e / e.sum()).tolist()


def compute_predictions(
  examples: Sequence[SquadExample],
  features: Sequence[SquadFeature],
  start_logits_NxL: np.ndarray,
  end_logits_NxL: np.ndarray,
  tokenizer: Any,
  n_best_size: int = 20,
  max_answer_length: int = 30,
  version_2_with_negative: bool = False,
  null_score_diff_threshold: float = 0.0,
) -> SquadPredictions:
  """Predictions for every example from the logits of its windows (rows aligned to features)."""
  start_logits_NxL = np.asarray(start_logits_NxL, np.float32)
  end_logits_NxL = np.asarray(end_logits_NxL, np.float32)
  if start_logits_NxL.shape[0] != len(features) or end_logits_NxL.shape[0] != len(features):
    raise ValueError(
      f"{len(features)} features but logits for {start_logits_NxL.shape[0]} / "
      f"{end_logits_NxL.shape[0]} rows"
    )
  by_example: dict[int, list[int]] = {}
  for row, feature in enumerate(features):
    by_example.setdefault(feature.example_index, []).append(row)
  out = SquadPredictions({}, {}, {}, {})
  final_text_cache: dict[tuple[str, str], str] = {}
  for example_index, example in enumerate(examples):
    prelim = []  # (score, order, row, start, end, start_logit, end_logit)
    score_null, null_row = None, None
    for row in by_example.get(example_index, []):
      feature = features[row]
      s_L, e_L = start_logits_NxL[row], end_logits_NxL[row]
      if version_2_with_negative:
        null_score = float(s_L[0]) + float(e_L[0])
        if score_null is None or null_score < score_null:
          score_null, null_row = null_score, row
      starts, ends = _best_indexes(s_L, n_best_size), _best_indexes(e_L, n_best_size)
      ok_start = feature.in_context(starts)
      ok_start[ok_start] = feature.max_context[starts[ok_start] - feature.context_offset]
      length = ends[None, :] - starts[:, None] + 1
      ok = (
        ok_start[:, None]
        & feature.in_context(ends)[None, :]
        & (length >= 1)
        & (length <= max_answer_length)
      )
      for i, j in zip(*np.nonzero(ok)):  # start-major, as the original's nested loops
        start, end = int(starts[i]), int(ends[j])
        prelim.append(
          (
            float(s_L[start]) + float(e_L[end]),
            len(prelim),
            row,
            start,
            end,
            float(s_L[start]),
            float(e_L[end]),
          )
        )
    if null_row is not None:
      prelim.append(
        (
          score_null,
          len(prelim),
          null_row,
          0,
          0,
          float(start_logits_NxL[null_row, 0]),
          float(end_logits_NxL[null_row, 0]),
        )
      )
    prelim.sort(key=lambda p: (-p[0], p[1]))

    nbest, seen = [], set()
    for _, _, row, start, end, start_logit, end_logit in prelim:
      if len(nbest) >= n_best_size:
        break
      if start > 0:
        feature = features[row]
        pred_text = detokenize(feature.pieces(start, end), tokenizer)
        orig_text = " ".join(
          example.doc_tokens[feature.word_index(start) : feature.word_index(end) + 1]
        )
        key = (pred_text, orig_text)
        if key not in final_text_cache:
          final_text_cache[key] = get_final_text(pred_text, orig_text, tokenizer)
        text = final_text_cache[key]
      else:
        text = ""
      if text in seen:
        continue
      seen.add(text)
      nbest.append((text, start_logit, end_logit))
    if version_2_with_negative and "" not in seen and null_row is not None:
      nbest.append(("", float(start_logits_NxL[null_row, 0]), float(end_logits_NxL[null_row, 0])))
    if not nbest:
      nbest.append(("empty", 0.0, 0.0))

    probs = _softmax([s + e for _, s, e in nbest])
    out.nbest[example.qas_id] = [
      {"text": t, "probability": p, "start_logit": s, "end_logit": e}
      for (t, s, e), p in zip(nbest, probs)
    ]
    if not version_2_with_negative:
      out.predictions[example.qas_id] = nbest[0][0]
      continue
    best = next(((t, s, e) for t, s, e in nbest if t), None)
    if best is None or score_null is None:
      out.null_odds[example.qas_id] = NO_CANDIDATE_NULL_ODDS
      out.best_non_null[example.qas_id] = "" if best is None else best[0]
      out.predictions[example.qas_id] = "" if best is None else best[0]
      continue
    score_diff = score_null - best[1] - best[2]
    out.null_odds[example.qas_id] = score_diff
    out.best_non_null[example.qas_id] = best[0]
    out.predictions[example.qas_id] = "" if score_diff > null_score_diff_threshold else best[0]
  return out


def write_prediction_files(
  preds: SquadPredictions, out_dir: str, prefix: str = "", version_2_with_negative: bool = False
) -> list[str]:
  """Writes predictions.json, nbest_predictions.json and (v2) null_odds.json; their paths."""
  os.makedirs(out_dir, exist_ok=True)
  files = {"predictions.json": preds.predictions, "nbest_predictions.json": preds.nbest}
  if version_2_with_negative:
    files["null_odds.json"] = preds.null_odds
  paths = []
  for name, content in files.items():
    path = os.path.join(out_dir, prefix + name)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(content, f, indent=2, ensure_ascii=False)
      f.write("\n")
    os.replace(tmp, path)
    paths.append(path)
  return paths
