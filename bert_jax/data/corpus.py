"""Document-level corpus readers and the input shards that example generation runs over.

A *document* is a list of sentences (str). Formats (`input_format`):

* ``original``: google-research/bert's format: one sentence per line, a blank line between
  documents.
* ``text``: plain text. Lines are joined into paragraphs (a blank line ends a paragraph) and the
  paragraphs are split into sentences by `sentences.split_sentences`. A document ends at
  `doc_boundary` consecutive blank lines (default 2), or is the whole file (`doc_boundary=0`).
* ``wiki``: a MediaWiki XML dump (`.xml` or `.xml.bz2`); one article is one document.
* ``tfds``: a TFDS text dataset (wikipedia, c4, ...) read from a local `data_dir`; one example's
  text feature is one document, its lines are paragraphs.

Bad bytes: a line that is not valid UTF-8 is skipped and counted (`lines_skipped_non_utf8`); a
file holding NUL bytes in a text format is rejected with an error naming the file and line (it is
binary, e.g. a .bz2 dump given as text), never silently dropped.
"""

import dataclasses
import glob as pyglob
from collections.abc import Iterator

from bert_jax.data import sentences as sentences_lib
from bert_jax.data import wikitext

INPUT_FORMATS = ("original", "text", "wiki", "tfds")


@dataclasses.dataclass(frozen=True)
class InputShard:
  """One unit of generation work: a group of files, or one slice of a TFDS split."""

  index: int
  num_shards: int
  files: tuple[str, ...] = ()
  tfds_name: str = ""
  tfds_split: str = ""
  tfds_data_dir: str = ""
  tfds_text_key: str = "text"

  @property
  def description(self) -> str:
    if self.tfds_name:
      return f"tfds:{self.tfds_name}[{self.tfds_split}] shard {self.index}/{self.num_shards}"
    return ",".join(self.files)


def expand_patterns(patterns: str | list[str] | tuple[str, ...]) -> list[str]:
  """Comma-separated globs (or a list of them) -> sorted, de-duplicated file paths.

  Raises a ValueError naming the pattern when one matches nothing.
  """
  if isinstance(patterns, str):
    patterns = [p for p in patterns.split(",") if p.strip()]
  files = []
  for pattern in patterns:
    pattern = str(pattern).strip()
    if "://" in pattern:  # gs://, s3://: only tf.io.gfile knows those.
      import tensorflow as tf  # noqa: PLC0415 (heavy; only for a remote path)

      matched = tf.io.gfile.glob(pattern)
    else:
      matched = pyglob.glob(pattern)
    if not matched:
      raise ValueError(f"input pattern {pattern!r} matches no file")
    files.extend(matched)
  return sorted(set(files))


def make_input_shards(
  inputs: str | list[str],
  input_format: str = "original",
  num_shards: int = 0,
  tfds_split: str = "train",
  tfds_data_dir: str = "",
  tfds_text_key: str = "text",
) -> list[InputShard]:
  """Groups the inputs into generation shards (the unit of parallelism, memory and seeding).

  Files: one shard per file by default (`num_shards=0`); with `num_shards` < files, file k goes
  to shard k % num_shards (sorted order). TFDS (`inputs="name[/config][:version]"`): the split is
  cut into `num_shards` (default 16) even slices.
  """
  if input_format not in INPUT_FORMATS:
    raise ValueError(f"input_format must be one of {INPUT_FORMATS}, got {input_format!r}")
  if input_format == "tfds":
    name = inputs if isinstance(inputs, str) else ",".join(inputs)
    name = name.removeprefix("tfds:")
    n = num_shards or 16
    return [
      InputShard(
        index=i,
        num_shards=n,
        tfds_name=name,
        tfds_split=tfds_split,
        tfds_data_dir=tfds_data_dir,
        tfds_text_key=tfds_text_key,
      )
      for i in range(n)
    ]
  files = expand_patterns(inputs)
  n = min(num_shards, len(files)) if num_shards else len(files)
  groups = [tuple(files[i::n]) for i in range(n)]
  return [InputShard(index=i, num_shards=n, files=g) for i, g in enumerate(groups)]


