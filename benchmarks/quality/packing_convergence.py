r"""Convergence with packing: held-out MLM loss, packed vs unpacked, at equal steps and at equal
real tokens, over several seeds.

  python -m benchmarks.quality.packing_convergence --seeds=1,2,3 --steps=400 --eval_every=50 \
      --workdir=/work/packconv          # the reported run (benchmarks/results/packing/)
  python -m benchmarks.quality.packing_convergence --modes=unpacked,packed_same_batch

Each run is the main command's pre-training (``python -m bert_jax.pretrain``, preset ``tiny``,
seq 128 only: ``phase2.fraction=0``, ``--steps`` steps, warmup a tenth) on the same files, the
built-in corpus prepared once with the config's default seed (the seeds change the
initialisation, dropout and the order of the instances only), evaluated every ``--eval_every``
steps and at the end on the corpus's held-out file (``--eval_steps`` batches of 32, one
instance per row in every mode). Modes:

* ``unpacked``: one instance per row, 32 rows a step (the preset's ``train_batch_size``);
* ``packed``: ``packing.enabled``, 32 rows a step: about 14% more instances (and real tokens)
  a step than unpacked on this corpus;
* ``packed_same_batch``: ``packing.enabled``, ``--same_batch_rows`` rows a step (28: 32 over
  the 1.14 sequences a packed row holds on this corpus), so a step holds about the unpacked
  step's 32 instances: the same instances, steps and learning rates as unpacked, only grouped
  into fewer rows.

A packed run reads the same instance stream as the unpacked run of its seed (the packer only
groups it into rows; tests/test_packing_convergence_stream.py), so at equal real tokens two
runs have trained on the same instances: the same epochs. Real tokens after k steps: k x rows
x max_seq_length x the run's real-token share; instances: k x rows x sequences per row (both
from the run's summary.json); epochs: instances over the training file's instances.

Report: the loss of each mode at the unpacked run's evaluation steps, and at the real tokens
the unpacked run had seen there (each run's curve interpolated linearly in tokens between its
evaluations, and up to 2% beyond its last one along its last segment, since packed_same_batch
delivers about 1.5% fewer tokens a step than unpacked; a point further out is left out); per
mode the mean over seeds and the spread (max - min), the paired difference to unpacked (same
seed), and each seed's difference averaged over the points. "Within the seed spread": |mean
difference| <= the larger of the two modes' spreads at that point.

Writes ``<out_dir>/convergence_<date>.json``, ``.md`` and ``.png`` (held-out MLM loss against
real tokens and against steps). A run whose workdir holds a completed run of the same command
is reused, so a second invocation only rewrites the report.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shutil
import sys

from benchmarks.common import flags
from benchmarks.common.process import run
from bert_jax.data.default_corpus import prepare_default_data
from configs import pretrain

MODES = ("unpacked", "packed_same_batch", "packed")
ROWS = 32  # the tiny preset's train_batch_size
METRIC = "mlm_loss"


def _prepare_corpus(out_dir: str):
  config = pretrain.get_config("tiny")
  return prepare_default_data(
    out_dir,
    max_seq_lengths=(config.max_seq_length,),
    max_predictions_per_seq=(config.max_predictions_per_seq,),
    random_seed=config.seed,
  )


def _command(args, workdir: str, data, mode: str, seed: int) -> list[str]:
  steps = args.steps
  rows = args.same_batch_rows if mode == "packed_same_batch" else ROWS
  return [
    sys.executable,
    "-m",
    "bert_jax.pretrain",
    "--config=configs/pretrain.py:tiny",
    f"--workdir={workdir}",
    f"--config.input_files={data.train_files[128]}",
    f"--config.eval_input_files={data.eval_files[128]}",
    f"--config.vocab_file={data.vocab_file}",
    f"--config.num_train_steps={steps}",
    f"--config.num_warmup_steps={steps // 10}",
    "--config.phase2.fraction=0",
    f"--config.train_batch_size={rows}",
    f"--config.packing.enabled={mode != 'unpacked'}",
    f"--config.seed={seed}",
    f"--config.eval_every_steps={args.eval_every}",
    f"--config.max_eval_steps={args.eval_steps}",
    f"--config.save_checkpoints_steps={steps}",
  ]


def _run(args, root: str, data, mode: str, seed: int, train_instances: int) -> dict:
  workdir = os.path.join(root, f"{mode}_seed{seed}")
  steps = args.steps
  cmd = _command(args, workdir, data, mode, seed)
  marker = os.path.join(workdir, "benchmark_run.json")
  done = None
  if os.path.exists(marker):
    with open(marker) as f:
      done = json.load(f)
  if done is None or done["command"] != cmd[1:]:
    shutil.rmtree(workdir, ignore_errors=True)
    wall = run(cmd, log=workdir + ".log").seconds
    done = dict(command=cmd[1:], wall_sec=round(wall, 1))
    with open(marker, "w") as f:
      json.dump(done, f)
  with open(os.path.join(workdir, "eval_history.json")) as f:
    history = json.load(f)["history"]
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  if summary.get("status") != "completed":
    raise RuntimeError(f"{workdir}: the run did not complete ({summary.get('status')})")
  share = summary["input_token_share"]["seq128"]
  rows = args.same_batch_rows if mode == "packed_same_batch" else ROWS
  tokens_per_step = rows * 128 * share["real_token_share"]
  instances_per_step = rows * share["sequences_per_row"]
  return dict(
    mode=mode,
    seed=seed,
    steps=steps,
    rows=rows,
    wall_sec=done["wall_sec"],
    input_token_share=share,
    evals=[
      dict(
        step=e["step"],
        real_tokens=round(e["step"] * tokens_per_step),
        instances=round(e["step"] * instances_per_step),
        epochs=round(e["step"] * instances_per_step / train_instances, 4),
        **{k: v for k, v in e.items() if "loss" in k or "accuracy" in k},
      )
      for e in history
    ],
    train_loss_history=summary.get("train_loss_history", []),
    command="python " + " ".join(cmd[1:]),
  )


# -- the comparison ------------------------------------------------------------------------------
def interpolate(evals: list[dict], tokens: float, beyond: float = 0.0) -> float | None:
  """The run's held-out loss at ``tokens`` real tokens, linear between its evaluations, and
  beyond the last by up to ``beyond`` (relative) along its last segment; else None."""
  pts = [(e["real_tokens"], e[METRIC]) for e in evals]
  if tokens < pts[0][0] or tokens > pts[-1][0] * (1 + beyond):
    return None
  for (t0, y0), (t1, y1) in zip(pts, pts[1:]):
    if tokens <= t1:
      return y0 + (y1 - y0) * (tokens - t0) / (t1 - t0)
  if len(pts) == 1:
    return pts[0][1]
  (t0, y0), (t1, y1) = pts[-2:]
  return y1 + (y1 - y0) * (tokens - t1) / (t1 - t0)


def _stats(values: list[float]) -> dict:
  n = len(values)
  mean = sum(values) / n
  sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
  return dict(mean=mean, sd=sd, min=min(values), max=max(values), spread=max(values) - min(values))


def compare(runs: list[dict]) -> dict:
  """Per unpacked evaluation step: every mode at that step and at the unpacked run's real tokens
  there (seed means, spreads, paired differences to unpacked)."""
  by = {(r["mode"], r["seed"]): r for r in runs}
  seeds = sorted({r["seed"] for r in runs if r["mode"] == "unpacked"})
  modes = [m for m in MODES if all((m, s) in by for s in seeds)]
  out = {"equal_steps": [], "equal_tokens": []}
  for i, base in enumerate(by[("unpacked", seeds[0])]["evals"]):
    step = base["step"]
    for kind in ("equal_steps", "equal_tokens"):
      row = dict(step=step, modes={})
      ref = {s: by[("unpacked", s)]["evals"][i] for s in seeds}
      row["real_tokens"] = sum(ref[s]["real_tokens"] for s in seeds) / len(seeds)
      for m in modes:
        vals, epochs = {}, []
        for s in seeds:
          evals = by[(m, s)]["evals"]
          if kind == "equal_steps":
            e = next((e for e in evals if e["step"] == step), None)
            if e is not None:
              vals[s] = e[METRIC]
              epochs.append(e["epochs"])
          else:
            v = interpolate(evals, ref[s]["real_tokens"], 0.02)
            if v is not None:
              vals[s] = v
              epochs.append(ref[s]["epochs"])  # equal tokens: the same instances
        if len(vals) < len(seeds):
          continue
        entry = dict(per_seed=vals, epochs=sum(epochs) / len(epochs), **_stats(list(vals.values())))
        if m != "unpacked":
          base_vals = {s: ref[s][METRIC] for s in seeds}
          diffs = [vals[s] - base_vals[s] for s in seeds]
          d = _stats(diffs)
          spread = max(entry["spread"], _stats(list(base_vals.values()))["spread"])
          entry["diff"] = dict(per_seed=dict(zip(seeds, diffs)), **d)
          entry["within_seed_spread"] = abs(d["mean"]) <= spread
        row["modes"][m] = entry
      out[kind].append(row)
  for kind in ("equal_steps", "equal_tokens"):  # each seed's difference averaged over the points
    out[f"{kind}_mean_diff"] = {}
    for m in modes[1:]:
      rows = [r["modes"][m]["diff"]["per_seed"] for r in out[kind] if m in r["modes"]]
      if rows:
        per_seed = {s: sum(r[s] for r in rows) / len(rows) for s in seeds}
        out[f"{kind}_mean_diff"][m] = dict(
          points=len(rows), per_seed=per_seed, **_stats(list(per_seed.values()))
        )
  return out


# -- the report ----------------------------------------------------------------------------------
def _cell(entry: dict | None) -> str:
  if entry is None:
    return "-"
  return f"{entry['mean']:.4f} ({entry['spread']:.4f})"


def _diff(entry: dict | None) -> str:
  if entry is None or "diff" not in entry:
    return "-"
  d = entry["diff"]
  mark = "" if entry["within_seed_spread"] else " *"
  return f"{d['mean']:+.4f} [{d['min']:+.4f}, {d['max']:+.4f}]{mark}"


def markdown(report: dict) -> str:
  runs, cmp_ = report["runs"], report["comparison"]
  modes = [m for m in MODES if any(r["mode"] == m for r in runs)]
  lines = [
    f"# Packing convergence, {report['date']}",
    "",
    f"Command: `{report['command']}`",
    "",
    f"Data: the built-in corpus at seq 128, {report['train_instances']:,} training instances "
    f"(held-out: {report['eval_instances']:,}); rows of 128 tokens. "
    f"Metric: held-out {METRIC} (mean over the masked tokens of {report['eval_steps']} batches).",
    "",
    "| run | steps | rows / step | real-token share | sequences / row | instances / step "
    "| epochs at the end | wall s |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for r in runs:
    s = r["input_token_share"]
    lines.append(
      f"| {r['mode']} seed {r['seed']} | {r['steps']} | {r['rows']} | "
      f"{s['real_token_share']:.4f} | {s['sequences_per_row']:.4f} | "
      f"{r['rows'] * s['sequences_per_row']:.2f} | {r['evals'][-1]['epochs']:.2f} | "
      f"{r['wall_sec']:.0f} |"
    )
  others = [m for m in modes if m != "unpacked"]
  for kind, title in (
    ("equal_steps", "At equal steps"),
    ("equal_tokens", "At equal real tokens (the unpacked run's at that step)"),
  ):
    lines += [
      "",
      f"## {title}",
      "",
      "Mean over seeds (spread max - min); difference to unpacked, paired by seed: mean "
      "[min, max]; * marks a mean difference beyond the seed spread.",
      "",
    ]
    head = ["step", "real tokens (M)", "epochs (unpacked)", "unpacked"]
    for m in others:
      head += [m] + ([f"epochs ({m})"] if kind == "equal_steps" else []) + [f"{m} - unpacked"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in cmp_[kind]:
      u = row["modes"].get("unpacked")
      cells = [str(row["step"]), f"{row['real_tokens'] / 1e6:.3f}", f"{u['epochs']:.2f}", _cell(u)]
      for m in others:
        e = row["modes"].get(m)
        cells.append(_cell(e))
        if kind == "equal_steps":
          cells.append(f"{e['epochs']:.2f}" if e else "-")
        cells.append(_diff(e))
      lines.append("| " + " | ".join(cells) + " |")
    for m, d in cmp_[f"{kind}_mean_diff"].items():
      lines.append(
        f"\n{m} - unpacked averaged over the {d['points']} points, per seed: "
        + ", ".join(f"{v:+.4f}" for v in d["per_seed"].values())
        + f" (mean {d['mean']:+.4f}, sd {d['sd']:.4f})"
      )
  return "\n".join(lines) + "\n"


def plot(report: dict, path: str) -> bool:
  """Three panels: held-out loss against real tokens and against steps (a line per run), and
  each mode's difference to unpacked at equal real tokens (a line per seed)."""
  try:
    import matplotlib  # optional (the bench extra), heavy
  except ImportError:
    print("plot: skipped, matplotlib is not installed (pip install matplotlib)")
    return False
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # after matplotlib.use("Agg")

  colors = dict(unpacked="tab:blue", packed="tab:red", packed_same_batch="tab:green")
  fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
  for ax, key, label in (
    (axes[0], "real_tokens", "real tokens seen (millions)"),
    (axes[1], "step", "steps"),
  ):
    shown = set()
    for r in report["runs"]:
      xs = [e[key] / (1e6 if key == "real_tokens" else 1) for e in r["evals"]]
      ys = [e[METRIC] for e in r["evals"]]
      name = r["mode"] if r["mode"] not in shown else None
      shown.add(r["mode"])
      ax.plot(xs, ys, color=colors[r["mode"]], alpha=0.7, lw=1, marker=".", label=name)
    ax.set_xlabel(label)
    ax.set_ylabel(f"held-out {METRIC}")
    ax.grid(alpha=0.3)
  axes[0].legend()
  ax = axes[2]
  points = report["comparison"]["equal_tokens"]
  for m in [m for m in MODES[1:] if any(m in p["modes"] for p in points)]:
    pts = [p for p in points if m in p["modes"]]
    xs = [p["real_tokens"] / 1e6 for p in pts]
    for i, s in enumerate(pts[0]["modes"][m]["diff"]["per_seed"]):
      ys = [p["modes"][m]["diff"]["per_seed"][s] for p in pts]
      ax.plot(xs, ys, color=colors[m], alpha=0.7, lw=1, marker=".", label=m if i == 0 else None)
  ax.axhline(0.0, color="k", lw=0.8)
  ax.set_xlabel("real tokens seen (millions)")
  ax.set_ylabel("minus unpacked (same seed, equal tokens)")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.suptitle("tiny, seq 128: held-out MLM loss, one line per run (seed)")
  fig.subplots_adjust(wspace=0.3)
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return True


