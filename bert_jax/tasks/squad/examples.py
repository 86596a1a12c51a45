"""Reading SQuAD v1.1 / v2.0 files (the official nested JSON) into whitespace-tokenised examples.

As google-research/bert's run_squad.py does: the context is split on whitespace into
``doc_tokens`` and every character is mapped to the index of the word it falls in, so that an
answer given as (``answer_start`` character offset, ``text``) becomes a word span.

Bad input:
  * a file that is not JSON, or JSON without the nested ``data -> paragraphs -> qas`` layout,
    raises ``SquadFormatError`` naming the file (and line/column, or the question id and key);
  * an answer whose ``answer_start`` does not point at its ``text`` is skipped with a warning,
    as the original does (training examples only; at evaluation every question is kept, since
    scoring uses the gold texts, not the offsets) and counted in ``stats["answer_mismatch"]``;
  * a question id seen twice is counted in ``stats["duplicate_ids"]``: predictions are keyed by
    id, so the last one wins, which is also what the official evaluation scripts score;
  * a file with no question to read (``"data": []``, or every training answer skipped) is an
    error naming the file: every file read is trained on or predicted.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from absl import logging

_WHITESPACE = (" ", "\t", "\r", "\n", "\u202f")


class SquadFormatError(ValueError):
  """A SQuAD file that cannot be read; the message names the file and where."""


@dataclasses.dataclass
class SquadExample:
  """One question about one paragraph.

  Attributes:
    qas_id: the question id (key of predictions.json).
    question_text: the question.
    doc_tokens: the context split on whitespace.
    answers: every gold answer text (scoring takes the max over them); [] when impossible.
    orig_answer_text: the first answer's text ("" when impossible or unknown).
    start_position, end_position: its word span in ``doc_tokens`` (inclusive; -1 when
      impossible or when the offset did not match).
    is_impossible: SQuAD v2.0's unanswerable question.
  """

  qas_id: str
  question_text: str
  doc_tokens: list[str]
  answers: list[str]
  orig_answer_text: str = ""
  start_position: int = -1
  end_position: int = -1
  is_impossible: bool = False


def split_on_whitespace(text: str) -> tuple[list[str], list[int]]:
  """(words, char_to_word): the whitespace-split words and, per character, its word's index."""
  words: list[str] = []
  char_to_word: list[int] = []
  prev_is_whitespace = True
  for c in text:
    if c in _WHITESPACE:
      prev_is_whitespace = True
    else:
      if prev_is_whitespace:
        words.append(c)
      else:
        words[-1] += c
      prev_is_whitespace = False
    char_to_word.append(len(words) - 1)
  return words, char_to_word


def load_squad_json(path: str) -> list[dict[str, Any]]:
  """The ``data`` list of a SQuAD file; a clear error naming the file when it is not one."""
  try:
    with open(path, encoding="utf-8") as f:
      dataset = json.load(f)
  except FileNotFoundError:
    raise SquadFormatError(f"{path}: SQuAD file not found") from None
  except json.JSONDecodeError as e:
    raise SquadFormatError(
      f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg}); expected the official SQuAD "
      'layout {"data": [{"paragraphs": [{"context": ..., "qas": [...]}]}]}'
    ) from None
  except UnicodeDecodeError as e:
    raise SquadFormatError(f"{path}: not UTF-8 text (byte {e.start}): {e.reason}") from None
  if not isinstance(dataset, dict) or not isinstance(dataset.get("data"), list):
    raise SquadFormatError(
      f'{path}: the top level must be an object with a "data" list (the official SQuAD layout)'
    )
  return dataset["data"]


def _get(obj: Any, key: str, kind: type | tuple[type, ...], path: str, where: str) -> Any:
  if not isinstance(obj, dict) or key not in obj:
    raise SquadFormatError(f"{path}: {where}: missing key {key!r}")
  value = obj[key]
  if not isinstance(value, kind):
    names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
    raise SquadFormatError(
      f"{path}: {where}: {key!r} should be a {names}, got {type(value).__name__}"
    )
  return value


