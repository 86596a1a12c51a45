"""Contextual token features from a pre-trained BERT, as google-research/bert's extract_features.

Input: a UTF-8 text file, one example a line: a sentence, or ``text_a ||| text_b`` (a pair,
segments 0 and 1). Output: JSON lines in the original's layout::

  {"linex_index": 0, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]},
                                                              ...]}, ...]}

one line per input line, in input order; ``values`` are float32 activations rounded to 6
decimals as the original does (``round(float(x), 6)``). ``layers`` index the encoder layers
as the original's ``get_all_encoder_layers()`` (-1 is the last layer, 0 the first layer's
output; the embeddings are not a layer).

Optionally (``scalar_mix_weights``) one more entry per token, ``{"index": "mix", "values":
[...]}``: ELMo's scalar mix ``gamma * sum_k s_k h_k`` (``bert_jax.model.scalar_mix``) over the
``num_hidden_layers + 1`` hidden states, k = 0 the embeddings and k = j + 1 the layer the
original calls j; the given non-negative weights are divided by their sum.

Batches are jitted at a few bucketed lengths (``bucket_lengths``: 8, 16, 24, 32, 48, 64, ... up
to ``max_seq_length``) and a fixed batch size, so a file compiles a handful of programs whatever
its line lengths; lines are sorted by length within a window for dense batches and written back
in input order (``bert_jax.data.inference_batches``). A
progress line (lines written of the input's, rate, ETA) is logged at least every 30 s while lines
are written (``bert_jax.train.progress``). The output file is checked before any work
(``bert_jax.checkpoint.outputs``): it must not be the input file or the checkpoint, and its
folder must exist.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import os
import pathlib
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.checkpoint import atomic_write
from bert_jax.checkpoint.outputs import check_outputs, check_parent
from bert_jax.data.inference_batches import InferenceBatches, pad_ragged
from bert_jax.data.length_buckets import parse_buckets
from bert_jax.formats import load_pretrained
from bert_jax.model import BertEncoder
from bert_jax.model import scalar_mix as scalar_mix_lib
from bert_jax.tokenize import iter_text_lines
from bert_jax.train.progress import INTERVAL_SEC, Progress

PROGRESS_INTERVAL_SEC = INTERVAL_SEC
_PAIR = re.compile(r"^(.*) \|\|\| (.*)$")  # the original's separator: " ||| "


@dataclasses.dataclass(frozen=True)
class InputExample:
  unique_id: int  # 0-based line index: the output's linex_index
  text_a: str
  text_b: str | None = None


@dataclasses.dataclass(frozen=True)
class InputFeatures:
  unique_id: int
  tokens: list[str]  # including [CLS] and [SEP]
  input_ids: list[int]
  segment_ids: list[int]
  truncated: bool = False  # whether tokens were dropped to fit max_seq_length


def iter_examples(
  path: str | os.PathLike, allow_empty_lines: bool = False
) -> Iterator[InputExample]:
  """The examples of an input file, one per line; a bad line is a ValueError naming
  ``path:line``.

  Bytes that are not UTF-8 are an error. An empty (or blank) line is an error unless
  ``allow_empty_lines``: then, as in the original, it is an example of no text whose features
  are those of ``[CLS] [SEP]`` (so line numbers and linex_index stay aligned).
  """
  path = str(path)
  if not os.path.isfile(path):
    raise ValueError(f"{path}: no such input file")
  n = 0
  for n, line in enumerate(iter_text_lines(path), start=1):
    line = line.strip()
    if not line and not allow_empty_lines:
      raise ValueError(
        f"{path}:{n}: empty line (every line is one example; remove it, or "
        f"pass allow_empty_lines / --allow_empty_lines to extract [CLS] [SEP])"
      )
    m = _PAIR.match(line)
    yield InputExample(n - 1, m.group(1), m.group(2)) if m else InputExample(n - 1, line)
  if n == 0:
    raise ValueError(f"{path}: the input file is empty")


def read_examples(path: str | os.PathLike, allow_empty_lines: bool = False) -> list[InputExample]:
  """All of ``iter_examples`` (see there)."""
  return list(iter_examples(path, allow_empty_lines))


def _truncate_pair(a: list, b: list, max_length: int) -> None:
  """The original's heuristic: drop a token from the end of the longer one until they fit."""
  while len(a) + len(b) > max_length:
    (a if len(a) > len(b) else b).pop()


