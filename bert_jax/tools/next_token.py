"""Next-WordPiece predictions for every prefix of every line (``python -m bert_jax.predict_next``).

What a downstream simultaneous-translation model consumes: for each line of a text file,
tokenized to WordPieces t1..tn (no special tokens), and each prefix t1..tj (j = 0..n-1), the
language model's top-k next pieces with their log-probabilities and the gold next piece
t_{j+1} with its log-probability. A line of n pieces gives exactly n records; a line of no
pieces (empty, blank, or only characters BERT's clean-up drops) gives none.

Two ways to ask a checkpoint (``mode``):

* ``"causal"`` (a left-to-right checkpoint, ``config.is_decoder``; pre-trained with
  ``--config.objective=ltr``): one forward over ``[CLS] t1 .. t_{n-1}``; position j (0 is
  [CLS]) predicts t_{j+1} from the context t1..tj. A line longer than the model's window
  (C = max_seq_length - 1 pieces of context) is read in windows ``[CLS] t_{s+1} .. t_{s+C}``
  starting at s = 0, S, 2S, ... (stride S = C // 2 by default): prefix j <= C comes from the
  first window (context t1..tj, all of it); prefix j > C from the window starting at
  s = S * ceil((j - C) / S), with context t_{s+1}..tj: between C - S + 1 and C pieces.
* ``"mlm"`` (a bidirectional masked-LM checkpoint): prefix j is its own input
  ``[CLS] t_{a+1} .. t_j [MASK] [SEP]`` with a = max(0, j - (max_seq_length - 3)), the
  prediction read at [MASK]: the last max_seq_length - 3 pieces of context at most.

``"auto"`` picks causal for an is_decoder checkpoint and mlm otherwise; asking for causal
predictions from a bidirectional checkpoint (or mlm from a causal one) is an error.

Log-probabilities are float32 log-softmax over the tokenizer's vocabulary (every entry,
special pieces such as [SEP] and [UNK] included, so top-k may hold them; model rows beyond the
tokenizer's vocabulary, padding, are left out). The gold piece is the tokenizer's piece
(possibly [UNK], never [CLS] / [SEP] / [MASK] / [PAD]).

Work is batched (``bert_jax.data.inference_batches``): rows (windows, or one prefix each in
mlm mode) are sorted by length and each batch is cut to a bucket (multiples of 32 up to
max_seq_length), so a handful of programs is compiled whatever the lines; lines are processed
in chunks, written back in input order as each chunk finishes, to a temporary file renamed into
place at the end (a failed run leaves no partial output). A progress line (lines done of the
input's, rate, ETA) is logged at least every 30 s while the chunks finish
(``bert_jax.train.progress``).

The outputs are checked before the checkpoint is loaded (``bert_jax.checkpoint.outputs``): the
output file and the summary file must not be the input file (or the checkpoint), nor each
other, and their folders must exist.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import math
import os
import pathlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.checkpoint import atomic_write, write_json
from bert_jax.checkpoint.outputs import check_outputs, check_parent
from bert_jax.data.inference_batches import InferenceBatches
from bert_jax.data.length_buckets import parse_buckets
from bert_jax.formats import load_pretrained
from bert_jax.model import BertForPreTraining
from bert_jax.tokenize import iter_text_lines
from bert_jax.train.progress import INTERVAL_SEC, Progress

MODES = ("auto", "causal", "mlm")
BUCKET_STEP = 32
_LM_HEAD = ("mlm_transform", "mlm_LayerNorm", "mlm_output_bias")
PROGRESS_INTERVAL_SEC = INTERVAL_SEC


def count_lines(path: str | os.PathLike) -> int:
  """The number of lines ``iter_text_lines`` yields for ``path`` (a last line without its line
  end counts), read as bytes: cheap next to the model's work."""
  n, last = 0, b"\n"
  with open(path, "rb") as f:
    while block := f.read(1 << 20):
      n += block.count(b"\n")
      last = block[-1:]
  return n + (last != b"\n")


def resolve_mode(mode: str, is_decoder: bool, checkpoint: str = "the checkpoint") -> str:
  """Returns "causal" or "mlm" for ``mode`` ("auto" follows the checkpoint's is_decoder)."""
  if mode not in MODES:
    raise ValueError(f"--mode={mode!r} is not one of {MODES}")
  kind = "causal (is_decoder)" if is_decoder else "bidirectional (not is_decoder)"
  if mode == "causal" and not is_decoder:
    raise ValueError(
      f"--mode=causal needs a left-to-right checkpoint (is_decoder, e.g. pre-trained with "
      f"--config.objective=ltr), but {checkpoint} is {kind}: use --mode=mlm or --mode=auto"
    )
  if mode == "mlm" and is_decoder:
    raise ValueError(
      f"--mode=mlm needs a bidirectional masked-LM checkpoint, but {checkpoint} is {kind} (its "
      f"[MASK] position would predict the piece after [MASK]): use --mode=causal or --mode=auto"
    )
  return "causal" if is_decoder else "mlm"


