r"""Convergence with packing: held-out MLM loss over steps, packed vs unpacked, several seeds.

  python -m benchmarks.packing_convergence                     # tiny, 2,000 steps, seeds 1 2
  python -m benchmarks.packing_convergence --steps=4000 --seeds=1,2,3

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
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_STEPS = flags.DEFINE_integer("steps", 2000, "training steps per run")
_SEEDS = flags.DEFINE_list("seeds", ["1", "2"], "seeds (config.seed) per mode")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 250, "steps between evaluations")
_EVAL_STEPS = flags.DEFINE_integer("eval_steps", 20, "held-out batches per evaluation")
_WORKDIR = flags.DEFINE_string("workdir", "", "where the runs go ('' = a temporary directory)")
_OUT = flags.DEFINE_string("out", "", "result JSON ('' = benchmarks/results/packing/...)")


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


def _run(workdir: str, data, packed: bool, seed: int) -> dict:
  cmd = [
    sys.executable,
    "-m",
    "bert_jax.pretrain",
    "--config=configs/pretrain.py:tiny",
    f"--workdir={workdir}",
    f"--config.input_files={data.train_files[128]}",
    f"--config.eval_input_files={data.eval_files[128]}",
    f"--config.vocab_file={data.vocab_file}",
    f"--config.num_train_steps={_STEPS.value}",
    f"--config.num_warmup_steps={_STEPS.value // 10}",
    "--config.phase2.fraction=0",
    f"--config.packing.enabled={packed}",
    f"--config.seed={seed}",
    f"--config.eval_every_steps={_EVAL_EVERY.value}",
    f"--config.max_eval_steps={_EVAL_STEPS.value}",
    f"--config.save_checkpoints_steps={_STEPS.value}",
  ]
  t0 = time.time()
  subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  wall = time.time() - t0
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


def main(argv):
  del argv
  root = _WORKDIR.value or tempfile.mkdtemp(prefix="packing_convergence_")
  data = _prepare_corpus(os.path.join(root, "default_corpus"))
  runs = []
  for seed in map(int, _SEEDS.value):
    for packed in (False, True):
      name = f"{'packed' if packed else 'unpacked'}_seed{seed}"
      runs.append(_run(os.path.join(root, name), data, packed, seed))
      print(name, runs[-1]["evals"][-1], f"{runs[-1]['wall_sec']} s", flush=True)
  key = next(k for k in runs[0]["evals"][-1] if "mlm" in k and "loss" in k)
  print(f"\nheld-out {key} by step")
  steps = [e["step"] for e in runs[0]["evals"]]
  print("run".ljust(18) + "".join(f"{s:>9}" for s in steps))
  for r in runs:
    name = f"{'packed' if r['packed'] else 'unpacked'} seed {r['seed']}"
    print(name.ljust(18) + "".join(f"{e.get(key, float('nan')):9.4f}" for e in r["evals"]))
  date = datetime.date.today().isoformat()
  out = _OUT.value or os.path.join("benchmarks", "results", "packing", f"convergence_{date}.json")
  os.makedirs(os.path.dirname(out), exist_ok=True)
  with open(out, "w") as f:
    json.dump(
      dict(
        date=date,
        command="python -m benchmarks.packing_convergence " + " ".join(sys.argv[1:]),
        metric=key,
        runs=runs,
      ),
      f,
      indent=1,
    )
  print("wrote", out)


if __name__ == "__main__":
  app.run(main)
