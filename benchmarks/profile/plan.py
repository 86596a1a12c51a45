r"""The paper's pre-training runs planned for TPU slices: layout, memory per chip, estimated step
time and time to train, each from the XLA TPU compiler (no TPU needed; libtpu must be installed).

  python -m benchmarks.profile.plan --runs=large-512-256@v5e-256            # one run
  python -m benchmarks.profile.plan --runs=all --max_meshes=3 --out=/tmp/plan.json
  python -m benchmarks.profile.plan --list
  python -m benchmarks.profile.plan --runs=large-512-256@v5e-256 --quick   # screen, then verify
  python -m benchmarks.profile.plan --input_demand   # examples/s per host at 100% / 50% MFU

A run is ``<size>-<seq>-<global batch>@<accelerator type>``: BERT-base/large (bf16 compute,
fp32 params), one phase at ``seq`` with BERT's predictions per sequence (20 at 128, 80 at 512),
AdamW at the paper's batch (256) and LAMB at the LAMB-scale batches (You et al. 2020: 65,536 at
128, 32,768 at 512). Each run goes through ``bert_jax.plan.planner.make_plan`` (cached on disk,
so a re-run prints at once). Time to train is printed for the paper's schedule (Devlin et al.
2019, A.2: 1,000,000 steps of 256 sequences, 90% at 128 and 10% at 512) and for the LAMB-scale
one (``SCHEDULES``) when both of a schedule's runs of a size on a slice are planned together.
Compiling BERT-large for 256 chips takes minutes per candidate on a 2-core host.
"""

from __future__ import annotations

import json
import time

from benchmarks.common import flags
from bert_jax.model import BertConfig
from bert_jax.parallel.topology import CHIPS, parse_topology
from bert_jax.parallel.topology_base import CHIPS_PER_HOST
from bert_jax.plan.planner import format_plan, make_plan
from bert_jax.train import flops
from configs import pretrain

PREDICTIONS = {128: 20, 512: 80}  # BERT's masked positions per sequence at each length
SLICES = ("v5e-256", "v4-128", "v5p-128", "v5e-32", "v4-64", "v5p-64")
RUNS = tuple(
  f"{size}-{seq}-{batch}@{acc}"
  for acc in SLICES
  for size in ("large", "base")
  for seq, batches in ((512, (256, 32768)), (128, (256, 65536)))
  for batch in batches
)


def run_config(size: str, seq: int, batch: int):
  c = pretrain.get_config(size)
  c.unlock()
  c.dtype = "bfloat16"
  c.phase2.fraction = 0.0
  c.max_seq_length = seq
  c.max_predictions_per_seq = PREDICTIONS[seq]
  c.train_batch_size = batch
  c.eval_batch_size = 64
  if batch > 256:
    c.optimizer.name = "lamb"
  return c


def parse_run(run: str):
  spec, _, acc = run.partition("@")
  size, seq, batch = spec.split("-")
  return size, int(seq), int(batch), acc


# (global batch at 128, steps at 128, global batch at 512, steps at 512) of each schedule:
# the paper's (Devlin et al. 2019, A.2), and the LAMB-scale one as NVIDIA's DeepLearningExamples
# run it (PaddlePaddle/LanguageModeling/BERT/scripts/run_pretraining_p2.sh: phase 2 resumes from
# phase 1's step 7,038 and runs 1,563 steps of 32 x 8 GPUs x 128 accumulated = 32,768).
SCHEDULES = {
  "paper schedule (1M steps x 256)": (256, 900_000, 256, 100_000),
  "LAMB schedule (7,038 x 65,536 at 128 + 1,563 x 32,768 at 512)": (65_536, 7_038, 32_768, 1_563),
}


def time_to_train(
  plans: dict, size: str, acc: str, schedule: tuple = SCHEDULES["paper schedule (1M steps x 256)"]
) -> float | None:
  """Seconds for ``schedule`` from the plans of its two runs (at 128 and 512), or None."""
  batch_128, steps_128, batch_512, steps_512 = schedule
  a, b = plans.get(f"{size}-128-{batch_128}@{acc}"), plans.get(f"{size}-512-{batch_512}@{acc}")
  if not (a and b and a["best"] and b["best"]):
    return None
  return (
    steps_128 * a["best"]["estimate"]["step_seconds"]
    + steps_512 * b["best"]["estimate"]["step_seconds"]
  )


def input_demand_table() -> str:
  """Examples/s a host's input pipeline must deliver for its chips at 100% and 50% MFU (the
  model FLOPs of bert_jax.train.flops; hosts of CHIPS_PER_HOST chips): no compile needed."""
  lines = [
    "| model | seq | GFLOP per example | "
    + " | ".join(f"{g} host, 100% / 50% MFU" for g in CHIPS)
    + " |",
    "|---|---|---|" + "---|" * len(CHIPS),
  ]
  for size in ("base", "large"):
    for seq in (128, 512):
      bert = BertConfig.from_preset(size, vocab_size=30522)
      f = flops.train_flops_per_example(bert, seq, PREDICTIONS[seq])
      cells = [f"{CHIPS_PER_HOST * c.peak_flops / f:,.0f} / {CHIPS_PER_HOST * c.peak_flops / f / 2:,.0f}"
               for c in CHIPS.values()]  # fmt: skip
      lines.append(f"| {size} | {seq} | {f / 1e9:.0f} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _parser():
  p = flags.parser(__doc__)
  flags.add_list(p, "runs", [RUNS[0]], "runs to plan ('all' = every run, in priority order)")
  p.add_argument("--max_meshes", type=int, default=4, help="mesh layouts tried per run")
  p.add_argument(
    "--workers",
    type=int,
    default=0,
    help="meshes compiled concurrently (0: as cores and memory allow)",
  )
  p.add_argument("--cache", default="~/.cache/bert_jax/plans", help="the planner's compile cache")
  p.add_argument("--out", default="", help="write every plan here (JSON)")
  flags.add_bool(p, "list", False, "list the runs and exit")
  flags.add_bool(p, "quick", False, "screen at the lowest compiler effort, verify the best")
  flags.add_bool(
    p,
    "input_demand",
    False,
    "print the examples/s one host must read when its chips run at 100%% / 50%% MFU, and exit",
  )
  return p


def main(argv=None):
  args = _parser().parse_args(argv)
  if args.input_demand:
    print(input_demand_table())
    return
  if args.list:
    print("\n".join(RUNS))
    return
  runs = list(RUNS) if args.runs == ["all"] else args.runs
  plans = {}
  for run in runs:
    size, seq, batch, acc = parse_run(run)
    start = time.perf_counter()
    plan = make_plan(
      run_config(size, seq, batch),
      parse_topology(acc),
      max_meshes=args.max_meshes,
      cache_dir=args.cache,
      workers=args.workers,
      quick=args.quick,
    )
    plan["wall_seconds"] = time.perf_counter() - start
    plans[run] = plan
    print(f"== {run} ({plan['wall_seconds']:.0f} s)")
    print(format_plan(plan), flush=True)
    if args.out:
      with open(args.out, "w") as f:
        json.dump(plans, f, indent=1)
  for size in ("base", "large"):
    for acc in SLICES:
      for name, schedule in SCHEDULES.items():
        t = time_to_train(plans, size, acc, schedule)
        if t is not None:
          print(f"BERT-{size} on {acc}: {name} ~ {t / 3600:.2f} hours")


if __name__ == "__main__":
  main()