def _decode_lines(path: str, stats: dict) -> Iterator[str]:
  """Yields the decoded, stripped lines of a text file; skips (and counts) non-UTF-8 lines."""
  if "://" in path:  # gs://, s3://: only tf.io.gfile knows those.
    import tensorflow as tf  # noqa: PLC0415 (heavy; only for a remote path)

    opened = tf.io.gfile.GFile(path, "rb")
  else:  # Local files without TensorFlow: generation workers then start in a second.
    opened = open(path, "rb")
  with opened as f:
    for line_number, raw in enumerate(f, start=1):
      if b"\x00" in raw:
        raise ValueError(
          f"{path}:{line_number}: NUL byte in a text input; the file looks binary "
          "(use --input_format=wiki for MediaWiki .xml.bz2 dumps)"
        )
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError:
        stats["lines_skipped_non_utf8"] = stats.get("lines_skipped_non_utf8", 0) + 1
        continue
      yield line.strip()


def read_original_format(path: str, stats: dict) -> Iterator[list[str]]:
  """One sentence per line, a blank line between documents (google-research/bert's format)."""
  document = []
  for line in _decode_lines(path, stats):
    if not line:
      if document:
        yield document
      document = []
    else:
      document.append(line)
  if document:
    yield document


def _paragraphs_to_document(paragraphs: list[str]) -> list[str]:
  document = []
  for paragraph in paragraphs:
    document.extend(sentences_lib.split_sentences(paragraph))
  return document


def read_plain_text(path: str, stats: dict, doc_boundary: int = 2) -> Iterator[list[str]]:
  """Plain text: paragraphs end at a blank line, documents at `doc_boundary` blank lines in a row
  (0: the whole file is one document). Paragraph text is split into sentences by rule."""
  paragraphs, current, blank_run = [], [], 0
  for line in _decode_lines(path, stats):
    if line:
      current.append(line)
      blank_run = 0
      continue
    blank_run += 1
    if current:
      paragraphs.append(" ".join(current))
      current = []
    if doc_boundary and blank_run == doc_boundary and paragraphs:
      document = _paragraphs_to_document(paragraphs)
      paragraphs = []
      if document:
        yield document
  if current:
    paragraphs.append(" ".join(current))
  document = _paragraphs_to_document(paragraphs)
  if document:
    yield document


def read_wiki_dump(path: str, stats: dict) -> Iterator[list[str]]:
  """MediaWiki XML dump: one main-namespace article is one document."""
  del stats
  for _, text in wikitext.iter_wiki_articles(path):
    document = _paragraphs_to_document(wikitext.wikitext_to_paragraphs(text))
    if document:
      yield document


def read_tfds_shard(shard: InputShard, stats: dict) -> Iterator[list[str]]:
  """One even slice of a TFDS split, read from the local data_dir (never downloads)."""
  import tensorflow_datasets as tfds  # noqa: PLC0415 (heavy; only for a TFDS source)

  try:
    builder = tfds.builder(shard.tfds_name, data_dir=shard.tfds_data_dir or None)
  except Exception as e:  # tfds raises several types for unknown/absent datasets.
    raise ValueError(
      f"TFDS dataset {shard.tfds_name!r} not found under data_dir {shard.tfds_data_dir!r}: {e}"
    ) from e
  if not builder.info.splits:
    raise ValueError(
      f"TFDS dataset {shard.tfds_name!r} has no prepared data under "
      f"{shard.tfds_data_dir!r} (prepare it there first; nothing is downloaded)"
    )
  if shard.tfds_text_key not in builder.info.features:
    raise ValueError(
      f"TFDS dataset {shard.tfds_name!r} has no feature {shard.tfds_text_key!r}; "
      f"features: {sorted(builder.info.features.keys())}"
    )
  split = tfds.even_splits(shard.tfds_split, n=shard.num_shards)[shard.index]
  ds = builder.as_dataset(split=split, shuffle_files=False)
  for example in ds.as_numpy_iterator():
    raw = example[shard.tfds_text_key]
    try:
      text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError:
      stats["documents_skipped_non_utf8"] = stats.get("documents_skipped_non_utf8", 0) + 1
      continue
    paragraphs = [p.strip() for p in text.split("\n") if p.strip()]
    document = _paragraphs_to_document(paragraphs)
    if document:
      yield document


def read_shard_documents(
  shard: InputShard, input_format: str, stats: dict, doc_boundary: int = 2
) -> Iterator[list[str]]:
  """All documents of one input shard, in file order."""
  if input_format == "tfds":
    yield from read_tfds_shard(shard, stats)
    return
  for path in shard.files:
    if input_format == "original":
      yield from read_original_format(path, stats)
    elif input_format == "text":
      yield from read_plain_text(path, stats, doc_boundary=doc_boundary)
    elif input_format == "wiki":
      yield from read_wiki_dump(path, stats)
    else:
      raise ValueError(f"input_format must be one of {INPUT_FORMATS}, got {input_format!r}")
