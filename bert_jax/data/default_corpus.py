"""A built-in English corpus present on every machine: the documentation shipped with CPython.

Documents: each help topic of `pydoc_data.topics` (the language reference text that `help()`
shows), and each standard-library module's docstrings (module, classes, functions; read with
`ast` from the source files, nothing is imported). Code, grammar and reST markup are dropped by
rule (indented blocks, `>>>` lines, lines of punctuation, paragraphs with few letters). About
2 MB of text (~0.45 M WordPiece tokens), identical for a given Python version.

`prepare_default_data(out_dir)` writes it in the original format, builds a WordPiece vocabulary
from it, and generates seq-128 and seq-512 TFRecords with a held-out eval split, each once, in
its own directory keyed by what it depends on: nothing built there is rebuilt or changed.
"""

import ast
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import sysconfig
from pydoc_data import topics

from absl import logging

from bert_jax.data import generate as generate_lib
from bert_jax.data import masking
from bert_jax.data import sentences as sentences_lib
from bert_jax.tokenize import vocab as vocab_lib

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


def file_sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def _key(value) -> str:
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


@contextlib.contextmanager
def _build_lock(out_dir: str):
  """Holds ``out_dir/.build.lock`` (an exclusive file lock): one builder at a time, so two runs
  sharing ``out_dir`` never write under each other."""
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, ".build.lock"), "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _build_dir(final: str, build) -> str:
  """``final``, built by ``build(tmp_dir)`` into a temporary directory renamed into place when
  complete (an interrupted build leaves only the temporary one, removed by the next)."""
  if os.path.isdir(final):
    return final
  tmp = f"{final}.partial"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  build(tmp)
  os.replace(tmp, final)
  return final


def _data_from_manifest(manifest: dict, base: str, rebase=None) -> DefaultData:
  """The manifest's paths joined to ``base`` (relative ones) or rebased by ``rebase``."""

  def at(p: str) -> str:
    if rebase is not None:
      p = rebase(p)
    return os.path.normpath(os.path.join(base, p))

  data = manifest["data"]
  return DefaultData(
    corpus_files=tuple(at(p) for p in data["corpus_files"]),
    vocab_file=at(data["vocab_file"]),
    tokenizer_dir=at(data["tokenizer_dir"]),
    train_files={int(k): at(v) for k, v in data["train_files"].items()},
    eval_files={int(k): at(v) for k, v in data["eval_files"].items()},
    max_predictions_per_seq={int(k): v for k, v in data["max_predictions_per_seq"].items()},
    stats=data["stats"],
  )


def _legacy(out_dir: str) -> tuple[dict, DefaultData] | None:
  """The single manifest ``out_dir/default_data.json`` of the earlier layout (one data set and
  its vocabulary at the top of ``out_dir``), its paths moved under ``out_dir`` wherever it was
  written from; None when there is none."""
  path = os.path.join(out_dir, _MANIFEST)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    manifest = json.load(f)
  old_dir = os.path.dirname(manifest["data"]["vocab_file"])

  def rebase(p: str) -> str:
    return os.path.relpath(p, old_dir) if p == old_dir or p.startswith(old_dir + os.sep) else p

  return manifest["args"], _data_from_manifest(manifest, out_dir, rebase)


