"""Parallel, deterministic generation of pre-training TFRecords from a corpus.

Work is split into input shards (`corpus.make_input_shards`); each shard is read, tokenized
once, and turned into instances for every requested `max_seq_length` (e.g. 128 and 512 for the
two-phase curriculum) by `examples.instances_from_documents`: NSP sentence pairs, or with
`sentence_pairs=False` documents packed into single segments (no NSP); `mask_rates` sets what a
masked position becomes. Memory is bounded by one shard:
NSP's random "other document" is drawn within the shard. Each shard's random stream is seeded
from (random_seed, shard index, max_seq_length, split) only, so the files are byte-identical
whatever the number of worker processes or hosts. Hosts split the shards by
`shard.index % process_count == process_index`.

Output, per sequence length L: `{output_dir}/seq_{L}/{split}-{i:05d}-of-{n:05d}.tfrecord`
for split in ("train", "eval"); eval holds the documents drawn for `eval_fraction` (per shard, by
document, fixed by the seed). Nothing is written before the inputs, the tokenizer and the
output directory are checked, so a run that fails on a bad argument leaves the output directory
as it was (and a corrected rerun is not refused as "different settings"). Files are written
atomically: under a hidden temporary name (``seq_L/.train-00000-of-00004.tfrecord.tmp-PID``,
which neither ``train-*`` nor ``*.tfrecord`` globs match) renamed when complete; a write that
fails (disk full) removes its temporary file, and the temporary files of a shard a run is about
to write (left by a killed run) are removed first. A shard whose files all exist is skipped (so
an interrupted run resumes), unless `overwrite`.
"""

import dataclasses
import functools
import glob
import hashlib
import json
import multiprocessing
import os
import random
import sys
import time

from absl import logging
from tqdm import tqdm

from bert_jax.data import corpus, masking, shard_records, tfrecord_writer
from bert_jax.tokenize import load_tokenizer

SPLITS = ("train", "eval")
AUTO_PARALLEL_MIN_BYTES = 4 << 20
# Input per worker from which workers tokenize with tensorflow-text (importing TensorFlow, 3.5-7
# s once per worker, 0.4 GB more each) rather than the TensorFlow-free reference with its cache
# of pieces (about 0.8x tensorflow-text's rate on a large corpus): the import pays for itself
# from about 450 MB per worker (docs/pretraining_data.md).
WORKER_FAST_TOKENIZER_MIN_BYTES = 512 << 20
# Sentences per tokenizer call: documents are tokenized many at a time (same ids as one at a
# time), so a batch tokenizer's per-call cost is paid per few thousand lines, not per document.
ENCODE_BATCH_LINES = 4096
ENGINES = ("original", "fast")


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
  """Every knob of generation (names as in google-research/bert's script)."""

  tokenizer_path: str
  do_lower_case: bool | None = None
  input_format: str = "original"
  doc_boundary: int = 2
  max_seq_lengths: tuple[int, ...] = (128,)
  max_predictions_per_seq: tuple[int, ...] = (20,)
  masked_lm_prob: float = 0.15
  short_seq_prob: float = 0.1
  dupe_factor: int = 10
  whole_word_mask: bool = False
  random_seed: int = 12345
  eval_fraction: float = 0.0
  # What a chosen position becomes: (mask, same, random), the paper's Table 8 (see MaskRates).
  mask_rates: tuple[float, float, float] = (0.8, 0.1, 0.1)
  # False: documents packed into single segments, no NSP pairs (paper Table 5, "No NSP").
  sentence_pairs: bool = True
  # "original": google-research/bert's random stream, call for call (files byte-identical to
  # earlier releases'); "fast": the same procedure in bulk with numpy (batch_instances), its
  # own random stream.
  engine: str = "original"

  def __post_init__(self):
    # Checked (ValueError naming the rates) and stored as a tuple of floats (also from JSON).
    rates = masking.MaskRates.parse(self.mask_rates)
    object.__setattr__(self, "mask_rates", rates.as_tuple())
    if not isinstance(self.sentence_pairs, bool):
      raise ValueError(f"sentence_pairs must be a bool, got {self.sentence_pairs!r}")
    if self.engine not in ENGINES:
      raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
    if len(self.max_seq_lengths) != len(self.max_predictions_per_seq):
      raise ValueError(
        f"max_seq_lengths {self.max_seq_lengths} and max_predictions_per_seq "
        f"{self.max_predictions_per_seq} must have the same number of entries"
      )
    for length in self.max_seq_lengths:
      if length < 5:
        raise ValueError(f"max_seq_length must be >= 5, got {length}")
    if not 0.0 <= self.eval_fraction < 1.0:
      raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
    if self.dupe_factor < 1:
      raise ValueError(f"dupe_factor must be >= 1, got {self.dupe_factor}")
    if not 0.0 < self.masked_lm_prob < 1.0 or not 0.0 <= self.short_seq_prob <= 1.0:
      raise ValueError(
        f"masked_lm_prob must be in (0, 1) and short_seq_prob in [0, 1], got "
        f"{self.masked_lm_prob}, {self.short_seq_prob}"
      )
    if min(self.max_predictions_per_seq, default=1) < 1:
      raise ValueError(f"max_predictions_per_seq must be >= 1, got {self.max_predictions_per_seq}")

  @property
  def rates(self) -> masking.MaskRates:
    return masking.MaskRates(*self.mask_rates)


