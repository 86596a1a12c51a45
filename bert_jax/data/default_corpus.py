"""A built-in English corpus present on every machine: the documentation shipped with CPython.

Documents: each help topic of `pydoc_data.topics` (the language reference text that `help()`
shows), and each standard-library module's docstrings (module, classes, functions; read with
`ast` from the source files, nothing is imported). Code, grammar and reST markup are dropped by
rule (indented blocks, `>>>` lines, lines of punctuation, paragraphs with few letters). About
2 MB of text (~0.45 M WordPiece tokens), identical for a given Python version.

`prepare_default_data(out_dir)` writes it in the original format, builds a WordPiece vocabulary
from it, and generates seq-128 and seq-512 TFRecords with a held-out eval split.
"""

import ast
import dataclasses
import json
import os
import re
import sysconfig

from absl import logging

from bert_jax.data import generate as generate_lib
from bert_jax.data import sentences as sentences_lib

_SKIP_DIRS = frozenset(
  {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "turtledemo",
    "ensurepip",
    "__pycache__",
    "tkinter",
    "pydoc_data",
    "config-3",
    "encodings",
  }
)
_PUNCT_LINE_RE = re.compile(r"^[\s*=\-~^#+`'\"|.:_]*$")
_MANIFEST = "default_data.json"


def _clean_paragraph(lines: list[str]) -> str | None:
  """One blank-line-separated block -> prose, or None for code/markup."""
  kept = []
  for line in lines:
    if _PUNCT_LINE_RE.match(line) or line.lstrip().startswith((">>>", "...", "::=", "$ ")):
      continue
    kept.append(line)
  if not kept:
    return None
  indents = [len(l) - len(l.lstrip()) for l in kept]
  if min(indents) >= 3 or any(("::=" in l) for l in kept):
    return None  # Indented literal block / grammar.
  text = " ".join(" ".join(kept).split())
  letters = sum(c.isalpha() for c in text)
  if len(text.split()) < 4 or letters < 0.6 * len(text):
    return None
  return text


def text_to_sentences(text: str) -> list[str]:
  """A help text or docstring -> its prose sentences."""
  out, block = [], []
  for line in text.splitlines() + [""]:
    if line.strip():
      block.append(line.rstrip())
      continue
    if block:
      paragraph = _clean_paragraph(block)
      if paragraph:
        out.extend(sentences_lib.split_sentences(paragraph))
      block = []
  return out


def _stdlib_sources() -> list[str]:
  root = sysconfig.get_paths()["stdlib"]
  paths = []
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = sorted(
      d for d in subdirs if d not in _SKIP_DIRS and not d.startswith(("config-", "lib-"))
    )
    paths.extend(os.path.join(directory, f) for f in sorted(files) if f.endswith(".py"))
  return sorted(paths)


def _module_docstrings(path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
  except (SyntaxError, UnicodeDecodeError, ValueError):
    return ""
  texts = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node)
      if doc:
        texts.append(doc)
  return "\n\n".join(texts)


def iter_default_documents():
  """Yields (name, sentences) of every document of the built-in corpus, in a fixed order."""
  from pydoc_data import topics  # noqa: PLC0415

  for name in sorted(topics.topics):
    sentences = text_to_sentences(topics.topics[name])
    if sentences:
      yield f"pydoc:{name}", sentences
  for path in _stdlib_sources():
    sentences = text_to_sentences(_module_docstrings(path))
    if len(sentences) >= 2:
      yield f"stdlib:{os.path.basename(path)}", sentences


def write_default_corpus(
  corpus_dir: str, num_files: int = 8, max_documents: int | None = None
) -> list[str]:
  """Writes the corpus in the original format (a sentence per line, blank line between
  documents), document k into file k % num_files. Returns the file paths."""
  os.makedirs(corpus_dir, exist_ok=True)
  paths = [
    os.path.join(corpus_dir, f"cpython-docs-{i:02d}-of-{num_files:02d}.txt")
    for i in range(num_files)
  ]
  handles = [open(p + ".tmp", "w", encoding="utf-8") for p in paths]
  try:
    for k, (_, sentences) in enumerate(iter_default_documents()):
      if max_documents is not None and k >= max_documents:
        break
      handles[k % num_files].write("\n".join(sentences) + "\n\n")
  finally:
    for h in handles:
      h.close()
  for p in paths:
    os.replace(p + ".tmp", p)
  return paths


@dataclasses.dataclass(frozen=True)
class DefaultData:
  """Paths of the prepared default data. train_files/eval_files: {max_seq_length: glob}."""

  corpus_files: tuple[str, ...]
  vocab_file: str
  tokenizer_dir: str
  train_files: dict
  eval_files: dict
  max_predictions_per_seq: dict
  stats: dict


