"""Private attributes of an input, for probing what a representation reveals and defending it.

Coavoux, Narayan and Cohen (2018, "Privacy-preserving Neural Representations of Text") attach to
every training example a vector z of binary private attributes (the author's gender and age, or
whether a named entity occurs in the text) and ask how well an attacker recovers z from the
model's representation r(x). Their data sets are not available offline; these attribute sets
are defined on data that is (``config.private_attributes``; definitions in docs/privacy.md):

``cola_source``  CoLA train/dev, column 1 (the publication a sentence was taken from, e.g.
                 ``ks08``): one binary attribute per source among the K most frequent sources of
                 the training split (presence attributes: a sentence of another source has all
                 K at 0). Privacy metric: F.
``stsb_genre``   STS-B's ``genre`` column (main-captions, main-forum, main-news): one binary
                 attribute per genre among the K most frequent (there are three; the dev file's
                 "main-forums" is the train file's "main-forum"). A
                 demographic-style attribute (every pair has exactly one genre): privacy metric:
                 accuracy.
``conll_per``    the K most frequent gold PER entities of a CoNLL-2003 file
                 (``config.private_attributes_file``, e.g. its train.txt), present or not in an
                 example's text (either text of a pair), as the seed's entity-presence
                 attributes: a name is present where its words occur as consecutive whole words
                 (case-sensitive, punctuation split off). Privacy metric: F.

The K names are fitted on the training split (most frequent first, ties by name) and applied
unchanged to every other split, so the attribute columns mean the same everywhere. ``K`` is
``config.num_private_attributes`` (5: the seed's five most frequent entities).

An attribute that no row of a split has (``absent``) cannot be learnt or scored there: ``matrix``
logs a warning naming the attribute and the split, and ``check_support`` makes it an error (the
probe calls it on its attacker-train, attacker-dev and test rows before any training).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Sequence

import numpy as np
from absl import logging

from bert_jax.tasks.ner.data import read_conll

KINDS = ("cola_source", "stsb_genre", "conll_per")
_COLUMNS = {"cola_source": "source", "stsb_genre": "genre"}  # attributes read from a column
# Spellings of one value that differ between splits of the official files: STS-B's train.tsv
# writes the forums genre "main-forum" (450 pairs), its dev.tsv "main-forums" (375 pairs).
_ALIASES = {"stsb_genre": {"main-forums": "main-forum"}}
_WORD = re.compile(r"\w+(?:[-'.]\w+)*|[^\w\s]")


@dataclasses.dataclass(frozen=True)
class PrivateAttributes:
  """The K binary private attributes of a task: column k of ``arrays["private"]`` is
  ``names[k]``; ``privacy_metric`` is "accuracy" (1 - X) or "f1" (1 - F)."""

  kind: str
  names: tuple[str, ...]
  privacy_metric: str
  description: str

  @property
  def num_attributes(self) -> int:
    return len(self.names)


def check_kind(kind: str) -> None:
  if kind not in KINDS:
    raise ValueError(f"config.private_attributes {kind!r} is not one of {KINDS} (or '' for none)")


def words(text: str) -> list[str]:
  """Whole words and punctuation marks of a text (how names are matched)."""
  return _WORD.findall(text)


# The end of a malformed-line error in config.private_attributes_file: no key skips such lines.
_STRICT_ADVICE = (
  "config.private_attributes_file must have a tag on every token line: fix the file (nothing "
  "skips such lines when reading the attributes)"
)


def conll_person_names(path: str) -> collections.Counter:
  """Gold PER entities of a CoNLL-2003 file (BIO or IO tags), counted: "Bill Clinton" -> n.
  The file is read strictly (``ner_data.read_conll``): a line without a valid tag, a file that
  is not UTF-8 text or holds no sentence is an error naming the file and line."""
  counts: collections.Counter = collections.Counter()
  for sentence in read_conll(path, advice=_STRICT_ADVICE):
    counts.update(person_spans(sentence.words, sentence.tags))
  return counts


def person_spans(words_: Sequence[str], tags: Sequence[str]) -> list[str]:
  """The PER entities of one tagged sentence, each as its words joined by spaces."""
  spans, current = [], []
  for word, tag in zip(words_, tags):
    kind = tag[2:] if tag[:2] in ("B-", "I-") else tag
    begins = tag.startswith("B-") or (kind == "PER" and not current)
    if current and (kind != "PER" or begins):
      spans.append(" ".join(current))
      current = []
    if kind == "PER":
      current.append(word)
  if current:
    spans.append(" ".join(current))
  return spans


def _top(counts: collections.Counter, k: int, what: str) -> tuple[str, ...]:
  """The ``k`` most frequent values (ties by name); fewer than ``k`` distinct values is an error,
  so that K is known from the config alone (a job compiles without reading data)."""
  if len(counts) < k:
    raise ValueError(
      f"config.num_private_attributes={k}, but {what} has only {len(counts)} distinct values "
      f"({sorted(counts)}): set it to {len(counts)} or fewer"
    )
  return tuple(name for name, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k])


def column_values(kind: str, rows: Sequence[dict[str, str]], where: str) -> list[str]:
  """The attribute column's value of each row (``GlueExample.columns``); a missing column is an
  error naming the key and the data."""
  column = _COLUMNS[kind]
  if rows and column not in rows[0]:
    raise ValueError(
      f"config.private_attributes={kind!r} reads the column {column!r}, which {where} does not "
      f"have (its other columns: {sorted(rows[0])})"
    )
  aliases = _ALIASES.get(kind, {})
  return [aliases.get(v, v) for v in (r[column].strip() for r in rows)]


def fit(
  kind: str,
  num_attributes: int,
  train_columns: Sequence[dict[str, str]] = (),
  conll_file: str = "",
  where: str = "the training split",
) -> PrivateAttributes:
  """The attribute set of ``kind``: the ``num_attributes`` most frequent values of the training
  split's column (``train_columns``: each example's ``GlueExample.columns``), or of the gold PER
  entities of ``conll_file``."""
  check_kind(kind)
  if num_attributes < 1:
    raise ValueError(f"config.num_private_attributes must be >= 1, got {num_attributes}")
  if kind == "conll_per":
    if not conll_file:
      raise ValueError(
        "config.private_attributes='conll_per' needs config.private_attributes_file: a "
        "CoNLL-2003 file whose gold PER entities define the attributes (e.g. its train.txt)"
      )
    names = _top(
      conll_person_names(conll_file), num_attributes, f"the PER entities of {conll_file}"
    )
    return PrivateAttributes(
      kind, names, "f1", f"presence of the {len(names)} most frequent PER entities of {conll_file}"
    )
  values = column_values(kind, train_columns, where)
  column = _COLUMNS[kind]
  names = _top(collections.Counter(values), num_attributes, f"the {column} column of {where}")
  metric = "accuracy" if kind == "stsb_genre" else "f1"
  return PrivateAttributes(
    kind, names, metric, f"{column} = each of the {len(names)} most frequent {column}s of {where}"
  )


def matrix(
  attrs: PrivateAttributes,
  columns: Sequence[dict[str, str]] = (),
  texts: Sequence[Sequence[str | None]] = (),
  where: str = "the split",
) -> np.ndarray:
  """int32 [N, K] 0/1: column k is 1 where example n has attribute ``attrs.names[k]``.
  Column kinds read ``columns`` (each example's named columns); ``conll_per`` reads ``texts``
  (each example's texts, None for a missing second text). An attribute that no row has is
  logged as a warning naming it and ``where`` (the rows are still returned: a split that only
  a defence's evaluation reads may lack one; the probe refuses such rows, ``check_support``)."""
  k = attrs.num_attributes
  if attrs.kind == "conll_per":
    names = [tuple(words(n)) for n in attrs.names]
    out = np.zeros((len(texts), k), np.int32)
    for i, example_texts in enumerate(texts):
      for text in example_texts:
        if text:
          tokens = tuple(words(text))
          for j, name in enumerate(names):
            out[i, j] |= _contains(tokens, name)
  else:
    values = column_values(attrs.kind, columns, where)
    index = {name: j for j, name in enumerate(attrs.names)}
    out = np.zeros((len(values), k), np.int32)
    for i, v in enumerate(values):
      if v in index:
        out[i, index[v]] = 1
  missing = absent(out, attrs.names)
  if len(out) and missing:
    logging.warning(
      "%s: %s; a defence or a probe learns nothing of it from these rows, and a privacy figure "
      "on them would come from zero positives (a file ordered by attribute, as CoLA's and "
      "STS-B's are, holds few values in its first max_train_examples / max_eval_examples rows)",
      where,
      _none_of(len(out), missing),
    )
  return out


def absent(z_NxK: np.ndarray, names: Sequence[str]) -> list[str]:
  """The attributes (of ``names``, column order) with no positive row in ``z_NxK``."""
  z = np.asarray(z_NxK)
  return [name for name, n in zip(names, z.sum(0) if z.size else np.zeros(len(names))) if n == 0]


def check_support(z_NxK: np.ndarray, names: Sequence[str], where: str, advice: str = "") -> None:
  """A one-line error naming the attributes of ``names`` that no row of ``z_NxK`` (``where``)
  has: a metric of such an attribute, or a privacy figure including it, would be computed from
  zero positives, and an attacker or adversary learns nothing of it there."""
  missing = absent(z_NxK, names)
  if not missing:
    return
  raise ValueError(
    f"{where}: {_none_of(len(z_NxK), missing)}; a privacy figure computed from zero positives "
    f"is meaningless: {advice or 'use rows that have it'}"
  )


def _none_of(n: int, missing: Sequence[str]) -> str:
  """'none of its 5 rows has private attribute 'a'' (or attributes 'a', 'b')."""
  attrs = "attribute" if len(missing) == 1 else "attributes"
  return f"none of its {n} rows has private {attrs} {', '.join(repr(m) for m in missing)}"


def _contains(tokens: tuple[str, ...], name: tuple[str, ...]) -> int:
  n = len(name)
  return int(any(tokens[i : i + n] == name for i in range(len(tokens) - n + 1)))