# Fields added after data was first generated: written to generation_config.json only when they
# differ from their defaults, so directories generated before (at the defaults) stay valid.
_OPTIONAL_FIELDS = {"mask_rates": (0.8, 0.1, 0.1), "sentence_pairs": True, "engine": "original"}


def config_dict(config: GenerationConfig) -> dict:
  """The settings as stored in generation_config.json (JSON types; see _OPTIONAL_FIELDS)."""
  out = dataclasses.asdict(config)
  for name, default in _OPTIONAL_FIELDS.items():
    if out[name] == default:
      del out[name]
  return json.loads(json.dumps(out))


def output_path(
  output_dir: str, max_seq_length: int, split: str, index: int, num_shards: int
) -> str:
  return os.path.join(
    output_dir, f"seq_{max_seq_length}", f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"
  )


def output_pattern(output_dir: str, max_seq_length: int, split: str) -> str:
  return os.path.join(output_dir, f"seq_{max_seq_length}", f"{split}-*-of-*.tfrecord")


def _seed(*parts) -> int:
  digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
  return int.from_bytes(digest[:8], "little")


@functools.lru_cache(maxsize=4)
def _load_tokenizer_and_spec(
  tokenizer_path: str, do_lower_case: bool | None, backend: str = "reference"
):
  tokenizer = load_tokenizer(tokenizer_path, do_lower_case=do_lower_case, backend=backend)
  return tokenizer, masking.MaskingSpec.from_tokenizer(tokenizer)


def _tokenizer_backend() -> str:
  """The fast WordPiece path (tensorflow-text; same ids) where TensorFlow is already imported
  (a caller such as the pre-training entry point's default corpus); else the reference, which
  needs no TensorFlow: generation itself, tokenizer and writer included, never imports it
  (fork-server workers are told which to use: `generate`, WORKER_FAST_TOKENIZER_MIN_BYTES)."""
  return "auto" if "tensorflow" in sys.modules else "reference"


def _input_bytes(shards, config: GenerationConfig) -> float:
  """The input files' bytes of ``shards``; TFDS: unknown, infinite (its readers import TensorFlow
  anyway)."""
  if config.input_format == "tfds":
    return float("inf")
  return sum(os.path.getsize(f) for s in shards for f in s.files if os.path.exists(f))


def _has_text(path: str, chunk_bytes: int = 1 << 20) -> bool:
  """Whether the file holds anything but whitespace (read until the first such byte)."""
  with open(path, "rb") as f:
    while chunk := f.read(chunk_bytes):
      if chunk.strip():
        return True
  return False


def _check_some_text(files: list[str]) -> None:
  """ValueError (one line, naming the file) when no input file holds any text: the run would
  write empty shards. Checked before anything is written."""
  if not files or any(_has_text(f) for f in files):
    return
  if len(files) == 1:
    raise ValueError(f"{files[0]}: the input file is empty (no text to make examples from)")
  shown = ", ".join(files[:3]) + (", ..." if len(files) > 3 else "")
  raise ValueError(
    f"{shown}: all {len(files)} input files are empty (no text to make examples from)"
  )