def causal_windows(n: int, max_seq_length: int, stride: int | None = None):
  """(s, first, last) for each window of a line of ``n`` pieces: the window's input is
  [CLS] t_{s+1} .. t_last and it predicts prefixes first..last (prefix j at position j - s)."""
  context = max_seq_length - 1
  stride = stride or max(1, context // 2)
  if n <= 0:
    return []
  out, s, first = [], 0, 0
  while first < n:
    last = min(s + context, n - 1)
    out.append((s, first, last))
    s, first = s + stride, last + 1
  return out


@dataclasses.dataclass
class _Row:
  """One model input: ids (with specials), the positions predictions are read at, and for each
  (line slot, prefix j); targets are the gold ids."""

  slot: int
  ids: list[int]
  positions: list[int]
  prefixes: list[int]
  targets: list[int]


class NextTokenPredictor:
  """Top-k next pieces and the gold piece's log-probability, batched over length buckets.

  Batches are planned, padded and split over ``devices`` (default: this host's local devices;
  params replicated) by ``bert_jax.data.inference_batches.InferenceBatches``, so the batch
  size is rounded up to a multiple of their number.
  """

  def __init__(
    self,
    params: dict[str, Any],
    config,
    tokenizer,
    mode: str,
    top_k: int = 5,
    max_seq_length: int = 128,
    batch_size: int = 64,
    stride: int | None = None,
    devices: Sequence[jax.Device] | None = None,
  ):
    if mode not in ("causal", "mlm"):
      raise ValueError(f"mode must be 'causal' or 'mlm' here, got {mode!r}")
    if max_seq_length < 4:
      raise ValueError(f"--max_seq_length must be at least 4, got {max_seq_length}")
    if max_seq_length > config.max_position_embeddings:
      raise ValueError(
        f"--max_seq_length={max_seq_length} exceeds the model's max_position_embeddings "
        f"{config.max_position_embeddings}"
      )
    self.vocab_size = min(tokenizer.vocab_size, config.vocab_size)
    if not 1 <= top_k <= self.vocab_size:
      raise ValueError(f"--top_k must be in [1, {self.vocab_size}], got {top_k}")
    if batch_size < 1:
      raise ValueError(f"--batch_size must be positive, got {batch_size}")
    context = max_seq_length - 1
    if stride is not None and not 1 <= stride <= context:
      raise ValueError(f"stride must be in [1, {context}], got {stride}")
    self.mode, self.top_k, self.max_seq_length, self.stride = mode, top_k, max_seq_length, stride
    self.tokenizer = tokenizer
    self.buckets = parse_buckets(BUCKET_STEP, max_seq_length)
    self._batches = InferenceBatches(batch_size, self.buckets, devices)
    self.batch_size = self._batches.batch_size
    missing = [k for k in ("bert", *_LM_HEAD) if k not in params]
    if missing:
      raise ValueError(f"the checkpoint's params lack {missing} (no language-model head)")
    self.params = self._batches.replicate({k: params[k] for k in ("bert", *_LM_HEAD)})
    model = BertForPreTraining(config.replace(dtype="float32"), next_sentence=False)
    causal, vocab, k = mode == "causal", self.vocab_size, top_k

    def predict(params, batch):
      ids_BxL = batch["input_ids"]
      out = model.apply(
        {"params": params},
        ids_BxL,
        batch["input_mask"],
        jnp.zeros_like(ids_BxL),
        None if causal else batch["positions"],  # causal: every position (P = L)
      )
      logits_BxPxV = out["mlm_logits"][..., :vocab].astype(jnp.float32)
      logp_BxPxV = jax.nn.log_softmax(logits_BxPxV, axis=-1)
      top_logp_BxPxK, top_ids_BxPxK = jax.lax.top_k(logp_BxPxV, k)
      targets_BxP = batch["targets"]
      gold_BxP = jnp.take_along_axis(logp_BxPxV, targets_BxP[..., None], axis=-1)[..., 0]
      return top_logp_BxPxK, top_ids_BxPxK, gold_BxP

    self._predict = jax.jit(predict)

  def rows(self, slot: int, ids: Sequence[int]) -> list[_Row]:
    """The model inputs that predict every prefix of one line's piece ids."""
    cls, sep, mask = self.tokenizer.cls_id, self.tokenizer.sep_id, self.tokenizer.mask_id
    ids = list(ids)
    if self.mode == "causal":
      return [
        _Row(
          slot,
          [cls] + ids[s:last],
          list(range(first - s, last - s + 1)),
          list(range(first, last + 1)),
          ids[first : last + 1],
        )
        for s, first, last in causal_windows(len(ids), self.max_seq_length, self.stride)
      ]
    out = []
    for j in range(len(ids)):
      a = max(0, j - (self.max_seq_length - 3))
      out.append(_Row(slot, [cls] + ids[a:j] + [mask, sep], [j - a + 1], [j], [ids[j]]))
    return out

  def _arrays(self, rows: Sequence[_Row], index: np.ndarray, length: int) -> dict[str, np.ndarray]:
    """The batch of ``rows[index]`` padded to ``length``: ids, mask, and the positions read and
    their gold ids (causal: the targets at their positions of a length-wide row; mlm: one)."""
    width = length if self.mode == "causal" else 1
    n = len(index)
    ids, mask = (np.zeros((n, length), np.int32) for _ in range(2))
    positions, targets = (np.zeros((n, width), np.int32) for _ in range(2))
    for i, r in enumerate(rows[j] for j in index):
      ids[i, : len(r.ids)], mask[i, : len(r.ids)] = r.ids, 1
      if self.mode == "causal":
        targets[i, r.positions] = r.targets
      else:
        positions[i, 0], targets[i, 0] = r.positions[0], r.targets[0]
    return {"input_ids": ids, "input_mask": mask, "positions": positions, "targets": targets}

  def run(self, rows: Sequence[_Row], lengths: Sequence[int]):
    """Per line slot: (top log-probs n x K, top ids n x K, gold log-probs n) for ``rows``, which
    cover every prefix of lines of ``lengths`` pieces; computed in length-sorted batches."""
    k = self.top_k
    top_lp = [np.zeros((n, k), np.float32) for n in lengths]
    top_ids = [np.zeros((n, k), np.int32) for n in lengths]
    gold = [np.zeros((n,), np.float32) for n in lengths]
    make = functools.partial(self._arrays, rows)
    outputs = self._batches.run(self._predict, self.params, [len(r.ids) for r in rows], make)
    for batch, (lp_BxPxK, ids_BxPxK, gold_BxP) in outputs:
      for b, i in enumerate(batch.rows):
        r = rows[i]
        cols = r.positions if self.mode == "causal" else [0]
        top_lp[r.slot][r.prefixes] = lp_BxPxK[b, cols]
        top_ids[r.slot][r.prefixes] = ids_BxPxK[b, cols]
        gold[r.slot][r.prefixes] = gold_BxP[b, cols]
    return top_lp, top_ids, gold


def _chunks(input_file: str, tokenizer, predictor: NextTokenPredictor, chunk_rows: int):
  """(first line index, piece ids of each line, rows) for consecutive chunks of the input."""
  lines, rows, start = [], [], 0
  block: list[str] = []

  def flush_block():
    for text_ids in tokenizer.encode_batch(block):
      rows.extend(predictor.rows(len(lines), text_ids))
      lines.append(list(text_ids))
    block.clear()

  for text in iter_text_lines(input_file):
    block.append(text)
    if len(block) >= 256:
      flush_block()
      if len(rows) >= chunk_rows:
        yield start, lines, rows
        start += len(lines)
        lines, rows = [], []
  flush_block()
  if lines:
    yield start, lines, rows


def _records(
  start: int, lines, result, pieces: list[str], counts: dict[str, float]
) -> Iterator[str]:
  """JSON lines of one chunk in input order; adds to ``counts``."""
  for slot, ids in enumerate(lines):
    counts["lines"] += 1
    if not ids:
      counts["empty_lines"] += 1
      continue
    top_lp, top_ids, gold = (x[slot] for x in result)
    lp_rounded = np.round(top_lp.astype(np.float64), 6).tolist()
    gold_rounded = np.round(gold.astype(np.float64), 6).tolist()
    for j, target in enumerate(ids):
      hits = np.flatnonzero(top_ids[j] == target)
      rank = int(hits[0]) + 1 if hits.size else None
      counts["prefixes"] += 1
      counts["top1"] += rank == 1
      counts["topk"] += rank is not None
      counts["gold_logprob_sum"] += float(gold[j])
      yield json.dumps(
        {
          "line": start + slot,
          "prefix_len": j,
          "gold": pieces[target],
          "gold_logprob": gold_rounded[j],
          "gold_rank": rank,
          "topk": [[pieces[t], lp] for t, lp in zip(top_ids[j].tolist(), lp_rounded[j])],
        }
      )


def predict_next(
  input_file: str,
  output_file: str,
  checkpoint: str,
  top_k: int = 5,
  max_seq_length: int = 128,
  batch_size: int = 64,
  mode: str = "auto",
  do_lower_case: bool | None = None,
  summary_file: str | None = None,
  stride: int | None = None,
  chunk_rows: int | None = None,
  devices: Sequence[jax.Device] | None = None,
) -> dict[str, Any]:
  """Writes ``output_file`` (JSON lines, one per prefix) and the summary; returns the summary.

  ``checkpoint`` is anything ``load_pretrained`` reads that has an LM head (a bert_jax
  pre-training workdir or one of its steps, a Hugging Face BertForMaskedLM / BertLMHeadModel /
  BertForPreTraining directory, a google-research/bert checkpoint). ``chunk_rows`` (default
  32 batches) bounds how many rows are held before a chunk is written.
  """
  start_time = time.perf_counter()
  if not os.path.isfile(input_file):
    raise FileNotFoundError(2, "no such input file (--input_file)", input_file)
  out_path = pathlib.Path(output_file)
  summary_file = summary_file or f"{output_file}.summary.json"
  check_outputs(
    {"--output_file": output_file, "--summary_file": summary_file},
    {"--input_file": input_file, "--checkpoint": checkpoint},
  )
  check_parent("--output_file", output_file)
  check_parent("--summary_file", summary_file)
  if mode not in MODES:
    raise ValueError(f"--mode={mode!r} is not one of {MODES}")
  pre = load_pretrained(checkpoint, do_lower_case=do_lower_case)
  if pre.tokenizer is None:
    raise ValueError(f"{checkpoint}: the checkpoint has no vocabulary (vocab.txt or .model)")
  if "mlm" in pre.absent or "mlm_output_bias" not in pre.params:
    raise ValueError(
      f"{checkpoint}: the checkpoint has no language-model head (it is a {pre.task} "
      "checkpoint); predict_next needs a pre-training one (a bert_jax pre-training workdir, a "
      "Hugging Face BertForMaskedLM / BertLMHeadModel / BertForPreTraining)"
    )
  resolved = resolve_mode(mode, pre.config.is_decoder, checkpoint)
  predictor = NextTokenPredictor(
    pre.params,
    pre.config,
    pre.tokenizer,
    resolved,
    top_k,
    max_seq_length,
    batch_size,
    stride,
    devices,
  )
  loaded = time.perf_counter()
  pieces = pre.tokenizer.convert_ids_to_tokens(range(predictor.vocab_size))
  counts = dict.fromkeys(("lines", "empty_lines", "prefixes", "top1", "topk"), 0)
  counts["gold_logprob_sum"] = 0.0
  chunk_rows = chunk_rows or 32 * predictor.batch_size
  total_lines = count_lines(input_file)

  def write(tmp: str) -> None:
    chunks = _chunks(input_file, pre.tokenizer, predictor, chunk_rows)
    progress = Progress(
      f"predict_next {input_file}", total_lines, "lines", interval_sec=PROGRESS_INTERVAL_SEC
    )
    with progress, open(tmp, "w", encoding="utf-8") as w:
      with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:

        def submit():
          chunk = next(chunks, None)
          if chunk is None:
            return None
          first, lines, rows = chunk
          return first, lines, pool.submit(predictor.run, rows, [len(x) for x in lines])

        upcoming = submit()
        while upcoming is not None:
          first, lines, future = upcoming
          result = future.result()
          upcoming = submit()  # the model computes the next chunk while this one is written
          for record in _records(first, lines, result, pieces, counts):
            w.write(record + "\n")
          progress.update(len(lines))

  atomic_write(out_path, write)
  end = time.perf_counter()
  n = counts["prefixes"]
  mean = counts["gold_logprob_sum"] / n if n else None
  summary = {
    "lines": counts["lines"],
    "empty_lines": counts["empty_lines"],
    "prefixes": n,
    "top1_accuracy": counts["top1"] / n if n else None,
    "topk_accuracy": counts["topk"] / n if n else None,
    "mean_gold_logprob": mean,
    "perplexity": math.exp(-mean) if mean is not None else None,
    "k": top_k,
    "mode": resolved,
    "max_seq_length": max_seq_length,
    "checkpoint": str(checkpoint),
    "checkpoint_source": pre.source,
    "output_file": str(out_path),
    "load_seconds": round(loaded - start_time, 3),
    "predict_seconds": round(end - loaded, 3),
    "prefixes_per_second": round(n / max(end - loaded, 1e-9), 1),
  }
  write_json(summary_file, summary)
  return summary
