r"""Convergence with packing: held-out MLM loss over steps, packed vs unpacked, several seeds.

  python -m benchmarks.quality.packing_convergence        # tiny, 2,000 steps, seeds 1 2
  python -m benchmarks.quality.packing_convergence --steps=4000 --seeds=1,2,3

Each run is the main command's pre-training (``python -m bert_jax.pretrain``, preset ``tiny``,
seq 128 only: ``phase2.fraction=0``) on the same files, the built-in corpus prepared once with
the config's default seed (the seeds change the initialisation, dropout and order only), with
``packing.enabled`` off and on, and evaluates every ``--eval_every`` steps on the corpus's
held-out file (``max_eval_steps`` batches). The evaluation's MLM loss is the mean over the
masked tokens (per real token predicted), the same quantity packed or not. Rows hold more
sequences when packed, so each packed step trains on more real tokens: the JSON has, per run,
the loss at each evaluation with the step and the real tokens seen by then (steps x rows x
max_seq_length x the run's real-token share, from its summary.json).

Writes benchmarks/results/packing/convergence_<date>.json and prints a table.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile

from benchmarks.common import flags
from benchmarks.common.process import run


def _prepare_corpus(out_dir: str):
  from bert_jax.data.default_corpus import prepare_default_data
  from configs import pretrain

  config = pretrain.get_config("tiny")
  return prepare_default_data(
    out_dir,
    max_seq_lengths=(config.max_seq_length,),
    max_predictions_per_seq=(config.max_predictions_per_seq,),
    random_seed=config.seed,
  )


def _run(args, workdir: str, data, packed: bool, seed: int) -> dict:
  cmd = [
    sys.executable,
    "-m",
    "bert_jax.pretrain",
    "--config=configs/pretrain.py:tiny",
    f"--workdir={workdir}",
    f"--config.input_files={data.train_files[128]}",
    f"--config.eval_input_files={data.eval_files[128]}",
    f"--config.vocab_file={data.vocab_file}",
    f"--config.num_train_steps={args.steps}",
    f"--config.num_warmup_steps={args.steps // 10}",
    "--config.phase2.fraction=0",
    f"--config.packing.enabled={packed}",
    f"--config.seed={seed}",
    f"--config.eval_every_steps={args.eval_every}",
    f"--config.max_eval_steps={args.eval_steps}",
    f"--config.save_checkpoints_steps={args.steps}",
  ]
  wall = run(cmd).seconds
  with open(os.path.join(workdir, "eval_history.json")) as f:
    history = json.load(f)["history"]
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  share = summary.get("input_token_share", {})
  share = next(iter(share.values()), {}) if isinstance(share, dict) else {}
  return dict(
    packed=packed,
    seed=seed,
    wall_sec=round(wall, 1),
    input_token_share=share,
    evals=[
      {"step": e["step"], **{k: v for k, v in e.items() if "loss" in k or "accuracy" in k}}
      for e in history
    ],
    command=" ".join(cmd[1:]),
  )


def _parser():
  p = flags.parser(__doc__)
  p.add_argument("--steps", type=int, default=2000, help="training steps per run")
  flags.add_list(p, "seeds", ["1", "2"], "seeds (config.seed) per mode")
  p.add_argument("--eval_every", type=int, default=250, help="steps between evaluations")
  p.add_argument("--eval_steps", type=int, default=20, help="held-out batches per evaluation")
  p.add_argument("--workdir", default="", help="where the runs go ('' = a temporary directory)")
  p.add_argument("--out", default="", help="result JSON ('' = benchmarks/results/packing/...)")
  return p


def main(argv=None):
  args = _parser().parse_args(argv)
  root = args.workdir or tempfile.mkdtemp(prefix="packing_convergence_")
  data = _prepare_corpus(os.path.join(root, "default_corpus"))
  runs = []
  for seed in map(int, args.seeds):
    for packed in (False, True):
      name = f"{'packed' if packed else 'unpacked'}_seed{seed}"
      runs.append(_run(args, os.path.join(root, name), data, packed, seed))
      print(name, runs[-1]["evals"][-1], f"{runs[-1]['wall_sec']} s", flush=True)
  key = next(k for k in runs[0]["evals"][-1] if "mlm" in k and "loss" in k)
  print(f"\nheld-out {key} by step")
  steps = [e["step"] for e in runs[0]["evals"]]
  print("run".ljust(18) + "".join(f"{s:>9}" for s in steps))
  for r in runs:
    name = f"{'packed' if r['packed'] else 'unpacked'} seed {r['seed']}"
    print(name.ljust(18) + "".join(f"{e.get(key, float('nan')):9.4f}" for e in r["evals"]))
  date = datetime.date.today().isoformat()
  out = args.out or os.path.join("benchmarks", "results", "packing", f"convergence_{date}.json")
  os.makedirs(os.path.dirname(out), exist_ok=True)
  with open(out, "w") as f:
    json.dump(
      dict(
        date=date,
        command="python -m benchmarks.quality.packing_convergence " + " ".join(sys.argv[1:]),
        metric=key,
        runs=runs,
      ),
      f,
      indent=1,
    )
  print("wrote", out)


if __name__ == "__main__":
  main()