def _tokenized_documents(tokenizer, documents):
  """Each document's ids, one list per sentence, tokenizing ENCODE_BATCH_LINES at a time."""
  pending, lines = [], 0
  for sentences in documents:
    pending.append(sentences)
    lines += len(sentences)
    if lines >= ENCODE_BATCH_LINES:
      yield from _encode_documents(tokenizer, pending)
      pending, lines = [], 0
  yield from _encode_documents(tokenizer, pending)


def _encode_documents(tokenizer, documents):
  ids = tokenizer.encode_batch([s for sentences in documents for s in sentences])
  start = 0
  for sentences in documents:
    yield ids[start : start + len(sentences)]
    start += len(sentences)


def _new_stats() -> dict:
  return {
    "shards": 0,
    "shards_skipped_existing": 0,
    "documents": 0,
    "sentences": 0,
    "one_sentence_documents": 0,
    "single_document_shards": 0,
    "lines_skipped_non_utf8": 0,
    "documents_skipped_non_utf8": 0,
    "per_length": {},
  }


def _new_length_stats() -> dict:
  return {
    "examples": 0,
    "train_examples": 0,
    "eval_examples": 0,
    "tokens": 0,
    "maskable": 0,
    "masked": 0,
    "random_next": 0,
    "short_targets": 0,
    "packed": 0,
    "mask_token": 0,
    "kept": 0,
    "replaced": 0,
  }


def _shard_outputs(shard: corpus.InputShard, config: GenerationConfig, output_dir: str):
  return [
    output_path(output_dir, length, split, shard.index, shard.num_shards)
    for length in config.max_seq_lengths
    for split in SPLITS
  ]


def make_shard_records(
  shard: corpus.InputShard, config: GenerationConfig, output_dir: str, backend: str = ""
) -> tuple[dict, dict[str, list[bytes]]]:
  """Reads, tokenizes and makes the records of one input shard for every sequence length.

  Returns (stats, {output path: serialized records}). Runs in worker processes too, which import
  TensorFlow only for a tokenizer ``backend`` other than "reference" (example_proto serializes);
  the parent writes the files (tfrecord_writer, no TensorFlow either). ``backend`` "": as
  `_tokenizer_backend` says.
  """
  stats = _new_stats()
  tokenizer, spec = _load_tokenizer_and_spec(
    config.tokenizer_path, config.do_lower_case, backend or _tokenizer_backend()
  )
  read_stats: dict = {}
  documents: dict[str, list[list[list[int]]]] = {"train": [], "eval": []}
  split_rng = random.Random(_seed(config.random_seed, shard.index, "eval_split"))
  for sentence_ids in _tokenized_documents(
    tokenizer,
    corpus.read_shard_documents(
      shard, config.input_format, read_stats, doc_boundary=config.doc_boundary
    ),
  ):
    tokenized = [ids for ids in sentence_ids if ids]
    is_eval = split_rng.random() < config.eval_fraction
    if not tokenized:
      continue
    stats["documents"] += 1
    stats["sentences"] += len(tokenized)
    stats["one_sentence_documents"] += len(tokenized) == 1
    documents["eval" if is_eval else "train"].append(tokenized)
  for key in ("lines_skipped_non_utf8", "documents_skipped_non_utf8"):
    stats[key] += read_stats.get(key, 0)
  # NSP's random B comes from another document of the shard; with one, from the same one.
  stats["single_document_shards"] += len(documents["train"]) == 1

  outputs = {}
  make = shard_records.fast if config.engine == "fast" else shard_records.original
  for length, max_predictions in zip(config.max_seq_lengths, config.max_predictions_per_seq):
    length_stats = _new_length_stats()
    for split in SPLITS:
      seed = _seed(config.random_seed, shard.index, length, split)
      records = make(documents[split], length, max_predictions, config, spec, seed, length_stats)
      length_stats["examples"] += len(records)
      length_stats[f"{split}_examples"] += len(records)
      outputs[output_path(output_dir, length, split, shard.index, shard.num_shards)] = records
    stats["per_length"][str(length)] = length_stats
  stats["shards"] = 1
  return stats, outputs