def read_squad_examples(
  path: str, is_training: bool, version_2_with_negative: bool, stats: dict[str, int] | None = None
) -> list[SquadExample]:
  """Examples of a SQuAD file; ``stats`` (if given) receives the counts described above.

  For training, the first answer gives the target span (the original demands exactly one;
  taking the first also lets dev-style files with several answers train). Unanswerable
  questions (``is_impossible``) are only read as such when ``version_2_with_negative``; in a
  v1.1 run they are an error, naming the file and question id.
  """
  stats = {} if stats is None else stats
  for key in ("examples", "answer_mismatch", "duplicate_ids", "impossible"):
    stats.setdefault(key, 0)
  examples: list[SquadExample] = []
  seen: set[str] = set()
  for a, article in enumerate(load_squad_json(path)):
    paragraphs = _get(article, "paragraphs", list, path, f"data[{a}]")
    for p, paragraph in enumerate(paragraphs):
      where_p = f"data[{a}].paragraphs[{p}]"
      context = _get(paragraph, "context", str, path, where_p)
      doc_tokens, char_to_word = split_on_whitespace(context)
      for q, qa in enumerate(_get(paragraph, "qas", list, path, where_p)):
        qas_id = str(_get(qa, "id", (str, int), path, f"{where_p}.qas[{q}]"))
        where = f"question id {qas_id!r} ({where_p}.qas[{q}])"
        question = _get(qa, "question", str, path, where)
        # Unlabelled files (a leaderboard's test set) have no answers: fine for prediction.
        answers = _get(qa, "answers", list, path, where) if is_training or "answers" in qa else []
        is_impossible = bool(qa.get("is_impossible", False))
        if is_impossible and not version_2_with_negative:
          raise SquadFormatError(
            f"{path}: {where} is unanswerable (is_impossible) but this is a SQuAD v1.1 run; "
            "use task squad_v2 for files with unanswerable questions"
          )
        texts = [
          _get(ans, "text", str, path, f"{where} answer {i}") for i, ans in enumerate(answers)
        ]
        if qas_id in seen:
          stats["duplicate_ids"] += 1
          logging.warning(
            "%s: %s appears more than once; predictions keep the last one "
            "(as the official evaluation scripts score it)",
            path,
            where,
          )
        seen.add(qas_id)
        example = SquadExample(
          qas_id=qas_id,
          question_text=question,
          doc_tokens=doc_tokens,
          answers=[] if is_impossible else texts,
          is_impossible=is_impossible,
        )
        if is_impossible:
          stats["impossible"] += 1
        elif not answers:
          if is_training:
            raise SquadFormatError(
              f"{path}: {where} has no answer and is not marked "
              "is_impossible; a training question needs one"
            )
        else:
          answer_start = _get(answers[0], "answer_start", int, path, f"{where} answer 0")
          span = _word_span(context, doc_tokens, char_to_word, answer_start, texts[0])
          if span is None:
            stats["answer_mismatch"] += 1
            logging.warning(
              "%s: %s: answer_start %d does not point at its text %r; %s",
              path,
              where,
              answer_start,
              texts[0],
              "skipping it (as run_squad.py does)"
              if is_training
              else "kept for scoring (evaluation uses the gold texts only)",
            )
            if is_training:
              continue
          else:
            example.orig_answer_text = texts[0]
            example.start_position, example.end_position = span
        examples.append(example)
  if not examples:
    mismatched = stats["answer_mismatch"]
    why = f" ({mismatched} answer(s) skipped: answer_start does not match)" if mismatched else ""
    raise SquadFormatError(
      f"{path}: no questions{why}; expected the official SQuAD layout "
      '{"data": [{"paragraphs": [{"context": ..., "qas": [...]}]}]} with at least one question'
    )
  stats["examples"] += len(examples)
  return examples


def _word_span(
  context: str, doc_tokens: list[str], char_to_word: list[int], answer_start: int, text: str
) -> tuple[int, int] | None:
  """The answer's word span, or None when the offset does not match (run_squad's test)."""
  answer_end = answer_start + len(text) - 1
  if not text or answer_start < 0 or answer_end >= len(context):
    return None
  start, end = char_to_word[answer_start], char_to_word[answer_end]
  if start < 0:
    return None
  actual = " ".join(doc_tokens[start : end + 1])
  cleaned = " ".join(text.split())
  if actual.find(cleaned) == -1:
    return None
  return start, end