def _parser():
  p = flags.parser(__doc__)
  p.add_argument("--steps", type=int, default=400, help="training steps of every run")
  p.add_argument("--same_batch_rows", type=int, default=28, help="rows a step of packed_same_batch")
  flags.add_list(p, "seeds", ["1", "2", "3"], "seeds (config.seed) per mode")
  flags.add_list(p, "modes", list(MODES), f"modes to run, of {', '.join(MODES)}")
  p.add_argument("--eval_every", type=int, default=100, help="steps between evaluations")
  p.add_argument("--eval_steps", type=int, default=20, help="held-out batches per evaluation")
  p.add_argument("--workdir", default="", help="where the runs go (required)")
  p.add_argument("--out_dir", default=os.path.join("benchmarks", "results", "packing"))
  return p


def main(argv=None):
  args = _parser().parse_args(argv)
  bad = [m for m in args.modes if m not in MODES]
  if bad or "unpacked" not in args.modes:
    sys.exit(f"packing_convergence: error: --modes must include unpacked and be of {MODES}")
  if not args.workdir or min(args.steps, args.eval_every, args.same_batch_rows) < 1:
    sys.exit(
      "packing_convergence: error: needs --workdir, and --steps, --eval_every, "
      "--same_batch_rows >= 1"
    )
  if not args.seeds:
    sys.exit("packing_convergence: error: --seeds is empty")
  root = os.path.abspath(args.workdir)
  data = _prepare_corpus(os.path.join(root, "default_corpus"))
  counts = data.stats["per_length"]["128"]
  runs = []
  for mode in [m for m in MODES if m in args.modes]:  # all seeds of a mode, then the next mode
    for seed in map(int, args.seeds):
      runs.append(_run(args, root, data, mode, seed, counts["train_examples"]))
      last = runs[-1]["evals"][-1]
      print(f"{mode} seed {seed}: step {last['step']} {METRIC} {last[METRIC]:.4f}", flush=True)
  date = datetime.date.today().isoformat()
  report = dict(
    date=date,
    command="python -m benchmarks.quality.packing_convergence " + " ".join(sys.argv[1:]),
    metric=METRIC,
    eval_steps=args.eval_steps,
    train_instances=counts["train_examples"],
    eval_instances=counts["eval_examples"],
    runs=runs,
    comparison=compare(runs),
  )
  os.makedirs(args.out_dir, exist_ok=True)
  prefix = os.path.join(args.out_dir, f"convergence_{date}")
  with open(prefix + ".json", "w") as f:
    json.dump(report, f, indent=1)
  text = markdown(report)
  with open(prefix + ".md", "w") as f:
    f.write(text)
  plot(report, prefix + ".png")
  print(text)
  print("wrote", prefix + ".json", prefix + ".md", prefix + ".png")


if __name__ == "__main__":
  main()