def _merge(total: dict, part: dict) -> None:
  for key, value in part.items():
    if key == "per_length":
      for length, length_stats in value.items():
        into = total["per_length"].setdefault(length, _new_length_stats())
        for k, v in length_stats.items():
          into[k] += v
    else:
      total[key] += value


def _worker(args):
  shard, config, output_dir, backend = args
  return make_shard_records(shard, config, output_dir, backend)


def summary_line(stats: dict) -> str:
  """The closing statistics line."""
  parts = [
    f"shards {stats['shards']} (+{stats['shards_skipped_existing']} already done)",
    f"documents {stats['documents']}",
    f"sentences {stats['sentences']}",
  ]
  for length, s in sorted(stats["per_length"].items(), key=lambda kv: int(kv[0])):
    pairs = s["examples"] - s.get("packed", 0)
    nsp = (
      f", NSP random-next {s['random_next'] / max(pairs, 1):.4f}"
      if pairs or not s["examples"]
      else ", packed segments (no NSP)"
    )
    parts.append(
      f"seq {length}: examples {s['examples']} (train {s['train_examples']}, eval "
      f"{s['eval_examples']}), tokens {s['tokens']}, masked {s['masked'] / max(s['maskable'], 1):.4f}"
      f" of maskable{nsp}"
    )
  if stats["single_document_shards"] and any(
    s["examples"] > s.get("packed", 0) for s in stats["per_length"].values()
  ):
    parts.append(
      f"WARNING {stats['single_document_shards']} shard(s) hold a single training "
      "document, so their random-next B comes from that same document: put several "
      "documents in each shard (--num_shards, --doc_boundary)"
    )
  if stats["lines_skipped_non_utf8"] or stats["documents_skipped_non_utf8"]:
    parts.append(
      f"skipped non-UTF-8: {stats['lines_skipped_non_utf8']} lines, "
      f"{stats['documents_skipped_non_utf8']} documents"
    )
  return "; ".join(parts)


def temp_path(path: str) -> str:
  """This process's temporary name for ``path``: hidden, and not ending in ``.tfrecord``."""
  directory, name = os.path.split(path)
  return os.path.join(directory, f".{name}.tmp-{os.getpid()}")


def _remove_temp_files(path: str) -> None:
  """Removes every temporary file of ``path`` (any process's, any nesting of temp names)."""
  directory, name = os.path.split(path)
  for stale in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(name)}.tmp-*")):
    try:
      os.remove(stale)
    except FileNotFoundError:
      pass


def _write_atomically(path: str, write) -> None:
  """``write(tmp)`` then rename to ``path``; on any failure no temporary file is left."""
  tmp = temp_path(path)
  try:
    write(tmp)
    os.replace(tmp, path)
  except BaseException:
    _remove_temp_files(path)
    raise


def _write_json(path: str, value) -> None:
  def write(tmp):
    with open(tmp, "w") as f:
      json.dump(value, f, indent=2, sort_keys=True)

  _write_atomically(path, write)


def _check_output_dir(output_dir: str) -> None:
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise NotADirectoryError(f"output_dir {output_dir} is a file, not a directory")


def _check_or_write_config(
  output_dir: str, config: GenerationConfig, num_shards: int, overwrite: bool
) -> None:
  """Stores the generation settings; refuses to mix files made with different ones."""
  path = os.path.join(output_dir, "generation_config.json")
  wanted = dict(config_dict(config), num_shards=num_shards)
  if os.path.exists(path) and not overwrite:
    try:
      with open(path) as f:
        existing = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(
        f"{path}:{e.lineno}: not valid JSON ({e.msg}); remove it or use overwrite=True"
      ) from None
    if existing != wanted:
      diff = sorted(k for k in set(existing) | set(wanted) if existing.get(k) != wanted.get(k))
      raise ValueError(
        f"{path}: {output_dir} holds data generated with different settings "
        f"({', '.join(diff)}); use another output_dir or overwrite=True"
      )
    return
  os.makedirs(output_dir, exist_ok=True)
  _write_json(path, wanted)


