r"""The attention kernels on one accelerator, in one run of about 8 minutes (one H100 / H200).

  python -m benchmarks.device.check --output "$OUT/device_check.json"   # on the GPU machine
  python -m benchmarks.device.check --quick       # a CPU smoke run at tiny sizes, < 1 minute

1. Numerics: each fused kernel of the platform (``dot_product``: cuDNN's fused attention on a
   GPU (``jax.nn.dot_product_attention(implementation="cudnn")``); XLA's on a CPU;
   ``splash`` on a TPU, interpreted on a CPU) against the reference path on a small BertEncoder,
   forward output and every parameter's gradient, in float32 and bfloat16, on a padded batch and
   on a packed one (several sequences per row, ``sequence_ids``); the packed rows are also
   checked against each sequence computed alone in its own row, so a kernel that ignores the
   packing mask fails (MaxText issue #4476). Whether the compiled step calls cuDNN is read from
   its HLO (the ``__cudnn$fmha`` custom call).
2. Speed: BERT-base and BERT-large pre-training steps in bfloat16 at seq 128 and 512 (the same
   tokens per step), attention dropout 0: bert_jax's step (benchmarks/speed/pretrain.py's) with
   the reference path, the fused kernel, and the fused kernel on packed rows holding the same
   real tokens; the paper's attention dropout 0.1 (reference path) beside them; and PyTorch
   (transformers' BertForPreTraining with SDPA, MLM head at the masked positions:
   benchmarks/common/peers.py's ``torch_step``), run first in a child process so that each framework
   has the GPU's memory to itself. Tokens/s are real (non-padding) tokens per second; MFU is the
   rows' model FLOPs (bert_jax/train/flops.py) over the step time and the chip's dense bf16
   peak (989 TFLOP/s for an H100 or H200 SXM). Synthetic instances have random real lengths
   from L/8 to L (so that packing has something to pack).

3. Time to quality (benchmarks/device/time_to_quality.py, 45% of the budget): BERT-mini in
   bfloat16 pre-trained on the built-in corpus by bert_jax's paper and fast recipes and the
   PyTorch SDPA reference, the same short training budget each; held-out MLM accuracy and each
   recipe's time to the reference's final accuracy.

Imports (``# late: jax``): jax, and every module that imports it, is imported inside the functions that use it:
``--quick`` sets ``JAX_PLATFORMS`` before jax is imported (jax reads it at import), and the PyTorch
child process must take the GPU before any JAX backend starts.

Every section is time-boxed (``--budget_s``, default 480 s): a variant that would not finish in
its cell's share of what is left is skipped with a note, never half-run. PyTorch rows are
skipped with a note where torch or transformers is not installed (nothing is installed). Writes
one JSON (``--output``) and prints a table with the goals: bert_jax >= 1.3x the PyTorch SDPA peer
at seq 512, and >= 40% MFU for BERT-large at seq 128.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np

from benchmarks.common import REPO
from benchmarks.common.process import ChildFailed, run
from benchmarks.common.timing import Timer
from benchmarks.device import time_to_quality as ttq

GOAL_PEER_RATIO = 1.3  # bert_jax over the PyTorch SDPA peer, seq 512
GOAL_LARGE_MFU = 0.40  # BERT-large, seq 128
H100_PEAK = 989e12  # dense bf16, H100 SXM; the H200 has the same
PREDICTIONS = {128: 20, 512: 80}
SEQUENCES_PER_ROW = 4  # packed rows: at most this many sequences


@dataclasses.dataclass
class Settings:
  sizes: list[str]
  seq_lens: list[int]
  tokens_per_step: int
  steps: int
  budget_s: float
  numerics_preset: str
  numerics_batch: int
  quick: bool


def settings(args) -> Settings:
  if args.quick:
    # tiny sizes: nothing is skipped for time unless --budget_s says so
    return Settings(["tiny"], [128], 512, 2, args.budget_s or 600.0, "tiny", 2, True)
  sizes = args.sizes.split(",") if args.sizes else ["large", "base"]
  seqs = [int(s) for s in args.seq_lens.split(",")] if args.seq_lens else [128, 512]
  return Settings(
    sizes, seqs, args.tokens_per_step, args.steps, args.budget_s or 480.0, "mini", 8, False
  )


def cells(s: Settings) -> list[tuple[str, int]]:
  """(size, seq) in the order that reaches the goals' figures first: the largest model at the
  shortest length (the MFU goal), then seq 512 (the peer goal), then the rest."""
  order = [(size, seq) for size in s.sizes for seq in s.seq_lens]
  return sorted(order, key=lambda c: (c[1] != min(s.seq_lens) or c[0] != s.sizes[0], -c[1]))


class Clock:
  """The run's time budget."""

  def __init__(self, budget_s: float):
    self.start, self.budget = time.monotonic(), budget_s

  def left(self) -> float:
    return self.budget - (time.monotonic() - self.start)


