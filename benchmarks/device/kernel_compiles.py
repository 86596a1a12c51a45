r"""Per-chip memory and estimated step of BERT pre-training at seq 512 with each attention kernel,
compiled for TPU topologies on any host (libtpu, no TPU): the fused splash kernel (attention
dropout 0) against the reference path (dropout 0, and the paper's 0.1).

  python -m benchmarks.device.kernel_compiles \
      --out benchmarks/results/kernels/compiles.json     # appends; rewrites compiles.md beside it
  python -m benchmarks.device.kernel_compiles --sizes=base --topologies=v5e:2x2 --runs=splash:0

Each compile is ``python -m bert_jax.compile``'s train step (``compile_for_topology`` in a child
process, the eval step left out to save compile time) of configs/pretrain.py:<size> with
``--config.max_seq_length=512 --config.max_predictions_per_seq=80 --config.phase2.fraction=0
--config.dtype=bfloat16 --config.attention_kernel=<k> --config.attention_probs_dropout_prob=<p>``
and the batch given; each row records that command. Rows are written as each compile ends.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import time

from bert_jax.parallel.topology import parse_topology
from bert_jax.plan.isolation import compile_for_topology_isolated
from configs import pretrain

SEQ, PREDICTIONS = 512, 80


def config_for(size: str, kernel: str, dropout: float, batch: int):
  c = pretrain.get_config(size)
  c.unlock()
  c.max_seq_length, c.max_predictions_per_seq, c.phase2.fraction = SEQ, PREDICTIONS, 0.0
  c.train_batch_size = c.eval_batch_size = batch
  c.dtype = "bfloat16"
  c.attention_kernel, c.attention_probs_dropout_prob = kernel, dropout
  return c


def command(size: str, topo: str, kernel: str, dropout: float, batch: int) -> str:
  return (
    f"python -m bert_jax.compile --config configs/pretrain.py:{size} --topology {topo} "
    f"--config.max_seq_length={SEQ} --config.max_predictions_per_seq={PREDICTIONS} "
    f"--config.phase2.fraction=0 --config.train_batch_size={batch} "
    f"--config.eval_batch_size={batch} --config.dtype=bfloat16 "
    f"--config.attention_kernel={kernel} --config.attention_probs_dropout_prob={dropout:g}"
  )


def row_of(result: dict, size: str, topo: str, kernel: str, dropout: float, batch: int) -> dict:
  step = result["steps"][0]
  m, e = step["memory"], step.get("estimate") or {}
  return dict(
    size=size,
    topology=topo,
    kernel=result.get("attention_kernel", kernel),
    attention_dropout=dropout,
    global_batch=batch,
    batch_per_chip=step["batch_per_chip"],
    mesh=result["mesh"],
    fits=step["fits"],
    temp_gib=m.get("temp_bytes", 0) / 1024**3,
    total_gib=(m.get("total_bytes") or m.get("needed_bytes") or 0) / 1024**3,
    hbm_gib=m.get("hbm_bytes", 0) / 1024**3,
    step_ms=e.get("step_seconds", 0) * 1e3,
    bound=e.get("bound", ""),
    tokens_per_second=e.get("tokens_per_second", 0),
    mfu=e.get("mfu", 0),
    compiler_tflop_per_chip=step.get("flops", 0) / 1e12,
    attention_tflop_added_per_chip=step.get("attention_flops", 0) / 1e12,
    compile_seconds=step["compile_seconds"],
    error=step.get("error", ""),
    command=command(size, topo, kernel, dropout, batch),
    date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    host=f"{socket.gethostname()} ({platform.machine()}, {os.cpu_count()} cores)",
  )


def markdown(rows: list[dict]) -> str:
  lines = [
    "| model | topology | kernel | attn dropout | batch/chip | fits | temp GiB | total GiB "
    "| est. step ms | bound | tok/s | MFU | kernel TFLOP added/chip | compile s |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['size']} | {r['topology']} | {r['kernel']} | {r['attention_dropout']:g} "
      f"| {r['batch_per_chip']:g} | {'yes' if r['fits'] else 'NO'} | {r['temp_gib']:.2f} "
      f"| {r['total_gib']:.2f} | {r['step_ms']:.1f} | {r['bound']} "
      f"| {r['tokens_per_second']:,.0f} | {r['mfu']:.1%} "
      f"| {r['attention_tflop_added_per_chip']:.2f} | {r['compile_seconds']:.0f} |"
    )
  return "\n".join(lines)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--sizes", default="base,large")
  p.add_argument("--topologies", default="v5e:2x2,v5p:2x2x1")
  p.add_argument("--runs", default="splash:0,reference:0,reference:0.1", help="kernel:dropout")
  p.add_argument("--batch_per_chip", type=int, default=8)
  p.add_argument("--out", default="benchmarks/results/kernels/compiles.json")
  args = p.parse_args(argv)
  rows = []
  if os.path.exists(args.out):
    with open(args.out) as f:
      rows = json.load(f)
  for size in args.sizes.split(","):
    for name in args.topologies.split(","):
      topo = parse_topology(name)
      batch = args.batch_per_chip * topo.num_devices
      for run in args.runs.split(","):
        kernel, dropout = run.split(":")[0], float(run.split(":")[1])
        t = time.monotonic()
        print(f"{size} {name} {kernel} dropout {dropout:g} ...", flush=True)
        try:
          result = compile_for_topology_isolated(
            config_for(size, kernel, dropout, batch), topo, with_eval=False, progress=print
          )
        except ValueError as e:
          print(f"  failed: {e}", flush=True)
          continue
        rows.append(row_of(result, size, name, kernel, dropout, batch))
        print(f"  {time.monotonic() - t:.0f} s: {json.dumps(rows[-1])}", flush=True)
        with open(args.out, "w") as f:
          json.dump(rows, f, indent=1)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
          f.write(markdown(rows) + "\n")


if __name__ == "__main__":
  main()