def generate(
  inputs,
  output_dir: str,
  config: GenerationConfig,
  num_shards: int = 0,
  num_workers: int = 0,
  process_index: int = 0,
  process_count: int = 1,
  overwrite: bool = False,
  tfds_split: str = "train",
  tfds_data_dir: str = "",
  tfds_text_key: str = "text",
  progress: bool = True,
) -> dict:
  """Generates this host's shards. Returns {"stats", "files": {L: {split: pattern}}}.

  `num_workers`: 1 runs in this process; 0 means all cores (`os.cpu_count()`), except for inputs
  under AUTO_PARALLEL_MIN_BYTES in all, which run in this process (starting workers would take
  longer than generating). Workers make records; this process writes the files.
  """
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, process_count={process_count})")
  # Every input is checked before anything is written.
  shards = corpus.make_input_shards(
    inputs,
    config.input_format,
    num_shards=num_shards,
    tfds_split=tfds_split,
    tfds_data_dir=tfds_data_dir,
    tfds_text_key=tfds_text_key,
  )
  if config.input_format != "tfds":
    _check_some_text([f for s in shards for f in s.files])
  mine = [s for s in shards if s.index % process_count == process_index]
  input_bytes = _input_bytes(mine, config)
  if not num_workers:
    num_workers = 1 if input_bytes < AUTO_PARALLEL_MIN_BYTES else (os.cpu_count() or 1)
  # Checked before anything is written, with the backend a shard made here would use (cached
  # for it); with workers, the light TensorFlow-free one they use.
  backend = _tokenizer_backend() if num_workers == 1 else "reference"
  _load_tokenizer_and_spec(config.tokenizer_path, config.do_lower_case, backend)
  _check_output_dir(output_dir)

  _check_or_write_config(output_dir, config, len(shards), overwrite)

  stats = _new_stats()
  if not overwrite:
    done = [
      s for s in mine if all(os.path.exists(p) for p in _shard_outputs(s, config, output_dir))
    ]
    stats["shards_skipped_existing"] = len(done)
    mine = [s for s in mine if s not in done]
  workers = min(num_workers, max(len(mine), 1))
  logging.info(
    "create_pretraining_data: %d shard(s) to write (engine %s, %d worker(s))",
    len(mine),
    config.engine,
    workers,
  )
  start = time.time()
  per_worker = _input_bytes(mine, config) / workers  # the shards still to write
  worker_backend = "auto" if per_worker >= WORKER_FAST_TOKENIZER_MIN_BYTES else "reference"
  tasks = [(s, config, output_dir, "" if workers <= 1 else worker_backend) for s in mine]
  for shard in mine:  # temporary files a killed run left for the shards written now
    for path in _shard_outputs(shard, config, output_dir):
      _remove_temp_files(path)
  bar = tqdm(total=len(tasks), desc="generating shards", unit="shard", disable=not progress)
  if workers <= 1:
    results = map(_worker, tasks)
    pool = None
  else:
    # Not fork: the parent may hold TensorFlow/JAX threads, which do not survive a fork. Not
    # spawn: it re-imports the caller's __main__ (an entry point importing TensorFlow and JAX)
    # in every worker. A fork server that preloads only this module starts workers in about a
    # second: they import no JAX, and TensorFlow only to tokenize much input
    # (WORKER_FAST_TOKENIZER_MIN_BYTES; example_proto serializes without it).
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["bert_jax.data.generate", "bert_jax.tokenize"])
    pool = context.Pool(workers)
    results = pool.imap_unordered(_worker, tasks)
  try:
    for shard_stats, outputs in results:
      for path, records in outputs.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _write_atomically(path, functools.partial(tfrecord_writer.write_records, records=records))
      _merge(stats, shard_stats)
      bar.update(1)
      bar.set_postfix(documents=stats["documents"])
  finally:
    bar.close()
    if pool is not None:
      pool.close()
      pool.join()
  stats["seconds"] = round(time.time() - start, 2)
  logging.info("create_pretraining_data: %s", summary_line(stats))
  files = {
    length: {split: output_pattern(output_dir, length, split) for split in SPLITS}
    for length in config.max_seq_lengths
  }
  return {"stats": stats, "files": files}
