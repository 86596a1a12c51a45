"""EM / F1 against an independent transcription of the official SQuAD v1.1 and v2.0 scripts.

The reference below is written in this file from the official scripts' definitions (normalise:
lower, strip string.punctuation, articles by the regex \\b(a|an|the)\\b, collapse whitespace;
F1 over token multisets; max over gold answers; v2.0's empty-gold / no-answer rules and the
threshold sweep) with its own code, and compared on perturbed predictions for every question of
the shared samples; plus hand-computed cases.
"""

import collections
import json
import re
import string

import numpy as np
import pytest

from bert_jax.tasks.squad import evaluation as squad_eval
from bert_jax.tasks.squad.postprocess import SquadPredictions
from bert_jax.tasks.squad.task import squad_metrics

SAMPLES = ["sample-v1.1.json", "sample-v2.0.json", "sample2-v2.0.json"]


# ------------------------------------------------------------------ reference transcription
def ref_norm(text):
  text = "".join(c for c in text.lower() if c not in set(string.punctuation))
  text = re.sub(r"\b(a|an|the)\b", " ", text)
  return " ".join(text.split())


def ref_f1(gold_toks, pred_toks):
  overlap = collections.Counter(gold_toks)
  overlap &= collections.Counter(pred_toks)
  same = sum(overlap.values())
  if same == 0:
    return 0.0
  p = same / len(pred_toks)
  r = same / len(gold_toks)
  return 2 * p * r / (p + r)


def ref_v1(dataset, preds):
  rows = []
  for art in dataset:
    for par in art["paragraphs"]:
      for qa in par["qas"]:
        if qa["id"] not in preds:
          rows.append((0.0, 0.0))
          continue
        pred = preds[qa["id"]]
        ems = [float(ref_norm(pred) == ref_norm(a["text"])) for a in qa["answers"]]
        f1s = [ref_f1(ref_norm(a["text"]).split(), ref_norm(pred).split()) for a in qa["answers"]]
        rows.append((max(ems), max(f1s)))
  em, f1 = np.mean(np.array(rows), axis=0) * 100
  return {"exact_match": em, "f1": f1}


def ref_v2_raw(dataset, preds):
  """qid -> (has_answer, exact, f1); a repeated id keeps its last occurrence."""
  out = {}
  for art in dataset:
    for par in art["paragraphs"]:
      for qa in par["qas"]:
        golds = [a["text"] for a in qa["answers"] if ref_norm(a["text"])] or [""]
        pred = preds.get(qa["id"])
        if pred is None:
          continue
        ems, f1s = [], []
        for g in golds:
          gt = ref_norm(g).split() if g else []
          pt = ref_norm(pred).split() if pred else []
          ems.append(int(ref_norm(g) == ref_norm(pred)))
          f1s.append(float(gt == pt) if not gt or not pt else ref_f1(gt, pt))
        out[qa["id"]] = (bool(qa["answers"]), max(ems), max(f1s))
  return out


def ref_v2(dataset, preds, na_probs, thresh):
  raw = ref_v2_raw(dataset, preds)
  has_ans = {}
  for art in dataset:
    for par in art["paragraphs"]:
      for qa in par["qas"]:
        has_ans[qa["id"]] = bool(qa["answers"])
  scored = raw

  def final(q, i):
    return float(not has_ans[q]) if na_probs[q] > thresh else scored[q][i]

  out = {
    "exact": 100 * np.mean([final(q, 1) for q in scored]),
    "f1": 100 * np.mean([final(q, 2) for q in scored]),
    "total": len(scored),
  }
  for name, keep in (("HasAns", True), ("NoAns", False)):
    qids = [q for q, h in has_ans.items() if h == keep]
    if qids:
      out[f"{name}_exact"] = 100 * sum(final(q, 1) for q in qids) / len(qids)
      out[f"{name}_f1"] = 100 * sum(final(q, 2) for q in qids) / len(qids)
      out[f"{name}_total"] = len(qids)
  for name, i in (("exact", 1), ("f1", 2)):
    # Sweep: start from "everything is no-answer"; admit questions by increasing na_prob.
    score = best = sum(1 for h in has_ans.values() if not h)
    best_t = 0.0
    for q in sorted(na_probs, key=na_probs.get):
      if q not in scored:
        continue
      score += scored[q][i] if has_ans[q] else (-1 if preds[q] else 0)
      if score > best:
        best, best_t = score, na_probs[q]
    out[f"best_{name}"] = 100 * best / len(scored)
    out[f"best_{name}_thresh"] = best_t
  return out