def convert_examples(
  examples: Sequence[InputExample], tokenizer, max_seq_length: int
) -> list[InputFeatures]:
  """[CLS] a [SEP] (b [SEP]) with segment ids; truncated to max_seq_length as the original."""
  if max_seq_length < 3:
    raise ValueError(f"max_seq_length must be at least 3, got {max_seq_length}")
  tokens_a = tokenizer.tokenize_batch([e.text_a for e in examples])
  pairs = [e for e in examples if e.text_b is not None]
  tokens_b = dict(
    zip(
      (e.unique_id for e in pairs),
      tokenizer.tokenize_batch([e.text_b for e in pairs]) if pairs else [],
    )
  )
  cls, sep = tokenizer.convert_ids_to_tokens([tokenizer.cls_id, tokenizer.sep_id])
  out = []
  for e, a in zip(examples, tokens_a):
    a = list(a)
    b = tokens_b.get(e.unique_id)
    full = len(a) + (0 if b is None else len(b))
    if b is not None:
      b = list(b)
      _truncate_pair(a, b, max_seq_length - 3)
    else:
      a = a[: max_seq_length - 2]
    tokens = [cls] + a + [sep]
    segments = [0] * len(tokens)
    if b is not None:
      tokens += b + [sep]
      segments += [1] * (len(b) + 1)
    ids = tokenizer.convert_tokens_to_ids(tokens)
    out.append(
      InputFeatures(
        e.unique_id, tokens, ids, segments, truncated=len(a) + (0 if b is None else len(b)) < full
      )
    )
  return out


