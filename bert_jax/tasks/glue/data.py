"""The nine GLUE tasks (and the AX diagnostic): their files, columns, labels and metrics; readers.

Two sources, chosen by the run config: a GLUE TSV directory as distributed by the GLUE
benchmark (``data_dir``/<Task>/train.tsv ...), or TFDS ``glue/<task>`` prepared in a local
``tfds_data_dir`` (never downloaded at run time).

TSV layouts (the official files): CoLA has no header in train/dev (source, label,
original label, sentence) and a header ``index sentence`` in test; every other file has a header
and columns are found by name (MRPC's header starts with a UTF-8 BOM, which is stripped). MNLI
has dev_matched/dev_mismatched and test_matched/test_mismatched; AX (diagnostic) is a test-only
set predicted by the MNLI model. A row whose number of fields is not the header's (CoLA
train/dev: 4), a missing named column, or a label outside the task's label set is an error
naming the file and line, unless ``skip_malformed_rows`` (then such rows are skipped and
counted in ``skipped_malformed``; the official QQP train file has a handful of short rows).
More fields than the header means a tab inside a text (the files are unquoted TSV): reading the
row would cut the text at the tab, or shift the label. A file with no example (a header only,
or every row skipped) is an error naming it: every split read is trained on or evaluated.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import sys
from typing import Any, Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class GlueSpec:
  name: str  # registry name, e.g. "mnli"
  dir_name: str  # folder in a GLUE data directory, e.g. "MNLI"
  labels: tuple[str, ...]  # label names in logit order; () for regression (STS-B)
  text_a: str  # header column of the first text
  text_b: Optional[str]  # header column of the second text (None: single sentence)
  label: str  # header column of the label
  primary_metric: str
  eval_files: tuple[tuple[str, str], ...]  # (split, file)
  test_files: tuple[tuple[str, str, str], ...]  # (split, file, submission file)
  tfds_name: str
  tfds_splits: tuple[tuple[str, str], ...]  # (split, tfds split)
  tfds_text: tuple[str, Optional[str]]  # tfds feature names of text a, b

  @property
  def is_regression(self) -> bool:
    return not self.labels


def _spec(
  name,
  dir_name,
  labels,
  text_a,
  text_b,
  label,
  primary,
  tfds_text,
  submission,
  eval_files=(("dev", "dev.tsv"),),
  test_files=None,
  tfds_splits=None,
):
  test_files = test_files or (("test", "test.tsv", submission),)
  tfds_splits = tfds_splits or (("train", "train"), ("dev", "validation"), ("test", "test"))
  return GlueSpec(
    name,
    dir_name,
    tuple(labels),
    text_a,
    text_b,
    label,
    primary,
    eval_files,
    test_files,
    f"glue/{name}",
    tfds_splits,
    tfds_text,
  )


NLI3 = ("contradiction", "entailment", "neutral")
NLI2 = ("entailment", "not_entailment")

SPECS: dict[str, GlueSpec] = {
  s.name: s
  for s in [
    _spec(
      "cola", "CoLA", ("0", "1"), "sentence", None, "label", "mcc", ("sentence", None), "CoLA.tsv"
    ),
    _spec(
      "sst2",
      "SST-2",
      ("0", "1"),
      "sentence",
      None,
      "label",
      "accuracy",
      ("sentence", None),
      "SST-2.tsv",
    ),
    _spec(
      "mrpc",
      "MRPC",
      ("0", "1"),
      "#1 String",
      "#2 String",
      "Quality",
      "f1",
      ("sentence1", "sentence2"),
      "MRPC.tsv",
    ),
    _spec(
      "stsb",
      "STS-B",
      (),
      "sentence1",
      "sentence2",
      "score",
      "pearson",
      ("sentence1", "sentence2"),
      "STS-B.tsv",
    ),
    _spec(
      "qqp",
      "QQP",
      ("0", "1"),
      "question1",
      "question2",
      "is_duplicate",
      "f1",
      ("question1", "question2"),
      "QQP.tsv",
    ),
    _spec(
      "mnli",
      "MNLI",
      NLI3,
      "sentence1",
      "sentence2",
      "gold_label",
      "accuracy",
      ("premise", "hypothesis"),
      None,
      eval_files=(("dev_matched", "dev_matched.tsv"), ("dev_mismatched", "dev_mismatched.tsv")),
      test_files=(
        ("test_matched", "test_matched.tsv", "MNLI-m.tsv"),
        ("test_mismatched", "test_mismatched.tsv", "MNLI-mm.tsv"),
        ("ax", "diagnostic/diagnostic.tsv", "AX.tsv"),
      ),
      tfds_splits=(
        ("train", "train"),
        ("dev_matched", "validation_matched"),
        ("dev_mismatched", "validation_mismatched"),
        ("test_matched", "test_matched"),
        ("test_mismatched", "test_mismatched"),
        ("ax", "glue/ax:test"),
      ),
    ),
    _spec(
      "qnli",
      "QNLI",
      NLI2,
      "question",
      "sentence",
      "label",
      "accuracy",
      ("question", "sentence"),
      "QNLI.tsv",
    ),
    _spec(
      "rte",
      "RTE",
      NLI2,
      "sentence1",
      "sentence2",
      "label",
      "accuracy",
      ("sentence1", "sentence2"),
      "RTE.tsv",
    ),
    _spec(
      "wnli",
      "WNLI",
      ("0", "1"),
      "sentence1",
      "sentence2",
      "label",
      "accuracy",
      ("sentence1", "sentence2"),
      "WNLI.tsv",
    ),
  ]
}


@dataclasses.dataclass
class GlueExample:
  index: str  # the test file's index column (or the row number)
  text_a: str
  text_b: Optional[str]
  label: Any  # label index (int), score (float), or None (test)
  # The row's other columns by name (a header's names; CoLA train/dev: "source" and
  # "original_label"), e.g. STS-B's "genre": what private attributes are read from.
  columns: dict[str, str] = dataclasses.field(default_factory=dict)


class GlueInputError(ValueError):
  """Bad GLUE input; the message names the file and line."""


def _read_rows(path: str) -> list[list[str]]:
  if not os.path.isfile(path):
    raise FileNotFoundError(f"GLUE file not found: {path}")
  csv.field_size_limit(sys.maxsize)
  rows: list[list[str]] = []
  try:
    with open(path, encoding="utf-8-sig", newline="") as f:  # -sig: MRPC's header has a BOM
      rows.extend(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  except UnicodeDecodeError:
    line, byte = _first_undecodable(path)
    raise GlueInputError(
      f"{path}:{line}: not UTF-8 text (byte {byte:#04x}); a GLUE file is UTF-8 tab-separated "
      "text (a binary or compressed file?)"
    ) from None
  return rows


def _first_undecodable(path: str) -> tuple[int, int]:
  """The 1-based line and the value of the first byte of ``path`` that is not UTF-8."""
  with open(path, "rb") as f:
    for number, line in enumerate(f, 1):
      try:
        line.decode("utf-8")
      except UnicodeDecodeError as e:
        return number, line[e.start]
  return 0, 0


def _label_value(spec: GlueSpec, raw: str, where: str) -> Any:
  raw = raw.strip()
  if spec.is_regression:
    try:
      return float(raw)
    except ValueError:
      raise GlueInputError(f"{where}: score {raw!r} is not a number") from None
  if raw not in spec.labels:
    raise GlueInputError(
      f"{where}: unknown label {raw!r}; {spec.name} labels are {list(spec.labels)}"
    )
  return spec.labels.index(raw)


def read_tsv(
  spec: GlueSpec, path: str, labelled: bool, skip_malformed_rows: bool = False
) -> tuple[list[GlueExample], int]:
  """Examples of one GLUE TSV file and the number of malformed rows skipped."""
  rows = _read_rows(path)
  examples, skipped = [], 0
  # CoLA train/dev has no header: source, label, original label, sentence.
  headerless = spec.name == "cola" and labelled
  if headerless:
    columns = {"source": 0, "label": 1, "original_label": 2, "sentence": 3}
    body, first_line, num_fields = rows, 1, 4
  else:
    if not rows:
      raise GlueInputError(f"{path}:1: empty file (expected a header line)")
    header = [h.strip() for h in rows[0]]
    columns = {h: i for i, h in enumerate(header)}
    body, first_line, num_fields = rows[1:], 2, len(header)
    wanted = [spec.text_a] + ([spec.text_b] if spec.text_b else [])
    wanted += [spec.label] if labelled else []
    missing = [c for c in wanted if c not in columns]
    if missing:
      raise GlueInputError(f"{path}:1: missing column(s) {missing} in header {header}")
  a_col = columns[spec.text_a]
  b_col = columns[spec.text_b] if spec.text_b else None
  label_col = columns[spec.label] if labelled else None
  index_col = columns.get("index", columns.get("id"))
  for line_no, row in enumerate(body, start=first_line):
    where = f"{path}:{line_no}"
    if not row or (len(row) == 1 and not row[0].strip()):
      continue
    try:
      if len(row) != num_fields:
        extra = " (a tab inside a text?)" if len(row) > num_fields else ""
        raise GlueInputError(
          f"{where}: {len(row)} fields, expected {num_fields}{extra}; fix the row or set "
          "config.skip_malformed_rows=True to skip (and count) such rows"
        )
      label = _label_value(spec, row[label_col], where) if labelled else None
    except GlueInputError:
      if skip_malformed_rows:
        skipped += 1
        continue
      raise
    index = row[index_col].strip() if index_col is not None else str(len(examples))
    used = {a_col, b_col, label_col}
    others = {name: row[i] for name, i in columns.items() if i not in used}
    examples.append(
      GlueExample(index, row[a_col], row[b_col] if b_col is not None else None, label, others)
    )
  if not examples:
    why = f" ({skipped} malformed row(s) skipped)" if skipped else ""
    raise GlueInputError(f"{path}: no examples{why}; a split that is read must not be empty")
  return examples, skipped


def read_tfds(spec: GlueSpec, split: str, data_dir: str) -> list[GlueExample]:
  """Examples of a TFDS glue/<task> split prepared in ``data_dir`` (no download)."""
  import tensorflow_datasets as tfds  # noqa: PLC0415 (heavy; only for this source)

  tfds_split = dict(spec.tfds_splits)[split]
  name = spec.tfds_name
  if ":" in tfds_split:  # e.g. AX lives in its own dataset: "glue/ax:test"
    name, tfds_split = tfds_split.split(":")
  try:
    builder = tfds.builder(name, data_dir=data_dir)
    ds = builder.as_data_source(split=tfds_split)
  except Exception as e:  # tfds raises many types; name what was asked for
    raise FileNotFoundError(
      f"TFDS dataset {name} split {tfds_split} not prepared in {data_dir}: {e}"
    ) from e
  label_feature = builder.info.features["label"]
  names = getattr(label_feature, "names", None)
  text_a, text_b = spec.tfds_text
  if name == "glue/ax":
    text_a, text_b = "premise", "hypothesis"
  examples = []
  for i in range(len(ds)):
    ex = ds[i]
    dec = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)
    raw = ex["label"]
    if spec.is_regression:
      label = float(raw)
    elif int(raw) < 0:
      label = None
    elif spec.labels == ("0", "1"):  # TFDS names these 0/1 classes (negative/positive, ...)
      label = int(raw)
    else:
      label_name = names[int(raw)]
      if label_name not in spec.labels:
        raise GlueInputError(f"{name}[{tfds_split}] row {i}: unknown label {label_name!r}")
      label = spec.labels.index(label_name)
    examples.append(
      GlueExample(
        str(int(ex.get("idx", i))), dec(ex[text_a]), dec(ex[text_b]) if text_b else None, label
      )
    )
  if not examples:
    raise GlueInputError(f"{name}[{tfds_split}] in {data_dir}: no examples")
  if split.startswith("test") or split == "ax":
    for ex in examples:
      ex.label = None
  return examples


def labels_array(spec: GlueSpec, examples: list[GlueExample]) -> np.ndarray:
  if spec.is_regression:
    return np.array([e.label if e.label is not None else 0.0 for e in examples], np.float32)
  return np.array([e.label if e.label is not None else -1 for e in examples], np.int32)