# ------------------------------------------------------------------ perturbed predictions
def perturbed_predictions(dataset, seed):
  rng = np.random.default_rng(seed)
  preds = {}
  for art in dataset:
    for par in art["paragraphs"]:
      words = par["context"].split()
      for qa in par["qas"]:
        gold = qa["answers"][0]["text"] if qa["answers"] else ""
        i, j = sorted(rng.integers(0, len(words), 2))
        choice = rng.integers(0, 8)
        if choice == 0 and gold:
          pred = gold
        elif choice == 1 and gold:
          pred = "The " + gold.upper() + "!!"
        elif choice == 2 and gold:
          pred = " ".join(gold.split()[: max(1, len(gold.split()) // 2)])
        elif choice == 3:
          pred = ""
        elif choice == 4 and gold:
          pred = words[max(0, i - 2)] + " " + gold + " " + words[j]
        elif choice == 5:
          continue  # no prediction for this question
        else:
          pred = " ".join(words[i : j + 1][:6])
        preds[qa["id"]] = pred
  return preds


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", SAMPLES)
def test_matches_reference_on_shared_samples(shared_data, name, seed):
  dataset = json.loads((shared_data / "squad" / name).read_text())["data"]
  preds = perturbed_predictions(dataset, seed)
  got = squad_eval.evaluate_v1(dataset, preds) if "v1" in name else None
  if got is not None:
    assert got == pytest.approx(ref_v1(dataset, preds))
    return
  preds_all = {
    **{qa["id"]: "" for a in dataset for p in a["paragraphs"] for qa in p["qas"]},
    **preds,
  }  # the official v2 script needs a prediction for every HasAns question
  rng = np.random.default_rng(100 + seed)
  na_probs = {q: float(rng.normal()) for q in preds_all}
  for thresh in (1.0, 0.0, -0.5):
    assert squad_eval.evaluate_v2(dataset, preds_all, na_probs, thresh) == pytest.approx(
      ref_v2(dataset, preds_all, na_probs, thresh)
    )
  no_probs = squad_eval.evaluate_v2(dataset, preds_all)
  ref = ref_v2(dataset, preds_all, {q: 0.0 for q in preds_all}, 1.0)
  assert no_probs == pytest.approx({k: v for k, v in ref.items() if not k.startswith("best")})


def test_hand_computed_v1():
  dataset = [
    {
      "paragraphs": [
        {
          "context": "",
          "qas": [
            {"id": "a", "answers": [{"text": "Denver Broncos"}, {"text": "The Denver Broncos"}]},
            {"id": "b", "answers": [{"text": "Denver Broncos"}]},
            {"id": "c", "answers": [{"text": "Santa Clara, California"}]},
            {"id": "d", "answers": [{"text": "1882"}]},
          ],
        }
      ]
    }
  ]
  preds = {"a": "the denver broncos!", "b": "Broncos", "c": "Levi's Stadium, Santa Clara"}
  # a: EM 1, F1 1. b: EM 0, F1 2*(1*0.5)/1.5 = 2/3. c: pred {levis, stadium, santa, clara} vs
  # gold {santa, clara, california}: 2 common, P 2/4 R 2/3 -> F1 4/7. d: missing -> 0.
  got = squad_eval.evaluate_v1(dataset, preds)
  assert got["exact_match"] == pytest.approx(25.0)
  assert got["f1"] == pytest.approx(100 * (1 + 2 / 3 + 4 / 7 + 0) / 4)


def test_hand_computed_v2_and_threshold_search():
  dataset = [
    {
      "paragraphs": [
        {
          "context": "",
          "qas": [
            {"id": "q1", "answers": [{"text": "Paris"}]},
            {"id": "q2", "answers": [{"text": "the Seine river"}]},
            {"id": "q3", "answers": []},
            {"id": "q4", "answers": []},
            {"id": "q5", "answers": [{"text": "a"}]},
          ],
        }
      ]
    }
  ]  # gold normalising to "" counts as no gold
  preds = {"q1": "Paris", "q2": "Loire river", "q3": "x", "q4": "", "q5": ""}
  got = squad_eval.evaluate_v2(dataset, preds)
  # EM: q1 1, q2 0, q3 0, q4 1 (empty vs no answer), q5 1 (gold "a" -> [""]).
  # F1: q1 1, q2 {river} vs {seine, river}: P 1/2 R 1/2 -> 1/2, q3 0, q4 1, q5 1.
  assert got["exact"] == pytest.approx(60.0) and got["f1"] == pytest.approx(70.0)
  assert got["HasAns_total"] == 3 and got["NoAns_total"] == 2
  assert got["HasAns_f1"] == pytest.approx(100 * 2.5 / 3)
  assert got["NoAns_exact"] == pytest.approx(50.0)
  # Threshold sweep (by hand): start with everything "no answer" = 2 correct (q3, q4) of 5;
  # admit by increasing na_prob: q1 (0.1) +1 -> 3; q3 (0.3) -1 -> 2; q2 (0.5) +0 -> 2;
  # q4 (0.7) +0; q5 (0.9) +1 -> 3 (not > 3): best 3/5 at 0.1.
  na = {"q1": 0.1, "q3": 0.3, "q2": 0.5, "q4": 0.7, "q5": 0.9}
  got = squad_eval.evaluate_v2(dataset, preds, na, na_prob_thresh=0.6)
  assert got["best_exact"] == pytest.approx(60.0) and got["best_exact_thresh"] == 0.1
  # Threshold 0.6: q4 and q5 become "no answer": q4 right, q5 has an answer -> 0.
  assert got["exact"] == pytest.approx(100 * (1 + 0 + 0 + 1 + 0) / 5)


def test_tuned_threshold_is_the_best_and_reproducible():
  """squad_metrics' tuned threshold, applied to the non-null answers, gives tuned_f1."""
  rng = np.random.default_rng(0)
  qas, best_non_null, null_odds = [], {}, {}
  for i in range(40):
    has = bool(i % 3)
    qas.append({"id": f"q{i}", "answers": [{"text": f"answer {i}"}] if has else []})
    right = rng.random() < 0.7
    best_non_null[f"q{i}"] = f"answer {i}" if right else f"wrong {i}"
    null_odds[f"q{i}"] = float(rng.normal() + (0 if has else 1.5))
  dataset = [{"paragraphs": [{"context": "", "qas": qas}]}]
  preds = {q: ("" if null_odds[q] > 0.0 else t) for q, t in best_non_null.items()}
  metrics = squad_metrics(dataset, SquadPredictions(preds, {}, null_odds, best_non_null), True)
  assert metrics["f1"] == pytest.approx(ref_v2(dataset, preds, null_odds, 0.0)["f1"])
  t = metrics["tuned_f1_thresh"]
  at_t = {q: ("" if null_odds[q] > t else a) for q, a in best_non_null.items()}
  assert squad_eval.evaluate_v2(dataset, at_t)["f1"] == pytest.approx(metrics["tuned_f1"])
  for other in sorted(null_odds.values()) + [-10.0, 10.0]:  # no threshold does better
    at_o = {q: ("" if null_odds[q] > other else a) for q, a in best_non_null.items()}
    assert squad_eval.evaluate_v2(dataset, at_o)["f1"] <= metrics["tuned_f1"] + 1e-9


def test_v2_missing_prediction_is_a_clear_error():
  dataset = [
    {
      "paragraphs": [
        {"context": "", "qas": [{"id": "q1", "answers": []}, {"id": "q2", "answers": []}]}
      ]
    }
  ]
  with pytest.raises(ValueError, match=r"no prediction for 1 of 2 questions.*'q2'"):
    squad_eval.evaluate_v2(dataset, {"q1": ""})


def test_command_line_like_the_official_scripts(shared_data, tmp_path, capsys):
  data = shared_data / "squad" / "sample-v2.0.json"
  dataset = json.loads(data.read_text())["data"]
  preds = perturbed_predictions(dataset, 3)
  preds = {
    qa["id"]: preds.get(qa["id"], "") for a in dataset for p in a["paragraphs"] for qa in p["qas"]
  }
  na = {q: i / 10 - 0.5 for i, q in enumerate(sorted(preds))}
  (tmp_path / "p.json").write_text(json.dumps(preds))
  (tmp_path / "na.json").write_text(json.dumps(na))
  out = squad_eval.main(
    [str(data), str(tmp_path / "p.json"), "--na-prob-file", str(tmp_path / "na.json")]
  )
  assert out == pytest.approx(ref_v2(dataset, preds, na, 1.0))
  assert json.loads(capsys.readouterr().out) == pytest.approx(out)
  v1 = shared_data / "squad" / "sample-v1.1.json"
  v1_preds = perturbed_predictions(json.loads(v1.read_text())["data"], 1)
  (tmp_path / "p1.json").write_text(json.dumps(v1_preds))
  assert squad_eval.main([str(v1), str(tmp_path / "p1.json")]) == pytest.approx(
    ref_v1(json.loads(v1.read_text())["data"], v1_preds)
  )
  (tmp_path / "bad.json").write_text('{"q": ')
  with pytest.raises(SystemExit, match=r"bad\.json:1:\d+: the predictions file is not valid"):
    squad_eval.main([str(data), str(tmp_path / "bad.json")])