def _vocab(out_dir: str, vocab_size: int, max_documents, legacy) -> tuple[list[str], str]:
  """(corpus files, vocab.txt) of the built-in corpus under ``out_dir``, each built once: the
  earlier layout's when its vocabulary has the same size and documents, else
  ``corpus-<docs>/`` and ``vocab-<size>-<docs>/``."""
  if legacy is not None:
    args, data = legacy
    same = args.get("vocab_size") == vocab_size and args.get("max_documents") == max_documents
    if same and os.path.exists(data.vocab_file):
      return list(data.corpus_files), data.vocab_file
  docs = "all" if max_documents is None else f"first{max_documents}"
  corpus_dir = _build_dir(
    os.path.join(out_dir, f"corpus-{docs}"),
    lambda tmp: write_default_corpus(tmp, max_documents=max_documents),
  )
  corpus_files = sorted(
    os.path.join(corpus_dir, f) for f in os.listdir(corpus_dir) if f.endswith(".txt")
  )
  vocab_dir = _build_dir(
    os.path.join(out_dir, f"vocab-{vocab_size}-{docs}"),
    lambda tmp: vocab_lib.build_wordpiece_vocab(
      corpus_files, os.path.join(tmp, "vocab.txt"), vocab_size, do_lower_case=True
    ),
  )
  return corpus_files, os.path.join(vocab_dir, "vocab.txt")


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
  progress: bool = False,
  sentence_pairs: bool = True,
  masked_lm_prob: float = 0.15,
  mask_rates=(0.8, 0.1, 0.1),
  whole_word_mask: bool = False,
  vocab_file: str = "",
) -> DefaultData:
  """Prepares the built-in corpus for pre-training under ``out_dir``; what is built there is
  never rebuilt or changed (a second call with the same arguments returns the same paths).

  Layout: ``corpus-<docs>/*.txt`` (the text), ``vocab-<vocab_size>-<docs>/vocab.txt`` (+
  tokenizer_config.json; uncased WordPiece of ``vocab_size``), and for each set of generation
  arguments and vocabulary ``data-<key>/`` with ``seq_{L}/{train,eval}-*.tfrecord`` for each L
  in max_seq_lengths and its manifest ``default_data.json`` (paths relative to it). Each is
  built under a temporary name and renamed when complete, by one builder at a time
  (``.build.lock``). A directory of the earlier layout (``default_data.json`` at the top) is
  read: its data when the arguments match, its vocabulary when the size matches.

  vocab_file: tokenize with this vocabulary (e.g. the one a checkpoint was trained with)
  instead of the corpus's own. sentence_pairs: NSP sentence pairs (True) or documents packed
  into single segments (False, for the no-NSP / left-to-right objectives). masked_lm_prob,
  mask_rates ((mask, same, random) or a MaskRates), whole_word_mask: the static masks (see
  GenerationConfig).
  """
  out_dir = os.path.abspath(out_dir)
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
  with _build_lock(out_dir):
    legacy = _legacy(out_dir)
    if legacy is not None and legacy[0] == args:
      data = legacy[1]
      if not vocab_file or file_sha256(vocab_file) == file_sha256(data.vocab_file):
        return data
    corpus_files, own_vocab = _vocab(out_dir, vocab_size, max_documents, legacy)
    vocab = os.path.abspath(vocab_file) if vocab_file else own_vocab
    vocab_sha = file_sha256(vocab)
    data_dir = os.path.join(out_dir, f"data-{_key(dict(args, vocab_sha256=vocab_sha))}")

    def build(tmp: str) -> None:
      config = generate_lib.GenerationConfig(
        tokenizer_path=vocab,
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
        corpus_files, tmp, config, num_workers=num_workers, overwrite=True, progress=progress
      )
      rel = functools.partial(os.path.relpath, start=tmp)
      files = result["files"]
      manifest = dict(
        args=args,
        vocab_sha256=vocab_sha,
        data=dict(
          corpus_files=[os.path.relpath(p, tmp) for p in corpus_files],
          vocab_file=os.path.relpath(vocab, tmp),
          tokenizer_dir=os.path.relpath(os.path.dirname(vocab), tmp),
          train_files={L: rel(files[L]["train"]) for L in max_seq_lengths},
          eval_files={L: rel(files[L]["eval"]) for L in max_seq_lengths},
          max_predictions_per_seq=dict(zip(max_seq_lengths, max_predictions_per_seq)),
          stats=result["stats"],
        ),
      )
      with open(os.path.join(tmp, _MANIFEST), "w") as f:
        json.dump(manifest, f, indent=2)

    if not os.path.isdir(data_dir):
      logging.info("Generating the built-in corpus's TFRecords in %s", data_dir)
    _build_dir(data_dir, build)
    with open(os.path.join(data_dir, _MANIFEST)) as f:
      manifest = json.load(f)
    # The vocabulary as named now (data-<key> may have been made with an equal one elsewhere).
    data = _data_from_manifest(manifest, data_dir)
    return dataclasses.replace(data, vocab_file=vocab, tokenizer_dir=os.path.dirname(vocab))
