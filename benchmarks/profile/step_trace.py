r"""Time and trace the pre-training step on jax's default device (a GPU or TPU host).

  python -m benchmarks.profile.step_trace --size=base --seq=128 --batch=256 --dtype=bfloat16 \
      --out=/tmp/t
  python -m benchmarks.profile.step_trace ... --no_dropout          # the same step, dropout rates 0
  python -m benchmarks.profile.step_trace --summarize=/tmp/t/base-128-256-bfloat16.trace.json.gz

The step is the run's own (``build_job`` on synthetic input, ``trainer.assemble``, its jitted
donated step), compiled as a run compiles it. After one warm-up step (the compile) it times
``--steps`` steps ``--repeats`` times (median), then records ``--trace_steps`` steps with
``jax.profiler`` and copies the Perfetto trace and the compiled HLO to ``--out`` (both gzipped),
with the timings as JSON. ``--summarize`` reads such a trace back: device time per kernel name,
longest first, over the traced steps (the kernels named by XLA: a fusion's name is that of its
instruction in the HLO file beside it).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import shutil
import statistics
import tempfile
import time

import jax

from benchmarks.common import flags
from benchmarks.common.pretrain_step import (
  assemble_run,
  global_batches,
  peak_bytes,
  synthetic_config,
  time_steps,
)
from bert_jax import parallel
from bert_jax.model.config import BertConfig


def _config(args, workdir: str):
  config = synthetic_config(args.size, [args.seq], [args.batch], args.dtype)
  if args.no_dropout:
    model = BertConfig.from_preset(
      args.size, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    path = os.path.join(workdir, "bert_config.json")
    with open(path, "w") as f:
      json.dump(model.to_dict(), f)
    config.bert_config_file = path
  return config


def summarize(path: str, top: int) -> list[tuple[str, float, int]]:
  """(kernel name, device milliseconds, launches) over the trace's GPU / TPU streams."""
  with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
    events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  device_pids = {
    e["pid"]
    for e in events
    if e.get("ph") == "M"
    and e.get("name") == "process_name"
    and any(d in str(e.get("args", {}).get("name", "")) for d in ("/device:GPU", "/device:TPU"))
  }
  total, count = collections.Counter(), collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in device_pids:
      total[e["name"]] += e.get("dur", 0.0) / 1e3
      count[e["name"]] += 1
  rows = [(name, ms, count[name]) for name, ms in total.most_common(top)]
  print(f"device time {sum(total.values()):,.1f} ms in {sum(count.values())} kernels ({path})")
  for name, ms, n in rows:
    print(f"{ms:10.2f} ms {n:6d}x  {name[:110]}")
  return rows


def _parser():
  p = flags.parser(__doc__)
  p.add_argument("--size", default="base", help="pretrain preset")
  p.add_argument("--seq", type=int, default=128, help="sequence length")
  p.add_argument("--batch", type=int, default=256, help="global batch (sequences)")
  p.add_argument(
    "--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="compute dtype"
  )
  flags.add_bool(p, "no_dropout", False, "set both dropout rates to 0")
  p.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
  p.add_argument("--repeats", type=int, default=3, help="timings (median)")
  p.add_argument("--trace_steps", type=int, default=3, help="steps to trace (0: none)")
  p.add_argument("--out", default="/tmp/step_trace", help="folder for the trace, HLO and JSON")
  p.add_argument("--summarize", default="", help="print a trace's kernels and exit")
  p.add_argument("--top", type=int, default=25, help="kernels to print")
  return p


def main(argv=None):
  args = _parser().parse_args(argv)
  if args.summarize:
    summarize(args.summarize, args.top)
    return
  os.makedirs(args.out, exist_ok=True)
  name = f"{args.size}-{args.seq}-{args.batch}-{args.dtype}" + (
    "-nodropout" if args.no_dropout else ""
  )
  with tempfile.TemporaryDirectory() as workdir:
    run = assemble_run(_config(args, workdir), workdir)
    batches = global_batches(run, 0)
    found = []
    with parallel.mesh_context(run.mesh, run.rules):
      t = time.perf_counter()  # the run's jitted step, compiled as its first call compiles it
      step = run.asm.train_steps[0].jitted.lower(run.state, batches[0]).compile()
      compile_s = time.perf_counter() - t
      times, _, state = time_steps(step, run.state, batches, args.steps, args.repeats)
      if args.trace_steps:
        trace_dir = os.path.join(workdir, "trace")
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
          for i in range(args.trace_steps):
            state, metrics = step(state, batches[i % 2])
          jax.block_until_ready(metrics)
        found = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
        if found:
          shutil.copy(found[0], os.path.join(args.out, f"{name}.trace.json.gz"))
        with gzip.open(os.path.join(args.out, f"{name}.hlo.txt.gz"), "wt") as f:
          f.write(step.as_text())
    peak = peak_bytes(jax.devices()[0])
    result = dict(
      name=name,
      device=jax.devices()[0].device_kind,
      jax_version=jax.__version__,
      compile_seconds=compile_s,
      step_ms=statistics.median(times) * 1e3,
      step_ms_all=[x * 1e3 for x in times],
      sequences_per_second=args.batch / statistics.median(times),
      peak_gib=None if peak is None else peak / 2**30,
    )
  print(json.dumps(result), flush=True)
  with open(os.path.join(args.out, f"{name}.json"), "w") as f:
    json.dump(result, f, indent=1)
  if args.trace_steps and found:
    summarize(os.path.join(args.out, f"{name}.trace.json.gz"), args.top)


if __name__ == "__main__":
  main()
