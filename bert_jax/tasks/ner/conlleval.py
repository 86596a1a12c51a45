"""Entity-level precision, recall and F1 as the CoNLL shared task's ``conlleval`` script computes.

conlleval reads tags one token at a time and opens or closes a chunk from the previous and the
current tag (prefix B/I/E/S or O, and the entity type). The rules, from its endOfChunk and
startOfChunk subroutines:

- a chunk ends before this token when the previous prefix/current prefix pair is one of
  B-B, B-O, I-B, I-O, E-E, E-I, E-O, S-anything-but-nothing (S is a one-token chunk), or when the
  previous tag is a chunk tag (not O) whose type differs from the current type;
- a chunk starts at this token when the pair is B-after-anything, O-I, E-E, E-I, O-E, S, or when
  the current tag is a chunk tag whose type differs from the previous type.

So both IOB1 (a chunk may start with I-) and IOB2 are scored as conlleval does; sentence
boundaries close every chunk. A predicted chunk is correct when a gold chunk has the same
start, end and type. Precision = correct / predicted chunks, recall = correct / gold chunks,
F1 their harmonic mean (0 when undefined); ``accuracy`` is the token accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence


def split_tag(tag: str) -> tuple[str, str]:
  """("B", "PER") from "B-PER"; ("O", "") from "O"; a bare prefix-less type counts as I-type."""
  if tag == "O" or not tag:
    return "O", ""
  if len(tag) > 1 and tag[1] in "-_" and tag[0] in "BIESbies":
    return tag[0].upper(), tag[2:]
  return "I", tag


def _end_of_chunk(prev: str, prev_type: str, cur: str, cur_type: str) -> bool:
  if prev == "S":
    return True
  if (prev, cur) in {
    ("B", "B"),
    ("B", "O"),
    ("B", "S"),
    ("I", "B"),
    ("I", "O"),
    ("I", "S"),
    ("E", "E"),
    ("E", "I"),
    ("E", "O"),
    ("E", "B"),
    ("E", "S"),
  }:
    return True
  return prev != "O" and prev_type != cur_type


def _start_of_chunk(prev: str, prev_type: str, cur: str, cur_type: str) -> bool:
  if cur in ("B", "S"):
    return True
  if (prev, cur) in {("O", "I"), ("E", "E"), ("E", "I"), ("O", "E"), ("S", "I"), ("S", "E")}:
    return True
  return cur != "O" and prev_type != cur_type


def chunks(tags: Sequence[str]) -> set[tuple[str, int, int]]:
  """The set of (type, first, last) chunks of one sentence's tags, by conlleval's rules."""
  out = set()
  prev, prev_type, start = "O", "", None
  for i, tag in enumerate(list(tags) + ["O"]):
    cur, cur_type = split_tag(tag)
    if start is not None and _end_of_chunk(prev, prev_type, cur, cur_type):
      out.add((prev_type, start, i - 1))
      start = None
    if i < len(tags) and _start_of_chunk(prev, prev_type, cur, cur_type):
      start = i
    prev, prev_type = cur, cur_type
  return out


def _prf(correct: int, predicted: int, gold: int) -> dict[str, float]:
  p = correct / predicted if predicted else 0.0
  r = correct / gold if gold else 0.0
  f = 2 * p * r / (p + r) if p + r else 0.0
  return {"precision": p, "recall": r, "f1": f}


def conlleval(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict:
  """Overall and per-type scores for sentences of gold and predicted tags (same lengths).

  Returns {"precision", "recall", "f1", "accuracy", "per_type": {type: {precision, recall, f1,
  predicted, gold}}} with fractions in [0, 1].
  """
  if len(gold) != len(pred):
    raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted")
  correct_n = pred_n = gold_n = tok_ok = tok_n = 0
  per_type: dict[str, list[int]] = {}
  for i, (g, p) in enumerate(zip(gold, pred)):
    if len(g) != len(p):
      raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")
    gc, pc = chunks(g), chunks(p)
    both = gc & pc
    correct_n, pred_n, gold_n = correct_n + len(both), pred_n + len(pc), gold_n + len(gc)
    tok_ok += sum(a == b for a, b in zip(g, p))
    tok_n += len(g)
    for group, k in ((both, 0), (pc, 1), (gc, 2)):
      for t, _, _ in group:
        per_type.setdefault(t, [0, 0, 0])[k] += 1
  out = _prf(correct_n, pred_n, gold_n)
  out["accuracy"] = tok_ok / tok_n if tok_n else 0.0
  out["per_type"] = {
    t: {**_prf(*v), "predicted": v[1], "gold": v[2]} for t, v in sorted(per_type.items())
  }
  return out