# --- data ---------------------------------------------------------------------------------------
def instances(batch: int, seq: int, vocab: int = 30522, seed: int = 0):
  """Synthetic pre-training instances, real lengths from L/8 (at least the predictions + 3)."""
  from bert_jax.tasks.pretraining.synthetic_input import (
    SyntheticPretrainInput,
  )  # late: jax

  preds = PREDICTIONS.get(seq, max(1, seq // 7))
  return SyntheticPretrainInput(
    batch, seq, preds, vocab, seed=seed, min_length=max(preds + 3, seq // 8)
  )


def unpacked_batches(batch: int, seq: int, n: int = 2) -> list[dict]:
  it = instances(batch, seq)
  return [next(it) for _ in range(n)]


def packed_batches(batch: int, seq: int, n: int = 2) -> tuple[list[dict], int]:
  """Packed rows holding about the real tokens of ``batch`` unpacked instances: the rows
  ``batch`` instances need (measured on a first batch), rounded up to a multiple of 8."""
  from bert_jax.data.packing import PackedPretrainInput  # late: jax

  preds = PREDICTIONS.get(seq, max(1, seq // 7))

  def packer(rows: int):
    return PackedPretrainInput(
      instances(batch, seq), rows, seq, SEQUENCES_PER_ROW, preds * SEQUENCES_PER_ROW
    )

  probe = packer(batch)
  next(probe)
  per_row = probe.sequences / batch
  rows = max(1, min(batch, math.ceil(batch / per_row / 8) * 8 if batch >= 8 else batch))
  it = packer(rows)
  return [next(it) for _ in range(n)], rows


def real_tokens(batch: dict) -> int:
  return int(np.sum(batch["input_mask"]))


# --- PyTorch (a child process: the GPU's memory to itself) --------------------------------------
def torch_rows(s: Settings, budget_s: float) -> list[dict]:
  """The PyTorch SDPA peer on every cell, time-boxed; rows with a note where skipped."""
  try:
    import torch  # optional, heavy
    import transformers  # noqa: F401 (optional: whether it is installed)
  except ImportError as e:
    return [dict(size=z, seq=q, variant="torch_sdpa", note=f"skipped: {e}") for z, q in cells(s)]
  from benchmarks.common import peers  # late: jax
  from bert_jax.model import BertConfig  # late: jax

  # torch_step's transformers config takes the model's dropout rates: hidden 0.1, attention 0.
  device = "cuda" if torch.cuda.is_available() else "cpu"
  clock, rows, todo = Clock(budget_s), [], cells(s)
  for i, (size, seq) in enumerate(todo):
    box = math.inf if s.quick else clock.left() / (len(todo) - i)  # quick: no time box
    batch = max(1, s.tokens_per_step // seq)
    row = dict(size=size, seq=seq, variant="torch_sdpa", rows=batch, attention_dropout=0.0)
    if clock.left() < 5 and not s.quick:
      rows.append(dict(row, note="skipped: time box"))
      continue
    t0 = time.monotonic()
    try:
      bert = BertConfig.from_preset(
        size, vocab_size=30522, dtype="bfloat16", attention_probs_dropout_prob=0.0
      )
      run = peers.torch_step(bert, dtype="bfloat16", device=device)
      host = unpacked_batches(batch, seq)
      seconds = _time(run, host, s.steps, box - (time.monotonic() - t0))
      rows.append(_speed_row(row, bert, host, seq, seconds, _peak_torch(device)))
    except Exception as e:  # out of memory etc.: the row says so, the check goes on
      rows.append(dict(row, note=f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"))
    rows[-1]["seconds_spent"] = time.monotonic() - t0
    run = None
    gc.collect()
    if device == "cuda":
      torch.cuda.empty_cache()
  return rows


def _peak_torch(device: str) -> tuple[float, str]:
  if device != "cuda":
    return _peak_of(platform.processor() or "cpu")
  import torch  # optional, heavy

  return _peak_of(torch.cuda.get_device_name(0))


def _peak_of(kind: str) -> tuple[float, str]:
  """(peak bf16 FLOP/s, where it comes from) for a device kind."""
  from bert_jax.train import flops as flops_lib  # late: jax

  if "H100" in kind or "H200" in kind:
    return H100_PEAK, f"{kind}: 989 TFLOP/s dense bf16"
  peak = flops_lib.peak_flops_per_device(kind)
  return peak, f"{kind}: {peak / 1e12:g} TFLOP/s (bert_jax.train.flops's table or its CPU default)"


def _time(run, batches, steps: int, box: float) -> float | None:
  """Seconds per step (as benchmarks.speed.pretrain times: one untimed step, then ``steps``),
  or None when the first (compiling) step already took more than ``box``."""
  if Timer(repeats=0).time(lambda i: run(batches[0])).first > box:  # compiles / warms up
    return None
  return Timer(calls=steps).time(lambda i: run(batches[i % len(batches)])).mean


def _speed_row(row: dict, bert, host: list[dict], seq: int, seconds, peak) -> dict:
  from bert_jax.train import flops as flops_lib  # late: jax

  if seconds is None:
    return dict(row, note="skipped after its first step: over its time box")
  rows = host[0]["input_ids"].shape[0]
  preds = host[0]["masked_lm_positions"].shape[1]
  tokens = float(np.mean([real_tokens(b) for b in host]))
  flops = flops_lib.train_flops_per_example(bert, seq, preds) * rows
  return dict(
    row,
    rows=rows,
    real_tokens_per_step=tokens,
    step_ms=seconds * 1e3,
    tokens_per_second=tokens / seconds,
    mfu=flops / seconds / peak[0],
    peak=peak[1],
  )


# --- numerics -----------------------------------------------------------------------------------
def fused_kernels(on: str, quick: bool) -> list[str]:
  """The fused kernels checked on platform ``on`` (a CPU: splash interpreted, but not in a quick
  run, where it would take most of the minute)."""
  if on == "gpu" or (on == "cpu" and quick):
    return ["dot_product"]
  return ["dot_product", "splash"]


TOLERANCE = {"float32": (2e-4, 2e-3), "bfloat16": (4e-2, 8e-2)}  # (output, gradients): relative


def _numerics_batch(batch: int, seq: int, packed: bool) -> dict:
  """A padded batch, or packed rows of 2-3 sequences each (position ids restart per sequence)."""
  rng = np.random.default_rng(1)
  ids = rng.integers(5, 1000, (batch, seq)).astype(np.int32)
  mask = np.ones((batch, seq), np.int32)
  for r in range(1, batch, 2):  # every other row padded at its end
    mask[r, seq - seq // 4 - r :] = 0
  out = dict(input_ids_BxL=ids * mask, input_mask_BxL=mask)
  if not packed:
    out["segment_ids_BxL"] = (np.arange(seq)[None] > seq // 3) * mask
    return out
  seq_ids = np.zeros((batch, seq), np.int32)
  for r in range(batch):
    cuts = sorted(rng.choice(np.arange(8, seq - 8), size=2 if r % 2 else 1, replace=False))
    bounds = [0, *cuts, seq - (seq // 8 if r % 3 == 0 else 0)]
    for s_id, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]), 1):
      seq_ids[r, a:b] = s_id
  starts = np.maximum.accumulate(
    np.where(np.diff(seq_ids, prepend=-1, axis=1) != 0, np.arange(seq), 0), axis=1
  )
  mask = (seq_ids > 0).astype(np.int32)
  out.update(
    input_ids_BxL=ids * mask,
    input_mask_BxL=mask,
    segment_ids_BxL=((np.arange(seq)[None] - starts) > 6).astype(np.int32) * mask,
    sequence_ids_BxL=seq_ids,
    position_ids_BxL=((np.arange(seq)[None] - starts) * mask).astype(np.int32),
  )
  return out


def _alone(batch: dict) -> tuple[dict, list[tuple[int, int, int, int]]]:
  """Each packed sequence alone at the start of its own row: (the rows, [(packed row, start,
  end, alone row)])."""
  seq_ids = batch["sequence_ids_BxL"]
  length = seq_ids.shape[1]
  spans = []
  for r in range(seq_ids.shape[0]):
    for s_id in range(1, int(seq_ids[r].max()) + 1):
      where = np.nonzero(seq_ids[r] == s_id)[0]
      spans.append((r, int(where[0]), int(where[-1]) + 1, len(spans)))
  ids = np.zeros((len(spans), length), np.int32)
  mask, segs = np.zeros_like(ids), np.zeros_like(ids)
  for r, a, b, i in spans:
    ids[i, : b - a] = batch["input_ids_BxL"][r, a:b]
    segs[i, : b - a] = batch["segment_ids_BxL"][r, a:b]
    mask[i, : b - a] = 1
  return dict(input_ids_BxL=ids, input_mask_BxL=mask, segment_ids_BxL=segs), spans


def _rel(a, b, floor: float = 1e-12) -> float:
  """max |a - b| over the scale of ``b`` (at least ``floor``)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), floor))


def encoder_run(preset: str, kernel: str, dtype: str, batch: dict):
  """A BertEncoder of ``preset`` (no dropout) with ``kernel`` on ``batch``: (sequence_output,
  the gradients of a fixed random projection of it at the real tokens, whether the compiled
  step calls cuDNN's fused attention)."""
  import flax.linen as nn  # late: jax
  import jax  # late: jax
  import jax.numpy as jnp  # late: jax

  from bert_jax.model import BertConfig, BertEncoder  # late: jax

  config = BertConfig.from_preset(preset, vocab_size=1000).replace(
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attention_kernel=kernel, dtype=dtype
  )
  model = BertEncoder(config)
  params = nn.unbox(model.init(jax.random.key(0), batch["input_ids_BxL"][:1])["params"])
  w = jax.random.normal(jax.random.key(1), batch["input_ids_BxL"].shape + (config.hidden_size,))

  def loss(params):
    out = model.apply({"params": params}, **batch)["sequence_output"].astype(jnp.float32)
    real = batch["input_mask_BxL"][..., None]
    return jnp.sum(out * w * real), out

  step = jax.jit(jax.value_and_grad(loss, has_aux=True))
  text = step.lower(params).compile().as_text()
  (_, out), grads = step(params)
  return np.asarray(out), grads, "__cudnn$fmha" in text


def numerics(s: Settings, on: str) -> list[dict]:
  """Each fused kernel against the reference path (module docstring, item 1)."""
  seq = 128
  rows = []

  def run(kernel: str, dtype: str, batch: dict):
    return encoder_run(s.numerics_preset, kernel, dtype, batch)

  # quick: float32 padded and packed, bfloat16 packed
  cases = [(d, p) for d in ("float32", "bfloat16") for p in (False, True)]
  for dtype, packed in [c for c in cases if not (s.quick and c == ("bfloat16", False))]:
    batch = _numerics_batch(s.numerics_batch, seq, packed)
    real = batch["input_mask_BxL"] > 0
    ref_out, ref_grads, _ = run("reference", dtype, batch)
    alone_ref = None
    if packed:  # the reference path on each sequence alone: the packing mask's meaning
      alone, spans = _alone(batch)
      alone_out = run("reference", dtype, alone)[0]
      alone_ref = (alone_out, spans)
      rows.append(
        _numerics_row("reference", dtype, packed, ref_out, real, None, None, alone_ref, False)
      )
    for kernel in fused_kernels(on, s.quick):
      t = time.monotonic()
      try:
        out, grads, cudnn = run(kernel, dtype, batch)
      except Exception as e:  # a kernel this platform cannot run: the row says why
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        rows.append(dict(kernel=kernel, dtype=dtype, packed=packed, ok=False, note=first))
        continue
      row = _numerics_row(
        kernel, dtype, packed, out, real, (ref_out, ref_grads), grads, alone_ref, cudnn
      )
      row["seconds"] = time.monotonic() - t
      rows.append(row)
  return rows


def _numerics_row(kernel, dtype, packed, out, real, ref, grads, alone_ref, cudnn) -> dict:
  import jax  # late: jax

  tol_out, tol_grad = TOLERANCE[dtype]
  row = dict(kernel=kernel, dtype=dtype, packed=packed, cudnn_custom_call=cudnn)
  ok = True
  if ref is not None:
    ref_out, ref_grads = ref
    row["output_rel_err"] = _rel(out[real], ref_out[real])
    leaves = list(zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)))
    # a leaf's error over its own scale, at least 1% of the largest gradient (the key biases'
    # gradients are zero but for rounding: softmax ignores a constant added to every score)
    floor = 1e-2 * max(float(np.max(np.abs(np.asarray(r, np.float64)))) for _, r in leaves)
    errs = [_rel(g, r, floor) for g, r in leaves]
    row["grad_rel_err_max"] = max(errs)
    ok &= row["output_rel_err"] <= tol_out and row["grad_rel_err_max"] <= tol_grad
  if alone_ref is not None:
    alone_out, spans = alone_ref
    errs = [_rel(out[r, a:b], alone_out[i, : b - a]) for r, a, b, i in spans]
    row["packed_vs_alone_rel_err"] = max(errs)
    ok &= row["packed_vs_alone_rel_err"] <= tol_out
  row.update(ok=bool(ok), tolerance=dict(output=tol_out, gradients=tol_grad))
  return row


# --- bert_jax's step ----------------------------------------------------------------------------
def jax_rows(s: Settings, clock: Clock, on: str, peak: tuple[float, str]) -> list[dict]:
  """bert_jax's step in each variant on every cell, time-boxed (module docstring, item 2)."""
  import jax  # late: jax
  import jax.numpy as jnp  # late: jax

  from benchmarks.speed.pretrain import bert_jax_step  # late: jax
  from bert_jax.model import BertConfig  # late: jax

  fused = "splash" if on == "tpu" else "dot_product"
  variants = [  # (name, kernel, attention dropout, packed), the goals' first
    (fused, fused, 0.0, False),
    ("reference", "reference", 0.0, False),
    (f"{fused}_packed", fused, 0.0, True),
    ("reference_dropout0.1", "reference", 0.1, False),
  ]
  out, todo = [], cells(s)
  for i, (size, seq) in enumerate(todo):
    box_end = time.monotonic() + clock.left() / (len(todo) - i)
    batch = max(1, s.tokens_per_step // seq)
    unpacked = unpacked_batches(batch, seq)
    packed, packed_rows = packed_batches(batch, seq)
    longest = 0.0
    for name, kernel, dropout, is_packed in variants:
      row = dict(size=size, seq=seq, variant=name, kernel=kernel, attention_dropout=dropout)
      left = math.inf if s.quick else box_end - time.monotonic()  # quick: every variant runs
      if left < max(longest, 1.0):
        out.append(dict(row, note=f"skipped: time box ({left:.0f} s left in this cell)"))
        continue
      t0 = time.monotonic()
      try:
        bert = BertConfig.from_preset(
          size, vocab_size=30522, dtype="bfloat16", attention_probs_dropout_prob=dropout
        ).replace(attention_kernel=kernel)
        host = packed if is_packed else unpacked
        rows = host[0]["input_ids"].shape[0]
        run = bert_jax_step(bert, rows, seq, host[0]["masked_lm_positions"].shape[1])
        device = [{k: jnp.asarray(v) for k, v in b.items()} for b in host]
        seconds = _time(run, device, s.steps, left)
        out.append(_speed_row(row, bert, host, seq, seconds, peak))
      except Exception as e:  # out of memory etc.: the row says so, the check goes on
        out.append(dict(row, note=f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"))
      spent = time.monotonic() - t0
      out[-1]["seconds_spent"] = spent
      longest = max(longest, spent)
      run = device = None
      gc.collect()
      jax.clear_caches()
    del packed_rows
  return out


# --- the report ---------------------------------------------------------------------------------
def goals(speed: list[dict]) -> dict[str, Any]:
  """The goals' figures from the speed rows (None where a row is missing)."""
  done = [r for r in speed if "tokens_per_second" in r]
  ours = [r for r in done if r["variant"] != "torch_sdpa"]
  out: dict[str, Any] = {}
  for r in (r for r in done if r["variant"] == "torch_sdpa" and r["seq"] == 512):
    best = max(
      (o for o in ours if (o["size"], o["seq"]) == (r["size"], r["seq"])),
      key=lambda o: o["tokens_per_second"],
      default=None,
    )
    if best:
      ratio = best["tokens_per_second"] / r["tokens_per_second"]
      out[f"{r['size']} seq 512 vs PyTorch SDPA"] = dict(
        ratio=ratio, variant=best["variant"], goal=GOAL_PEER_RATIO, met=ratio >= GOAL_PEER_RATIO
      )
  large = [o for o in ours if o["size"] == "large" and o["seq"] == 128]
  if large:
    best = max(large, key=lambda o: o["mfu"])
    out["large seq 128 MFU"] = dict(
      mfu=best["mfu"],
      variant=best["variant"],
      goal=GOAL_LARGE_MFU,
      met=best["mfu"] >= GOAL_LARGE_MFU,
    )
  return out


def format_table(result: dict) -> str:
  lines = [f"device: {result['device']}; peak {result['peak']}", "", "numerics (vs reference):"]
  lines.append(
    f"  {'kernel':<12} {'dtype':<9} {'batch':<7} {'out err':>9} {'grad err':>9} "
    f"{'vs alone':>9} cudnn  ok"
  )
  for r in result["numerics"]:
    if "note" in r:
      lines.append(
        f"  {r['kernel']:<12} {r['dtype']:<9} {'packed' if r['packed'] else 'padded':<7} {r['note']}"
      )
      continue
    errs = [
      f"{r[k]:>9.1e}" if k in r else f"{'-':>9}"
      for k in ("output_rel_err", "grad_rel_err_max", "packed_vs_alone_rel_err")
    ]
    lines.append(
      f"  {r['kernel']:<12} {r['dtype']:<9} {'packed' if r['packed'] else 'padded':<7} "
      f"{' '.join(errs)} "
      f"{'yes' if r.get('cudnn_custom_call') else 'no':>5}  {'ok' if r['ok'] else 'FAIL'}"
    )
  lines += ["", "train step, bfloat16 (tokens: real tokens):"]
  lines.append(
    f"  {'model':<6} {'seq':>4} {'variant':<22} {'rows':>5} {'tok/step':>9} {'step ms':>9} "
    f"{'tok/s':>11} {'MFU':>6}"
  )
  for r in result["speed"]:
    head = f"  {r['size']:<6} {r['seq']:>4} {r['variant']:<22}"
    if "tokens_per_second" not in r:
      lines.append(f"{head} {r.get('note', '')}")
      continue
    lines.append(
      f"{head} {r['rows']:>5} {r['real_tokens_per_step']:>9,.0f} {r['step_ms']:>9.1f} "
      f"{r['tokens_per_second']:>11,.0f} {r['mfu']:>6.1%}"
    )
  lines += ttq.table_lines(result.get("time_to_quality", {}))
  lines += ["", "goals:"]
  for name, g in result["goals"].items():
    figure = f"x{g['ratio']:.2f}" if "ratio" in g else f"{g['mfu']:.1%}"
    target = f"x{g['goal']}" if "ratio" in g else f"{g['goal']:.0%}"
    lines.append(
      f"  {name}: {figure} ({g['variant']}; goal {target}) {'met' if g['met'] else 'NOT met'}"
    )
  if not result["goals"]:
    lines.append("  (no figures: the rows they need were not run)")
  lines += [f"  note: {n}" for n in result["notes"]]
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true", help="tiny sizes on any device (CPU smoke run)")
  p.add_argument("--output", default="", help="write the result here as JSON")
  p.add_argument("--budget_s", type=float, default=0.0, help="the whole run's time box (s)")
  p.add_argument("--sizes", default="", help="BertConfig presets (default large,base)")
  p.add_argument("--seq_lens", default="", help="sequence lengths (default 128,512)")
  p.add_argument("--tokens_per_step", type=int, default=32768, help="batch = this / seq")
  p.add_argument("--steps", type=int, default=10, help="timed steps per variant")
  p.add_argument(
    "--ttq_share", type=float, default=-1.0, help="time to quality's share (-1: 0.45; 0: off)"
  )
  p.add_argument("--torch_rows", default="", help=argparse.SUPPRESS)  # the child's output file
  args = p.parse_args(argv)
  s = settings(args)
  if s.quick:  # a smoke run on this host's CPU, whatever plugins jax could load
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if args.torch_rows:  # the child: PyTorch only, before any JAX backend starts
    with open(args.torch_rows, "w") as f:
      json.dump(torch_rows(s, s.budget_s), f)
    return 0
  clock = Clock(s.budget_s)
  notes = []
  # 1. PyTorch in a child process, first: JAX has not taken the GPU's memory yet.
  torch_budget = s.budget_s * (0.3 if s.quick else 0.2)  # quick: mostly importing torch
  tmp = f"/tmp/device_check_torch_{os.getpid()}.json"
  child = [sys.executable, "-m", "benchmarks.device.check", "--torch_rows", tmp]
  child += ["--budget_s", str(torch_budget), "--steps", str(s.steps)]
  child += ["--tokens_per_step", str(s.tokens_per_step)] + (["--quick"] if s.quick else [])
  if not s.quick:
    child += ["--sizes", ",".join(s.sizes), "--seq_lens", ",".join(map(str, s.seq_lens))]
  env = {"USE_TF": "0", "USE_FLAX": "0"}  # transformers: PyTorch alone (faster start)
  try:
    run(child, cwd=REPO, env=env, timeout_s=torch_budget + 60)
    with open(tmp) as f:
      torch_speed = json.load(f)
  except (ChildFailed, subprocess.SubprocessError, OSError, ValueError) as e:
    torch_speed = []
    notes.append(f"PyTorch rows: the child process failed ({type(e).__name__}: {e})")
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  # 2. time to quality, in child processes (each recipe has the accelerator to itself)
  share = (0.5 if s.quick else 0.45) if args.ttq_share < 0 else args.ttq_share
  ttq_result = ttq.section(s.budget_s * share, s.quick) if share > 0 else dict(note="off")
  import jax  # late: jax

  on = jax.default_backend()
  on = "gpu" if on in ("gpu", "cuda", "rocm") else on
  kind = jax.devices()[0].device_kind
  peak = _peak_of(kind)
  # 3. numerics, time-boxed by their size (seconds on a GPU; tiny in --quick)
  t = time.monotonic()
  checks = numerics(s, on)
  notes.append(f"numerics took {time.monotonic() - t:.0f} s")
  # 4. bert_jax's step
  speed = jax_rows(s, clock, on, peak)
  by_cell = {}
  for r in speed + torch_speed:
    by_cell.setdefault((r["size"], r["seq"]), []).append(r)
  ordered = [r for c in cells(s) for r in by_cell.get(c, [])]
  if any("skipped" in r.get("note", "") and "No module" in r.get("note", "") for r in torch_speed):
    notes.append("torch / transformers not installed here: PyTorch rows skipped")
  result = dict(
    date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    command=" ".join(
      [os.path.basename(sys.executable), "-m", "benchmarks.device.check", *(argv or sys.argv[1:])]
    ),
    host=socket.gethostname(),
    device=f"{kind} x{jax.device_count()} ({on})",
    peak=peak[1],
    jax=jax.__version__,
    quick=s.quick,
    budget_s=s.budget_s,
    seconds=time.monotonic() - clock.start,
    numerics=checks,
    speed=ordered,
    time_to_quality=ttq_result,
    notes=notes,
  )
  result["goals"] = goals(ordered)
  print(format_table(result), flush=True)
  if args.output:
    with open(args.output, "w") as f:
      json.dump(result, f, indent=1)
    print(f"wrote {args.output}")
  return 0 if all(r["ok"] for r in checks) else 1


if __name__ == "__main__":
  sys.exit(main())