def prepare_default_data(
  out_dir: str,
  *,
  vocab_size: int = 8000,
  max_seq_lengths: tuple[int, ...] = (128, 512),
  max_predictions_per_seq: tuple[int, ...] = (20, 80),
  dupe_factor: int = 3,
  eval_fraction: float = 0.05,
  max_documents: int | None = None,
  random_seed: int = 12345,
  num_workers: int = 0,
  overwrite: bool = False,
  progress: bool = False,
  sentence_pairs: bool = True,
  masked_lm_prob: float = 0.15,
  mask_rates=(0.8, 0.1, 0.1),
  whole_word_mask: bool = False,
) -> DefaultData:
  """Prepares the built-in corpus for pre-training under `out_dir` (idempotent: when a previous
  call with the same arguments completed there, returns its paths without redoing anything).

  Writes `out_dir/corpus/*.txt`, `out_dir/vocab.txt` (+ tokenizer_config.json, uncased WordPiece
  of `vocab_size`), and `out_dir/seq_{L}/{train,eval}-*.tfrecord` for each L in max_seq_lengths.

  sentence_pairs: NSP sentence pairs (True) or documents packed into single segments (False,
  for the no-NSP / left-to-right objectives). masked_lm_prob, mask_rates ((mask, same, random)
  or a MaskRates), whole_word_mask: the static masks (see GenerationConfig).
  """
  from bert_jax.data import masking  # noqa: PLC0415

  rates = list(masking.MaskRates.parse(mask_rates).as_tuple())
  args = dict(
    vocab_size=vocab_size,
    max_seq_lengths=list(max_seq_lengths),
    max_predictions_per_seq=list(max_predictions_per_seq),
    dupe_factor=dupe_factor,
    eval_fraction=eval_fraction,
    max_documents=max_documents,
    random_seed=random_seed,
  )
  # Settings added later are recorded only when not at their defaults, so a directory prepared
  # before they existed is still recognised.
  for name, value, default in (
    ("sentence_pairs", sentence_pairs, True),
    ("masked_lm_prob", masked_lm_prob, 0.15),
    ("mask_rates", rates, [0.8, 0.1, 0.1]),
    ("whole_word_mask", whole_word_mask, False),
  ):
    if value != default:
      args[name] = value
  manifest_path = os.path.join(out_dir, _MANIFEST)
  if not overwrite and os.path.exists(manifest_path):
    with open(manifest_path) as f:
      manifest = json.load(f)
    if manifest.get("args") == args:
      data = manifest["data"]
      return DefaultData(
        corpus_files=tuple(data["corpus_files"]),
        vocab_file=data["vocab_file"],
        tokenizer_dir=data["tokenizer_dir"],
        train_files={int(k): v for k, v in data["train_files"].items()},
        eval_files={int(k): v for k, v in data["eval_files"].items()},
        max_predictions_per_seq={int(k): v for k, v in data["max_predictions_per_seq"].items()},
        stats=data["stats"],
      )
    logging.info("%s: made with other arguments; regenerating", manifest_path)
    overwrite = True
  from bert_jax.tokenize import vocab as vocab_lib  # noqa: PLC0415

  corpus_files = write_default_corpus(os.path.join(out_dir, "corpus"), max_documents=max_documents)
  vocab_file = os.path.join(out_dir, "vocab.txt")
  # Rewritten like the corpus (a rerun with other arguments, or after an interrupted one).
  vocab_lib.build_wordpiece_vocab(
    corpus_files, vocab_file, vocab_size, do_lower_case=True, overwrite=True
  )
  config = generate_lib.GenerationConfig(
    tokenizer_path=vocab_file,
    do_lower_case=True,
    input_format="original",
    max_seq_lengths=tuple(max_seq_lengths),
    max_predictions_per_seq=tuple(max_predictions_per_seq),
    dupe_factor=dupe_factor,
    random_seed=random_seed,
    eval_fraction=eval_fraction,
    masked_lm_prob=masked_lm_prob,
    whole_word_mask=whole_word_mask,
    mask_rates=tuple(rates),
    sentence_pairs=sentence_pairs,
  )
  result = generate_lib.generate(
    corpus_files, out_dir, config, num_workers=num_workers, overwrite=True, progress=progress
  )
  data = DefaultData(
    corpus_files=tuple(corpus_files),
    vocab_file=vocab_file,
    tokenizer_dir=out_dir,
    train_files={L: result["files"][L]["train"] for L in max_seq_lengths},
    eval_files={L: result["files"][L]["eval"] for L in max_seq_lengths},
    max_predictions_per_seq=dict(zip(max_seq_lengths, max_predictions_per_seq)),
    stats=result["stats"],
  )
  tmp = manifest_path + ".tmp"
  with open(tmp, "w") as f:
    json.dump({"args": args, "data": dataclasses.asdict(data)}, f, indent=2)
  os.replace(tmp, manifest_path)
  return data