def bucket_lengths(max_seq_length: int) -> tuple[int, ...]:
  """Padded lengths batches are compiled at: 8, 16, 24, 32, 48, 64, 96, ... (steps of at most
  half the length, so padding wastes at most a third), then ``max_seq_length`` (as
  ``parse_buckets`` reads an explicit list of lengths)."""
  steps, n = [8, 16, 24], 32
  while n < max_seq_length:
    steps += [n, n * 3 // 2]
    n *= 2
  return parse_buckets(steps, max_seq_length)


def check_layers(
  layers: Sequence[int], num_hidden_layers: int, allow_empty: bool = False
) -> tuple[int, ...]:
  layers = tuple(int(i) for i in layers)
  if not layers and not allow_empty:
    raise ValueError("layers is empty; pass e.g. -1,-2,-3,-4")
  bad = [i for i in layers if not -num_hidden_layers <= i < num_hidden_layers]
  if bad:
    raise ValueError(
      f"layers {bad} out of range for a model of {num_hidden_layers} layers "
      f"(use -{num_hidden_layers}..{num_hidden_layers - 1}; -1 is the last)"
    )
  return layers


MIX_FLAG = "scalar_mix_weights (--scalar_mix_weights)"


def check_mix_values(weights: Sequence[float], gamma: float = 1.0) -> tuple[float, ...]:
  """The weights divided by their sum; an error naming the flag when a weight is not a finite
  number >= 0, when all are 0, or when ``gamma`` is not finite. The count is checked against
  the model by ``check_mix_weights``."""
  try:
    w = [float(x) for x in weights]
  except (TypeError, ValueError):
    raise ValueError(f"{MIX_FLAG} must be numbers, got {list(weights)}") from None
  if not w:
    raise ValueError(f"{MIX_FLAG} is empty; give one weight per hidden state")
  bad = [x for x in w if not np.isfinite(x) or x < 0]
  if bad:
    raise ValueError(f"{MIX_FLAG}: {bad} not finite numbers >= 0 (got {w})")
  total = float(np.sum(np.asarray(w, np.float64)))
  if total <= 0:
    raise ValueError(f"{MIX_FLAG} are all 0; at least one must be positive")
  if not np.isfinite(float(gamma)):
    raise ValueError(f"scalar_mix_gamma (--scalar_mix_gamma) must be finite, got {gamma}")
  return tuple(x / total for x in w)


def check_mix_weights(
  weights: Sequence[float], num_hidden_layers: int, gamma: float = 1.0
) -> tuple[float, ...]:
  """``check_mix_values``, and exactly ``num_hidden_layers + 1`` weights (embeddings first)."""
  w = check_mix_values(weights, gamma)
  if len(w) != num_hidden_layers + 1:
    raise ValueError(
      f"{MIX_FLAG} has {len(w)} values; a model of {num_hidden_layers} layers needs "
      f"{num_hidden_layers + 1}: the embeddings, then layers 0..{num_hidden_layers - 1}"
    )
  return w


class FeatureExtractor:
  """Runs a pre-trained encoder over InputFeatures, returning the chosen layers per token.

  Batches are planned, padded and split over ``devices`` (default: this host's local devices;
  params replicated) by ``bert_jax.data.inference_batches.InferenceBatches``, so the batch
  size is rounded up to a multiple of their number. With ``scalar_mix_weights`` (one per hidden
  state, embeddings first; divided by their sum) the scalar mix is an extra last row of the
  values, labelled "mix" in ``output_indices``; ``layers`` may then be empty.
  """

  def __init__(
    self,
    params: dict[str, Any],
    config,
    layers: Sequence[int] = (-1, -2, -3, -4),
    max_seq_length: int = 128,
    batch_size: int = 32,
    devices: Sequence[jax.Device] | None = None,
    scalar_mix_weights: Sequence[float] | None = None,
    scalar_mix_gamma: float = 1.0,
  ):
    if max_seq_length > config.max_position_embeddings:
      raise ValueError(
        f"max_seq_length {max_seq_length} exceeds the model's "
        f"max_position_embeddings {config.max_position_embeddings}"
      )
    if batch_size < 1:
      raise ValueError(f"batch_size must be positive, got {batch_size}")
    self.config = config.replace(dtype="float32")
    mixing = scalar_mix_weights is not None
    self.layers = check_layers(layers, config.num_hidden_layers, allow_empty=mixing)
    self.mix_weights = (
      check_mix_weights(scalar_mix_weights, config.num_hidden_layers, scalar_mix_gamma)
      if mixing
      else None
    )
    self.mix_gamma = float(scalar_mix_gamma)
    self.output_indices: tuple[int | str, ...] = self.layers + (("mix",) if mixing else ())
    self.max_seq_length = max_seq_length
    self.buckets = bucket_lengths(max_seq_length)
    self._batches = InferenceBatches(batch_size, self.buckets, devices)
    self.batch_size = self._batches.batch_size
    self.params = self._batches.replicate(params["bert"] if "bert" in params else params)
    encoder = BertEncoder(self.config)
    n = config.num_hidden_layers
    picked = [n + 1 + i if i < 0 else i + 1 for i in self.layers]  # hidden_states[0] = embeddings

    def run(params, batch):
      out = encoder.apply(
        {"params": params},
        batch["input_ids"],
        batch["input_mask"],
        batch["segment_ids"],
        output_hidden_states=True,
      )
      hidden = out["hidden_states"]
      rows = [hidden[j] for j in picked]
      if self.mix_weights is not None:
        rows.append(scalar_mix_lib.mix(hidden, self.mix_weights, self.mix_gamma))
      return jnp.stack(rows, axis=1)  # BxNxLxD, N = len(output_indices)

    self._run = jax.jit(run)

  def _window(self, chunk: Sequence[InputFeatures]) -> dict[int, np.ndarray]:
    """Values for each line of ``chunk``, computed in batches of similar lengths."""
    ids = [f.input_ids for f in chunk]
    segments = [f.segment_ids for f in chunk]
    lengths = [len(x) for x in ids]

    def make(index, length):
      return {
        "input_ids": pad_ragged(ids, index, length),
        "input_mask": (np.arange(length) < np.take(lengths, index)[:, None]).astype(np.int32),
        "segment_ids": pad_ragged(segments, index, length),
      }

    results = {}
    for batch, out in self._batches.run(self._run, self.params, lengths, make):
      for r, i in enumerate(batch.rows):
        results[chunk[i].unique_id] = out[r, :, : lengths[i]]
    return results

  def __call__(
    self, features: Sequence[InputFeatures], window: int = 8
  ) -> Iterator[tuple[InputFeatures, np.ndarray]]:
    """Yields (features, values [len(output_indices), num_tokens, hidden]) in the order given.

    Lines are sorted by length within windows of ``window`` batches (dense batches, few
    buckets); a background thread computes the next window while the caller consumes this
    one (XLA releases the GIL, so writing output overlaps the model).
    """
    span = window * self.batch_size
    chunks = [features[i : i + span] for i in range(0, len(features), span)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
      upcoming = pool.submit(self._window, chunks[0]) if chunks else None
      for k, chunk in enumerate(chunks):
        results = upcoming.result()
        upcoming = pool.submit(self._window, chunks[k + 1]) if k + 1 < len(chunks) else None
        for f in chunk:
          yield f, results.pop(f.unique_id)


def round_like_original(values: np.ndarray) -> list:
  """``[round(float(x), 6) for x in values]``, vectorised.

  Exact for float32 input: a float32 times 10**6 is exact in float64 (24 + 20 bits < 53), so
  rint then division by 10**6 rounds as Python's correctly rounded ``round`` does.
  """
  return np.round(np.asarray(values, np.float32).astype(np.float64), 6).tolist()


def to_json(f: InputFeatures, values_NxTxD: np.ndarray, layers: Sequence[int | str]) -> str:
  """One output line in the original's layout (``layers``: the index of each row of values,
  e.g. ``extractor.output_indices``)."""
  rounded = round_like_original(values_NxTxD)  # N x T x D nested lists
  feats = [
    {
      "token": tok,
      "layers": [{"index": layer, "values": rounded[j][t]} for j, layer in enumerate(layers)],
    }
    for t, tok in enumerate(f.tokens)
  ]
  return json.dumps({"linex_index": f.unique_id, "features": feats})


def extract_features(
  input_file: str,
  output_file: str,
  checkpoint: str,
  layers: Sequence[int] = (-1, -2, -3, -4),
  max_seq_length: int = 128,
  batch_size: int = 32,
  do_lower_case: bool | None = None,
  allow_empty_lines: bool = False,
  chunk_lines: int = 16384,
  scalar_mix_weights: Sequence[float] | None = None,
  scalar_mix_gamma: float = 1.0,
) -> dict[str, Any]:
  """Writes ``output_file`` (JSON lines) for every line of ``input_file``; returns a summary.

  ``checkpoint`` is anything ``load_pretrained`` reads (a bert_jax workdir, a Hugging Face
  directory, a google-research/bert checkpoint). The whole input is checked before the model is
  loaded, then streamed ``chunk_lines`` lines at a time (memory stays bounded for any file
  size); the output appears only when complete (an existing file is replaced then).
  ``scalar_mix_weights`` adds the layer entry "mix" (see the module docstring); their values
  are checked before the model is loaded, their number (num_hidden_layers + 1) after.
  """
  start = time.perf_counter()
  check_outputs(
    {"--output_file": output_file}, {"--input_file": input_file, "--checkpoint": checkpoint}
  )
  check_parent("--output_file", output_file)
  if scalar_mix_weights is not None:
    check_mix_values(scalar_mix_weights, scalar_mix_gamma)
  num_lines = sum(1 for _ in iter_examples(input_file, allow_empty_lines))  # fail early
  pre = load_pretrained(checkpoint, task="encoder", do_lower_case=do_lower_case)
  if pre.tokenizer is None:
    raise ValueError(
      f"{checkpoint}: the checkpoint has no vocabulary (vocab.txt or a "
      f"SentencePiece .model) to tokenize the input with"
    )
  extractor = FeatureExtractor(
    pre.params,
    pre.config,
    layers,
    max_seq_length,
    batch_size,
    scalar_mix_weights=scalar_mix_weights,
    scalar_mix_gamma=scalar_mix_gamma,
  )
  loaded = time.perf_counter()
  out_path = pathlib.Path(output_file)
  counts = {"tokens": 0, "truncated": 0}

  def write(tmp: str) -> None:
    examples = iter_examples(input_file, allow_empty_lines)
    progress = Progress(
      f"extract_features {input_file}", num_lines, "lines", interval_sec=PROGRESS_INTERVAL_SEC
    )
    with progress, open(tmp, "w", encoding="utf-8") as w:
      while chunk := list(itertools.islice(examples, chunk_lines)):
        feats = convert_examples(chunk, pre.tokenizer, max_seq_length)
        for f, values in extractor(feats):
          w.write(to_json(f, values, extractor.output_indices) + "\n")
          counts["tokens"] += len(f.tokens)
          counts["truncated"] += f.truncated
          progress.update()

  atomic_write(out_path, write)
  end = time.perf_counter()
  return {
    "num_lines": num_lines,
    "num_tokens": counts["tokens"],
    "num_truncated": counts["truncated"],
    "load_seconds": round(loaded - start, 3),
    "extract_seconds": round(end - loaded, 3),
    "lines_per_second": round(num_lines / max(end - loaded, 1e-9), 1),
    "output_file": str(out_path),
    "checkpoint_source": pre.source,
  }
