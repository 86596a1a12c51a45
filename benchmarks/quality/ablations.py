r"""The paper's pre-training ablations (Tables 5 and 8) at a small scale: pre-train each variant
on the same corpus for the same steps, fine-tune each on MRPC and SST-2 with several seeds, and
report dev metrics next to the paper's rows.

  # everything at the defaults (3,000 steps, all of SST-2: most of a day on 2 CPU cores)
  python -m benchmarks.quality.ablations --out_dir /tmp/ablations
  # the grid reported in benchmarks/RESULTS_ablations.md (8 variants x (MRPC, SST-2) x 3 seeds)
  python -m benchmarks.quality.ablations --out_dir /tmp/ablations --pretrain_steps 400 \
      --tasks mrpc,sst2 --sst2_train_examples 8000 --seeds 1,2,3
  python -m benchmarks.quality.ablations --out_dir /tmp/ablations --report

Corpus: the built-in corpus (CPython's documentation, ``bert_jax.data.default_corpus``) plus
``../shared/data/pretrain`` (the Shakespeare plays, the Wikipedia extract, BERT's sample text),
all converted to the original format (a sentence per line, a blank line between documents); one
uncased WordPiece vocabulary built from it; TFRecords at seq 128 made twice with the same seed,
as NSP sentence pairs (for the NSP variants) and as documents packed into full-length single
segments (for No NSP and LTR), 5% of the documents held out. Every masked variant uses dynamic
masking (a fresh mask at each read, the variant's [MASK] / same / random rates), so one data
set serves all the masking rates; LTR reads the unmasked text.

Variants (``--variants``): bert (MLM + NSP, 80/10/10), no_nsp (MLM only), ltr (left-to-right
LM, no NSP), and Table 8's masking rates with MLM + NSP: mask100 (100/0/0), mask80_rnd20
(80/0/20), mask80_same20 (80/20/0), same20_rnd80 (0/20/80), rnd100 (0/0/100).

Fine-tuning: ``python -m bert_jax.finetune`` (configs/glue.py) from each pre-trained workdir,
batch 32, 3 epochs, lr ``--finetune_lr`` (small models need more than BERT-base's 2e-5), seeds
``--seeds``; SST-2 on its first ``--sst2_train_examples`` training examples; dev accuracy (and
MRPC's F1) of the best epoch (the runner keeps the best checkpoint by the task's metric). The
left-to-right model is fine-tuned with bidirectional attention over its weights
(``config.causal_checkpoint=bidirectional``): the [CLS] pooled output of a causal encoder sees
only [CLS], so a classifier on it learns nothing.

Each pre-training and fine-tuning run is a subprocess writing into ``--out_dir``; a finished
run (its summary.json / metrics.json present) is not redone, so the script can be stopped and
rerun. ``--report`` prints the Markdown table from what is there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks.common import REPO, SHARED_DATA
from benchmarks.common.process import ChildFailed, run
from bert_jax.data import corpus, default_corpus
from bert_jax.data import generate as generate_lib
from bert_jax.tokenize.vocab import build_wordpiece_vocab

SHARED = str(SHARED_DATA)

# name: (objective, mask / same / random rates, the paper's row)
VARIANTS = {
  "bert": ("mlm_nsp", (0.8, 0.1, 0.1), "BERT-base / 80-10-10"),
  "no_nsp": ("mlm", (0.8, 0.1, 0.1), "No NSP"),
  "ltr": ("ltr", (0.8, 0.1, 0.1), "LTR & No NSP"),
  "mask100": ("mlm_nsp", (1.0, 0.0, 0.0), "100-0-0"),
  "mask80_rnd20": ("mlm_nsp", (0.8, 0.0, 0.2), "80-0-20"),
  "mask80_same20": ("mlm_nsp", (0.8, 0.2, 0.0), "80-20-0"),
  "same20_rnd80": ("mlm_nsp", (0.0, 0.2, 0.8), "0-20-80"),
  "rnd100": ("mlm_nsp", (0.0, 0.0, 1.0), "0-0-100"),
}
# Devlin et al. 2019: Table 5 (BERT-base; MNLI-m, QNLI, MRPC, SST-2, SQuAD F1) and Table 8
# (BERT-base, MNLI dev accuracy; NER dev F1 fine-tuned and feature-based).
PAPER_TABLE_5 = {
  "bert": "MRPC 86.7, SST-2 92.7",
  "no_nsp": "MRPC 87.5, SST-2 92.6",
  "ltr": "MRPC 77.5, SST-2 92.1",
}
PAPER_TABLE_8 = {
  "bert": "MNLI 84.2, NER 95.4 / 94.9",
  "mask100": "MNLI 84.3, NER 94.9 / 94.0",
  "mask80_rnd20": "MNLI 84.1, NER 95.2 / 94.6",
  "mask80_same20": "MNLI 84.4, NER 95.2 / 94.7",
  "same20_rnd80": "MNLI 83.7, NER 94.8 / 94.6",
  "rnd100": "MNLI 83.6, NER 94.9 / 94.6",
}
TASKS = {"mrpc": ("MRPC", ("accuracy", "f1")), "sst2": ("SST-2", ("accuracy",))}


def _run(cmd: list[str], log_path: str) -> None:
  done = run(cmd, log=log_path, env={"JAX_PLATFORMS": "cpu"}, cwd=REPO, check=False)
  if done.returncode != 0:
    tail = open(log_path).read()[-3000:]
    raise ChildFailed(f"{' '.join(cmd)} failed ({done.returncode}); {log_path}:\n{tail}")
  print(f"  done in {done.seconds:.0f}s: {log_path}", flush=True)


def _write_original_format(documents, path: str) -> int:
  n = 0
  with open(path, "w", encoding="utf-8") as f:
    for sentences in documents:
      if sentences:
        f.write("\n".join(s.replace("\n", " ") for s in sentences) + "\n\n")
        n += 1
  return n


def prepare_corpus(out_dir: str, vocab_size: int, seed: int) -> dict[str, str]:
  """Corpus files, vocabulary and the two TFRecord layouts (idempotent)."""
  data = os.path.join(out_dir, "data")
  text_dir = os.path.join(data, "text")
  os.makedirs(text_dir, exist_ok=True)
  files = default_corpus.write_default_corpus(os.path.join(text_dir, "cpython"))
  pretrain = os.path.join(SHARED, "pretrain")
  sources = [
    (
      "shakespeare",
      "original",
      sorted(
        os.path.join(pretrain, "shakespeare", f)
        for f in os.listdir(os.path.join(pretrain, "shakespeare"))
        if f.endswith("_gut.txt")
      ),
    ),
    (
      "wiki",
      "wiki",
      sorted(os.path.join(pretrain, "wiki", f) for f in os.listdir(os.path.join(pretrain, "wiki"))),
    ),
    ("bert_sample", "original", [os.path.join(pretrain, "bert_sample_text.txt")]),
  ]
  for name, fmt, paths in sources:
    path = os.path.join(text_dir, f"{name}.txt")
    if not os.path.exists(path):
      docs = []
      for shard in corpus.make_input_shards(paths, fmt):
        docs.extend(corpus.read_shard_documents(shard, fmt, {}))
      print(f"  {name}: {_write_original_format(docs, path + '.tmp')} documents", flush=True)
      os.replace(path + ".tmp", path)
    files.append(path)
  vocab = os.path.join(data, "vocab.txt")
  if not os.path.exists(vocab):
    build_wordpiece_vocab(files, vocab, vocab_size, do_lower_case=True)
  out = {"vocab": vocab}
  for layout, pairs in (("pairs", True), ("packed", False)):
    config = generate_lib.GenerationConfig(
      tokenizer_path=vocab,
      do_lower_case=True,
      max_seq_lengths=(128,),
      max_predictions_per_seq=(20,),
      dupe_factor=1,  # dynamic masking re-draws masks at every read
      random_seed=seed,
      eval_fraction=0.05,
      sentence_pairs=pairs,
    )
    result = generate_lib.generate(
      files, os.path.join(data, layout), config, num_shards=16, progress=False
    )
    out[layout] = result["files"][128]["train"]
    out[f"{layout}_eval"] = result["files"][128]["eval"]
    stats = result["stats"]["per_length"].get("128")  # None when every shard existed
    if stats:
      print(f"  {layout}: {stats['train_examples']} train / {stats['eval_examples']} eval")
  return out


def pretrain(name: str, args, data: dict[str, str]) -> str:
  objective, rates, _ = VARIANTS[name]
  workdir = os.path.join(args.out_dir, "pretrain", name)
  if os.path.exists(os.path.join(workdir, "summary.json")):
    return workdir
  os.makedirs(workdir, exist_ok=True)
  layout = "pairs" if objective == "mlm_nsp" else "packed"
  print(f"pre-training {name} ({objective}, rates {rates}) for {args.pretrain_steps} steps")
  cmd = [
    sys.executable,
    "-m",
    "bert_jax.pretrain",
    f"--config={REPO}/configs/pretrain.py:{args.preset}",
    f"--workdir={workdir}",
    f"--config.objective={objective}",
    f"--config.mask_rates.mask={rates[0]}",
    f"--config.mask_rates.same={rates[1]}",
    f"--config.mask_rates.random={rates[2]}",
    f"--config.dynamic_masking={objective != 'ltr'}",
    f"--config.input_files={data[layout]}",
    f"--config.eval_input_files={data[layout + '_eval']}",
    f"--config.vocab_file={data['vocab']}",
    "--config.phase2.fraction=0",
    f"--config.num_train_steps={args.pretrain_steps}",
    f"--config.num_warmup_steps={args.pretrain_steps // 10}",
    f"--config.train_batch_size={args.pretrain_batch_size}",
    f"--config.learning_rate={args.pretrain_lr}",
    f"--config.save_checkpoints_steps={args.pretrain_steps}",
    f"--config.eval_every_steps={args.pretrain_steps}",
    "--config.max_eval_steps=20",
    "--config.logging.log_every_steps=100",
    f"--config.seed={args.seed}",
  ]
  _run(cmd, os.path.join(args.out_dir, "pretrain", f"{name}.log"))
  return workdir


def finetune(name: str, task: str, seed: int, args, pretrained: str) -> dict:
  workdir = os.path.join(args.out_dir, "finetune", f"{name}-{task}-{seed}")
  path = os.path.join(workdir, "metrics.json")
  if not os.path.exists(path):
    os.makedirs(workdir, exist_ok=True)
    print(f"fine-tuning {name} on {task}, seed {seed}")
    cmd = [
      sys.executable,
      "-m",
      "bert_jax.finetune",
      f"--config={REPO}/configs/glue.py:{task}",
      f"--workdir={workdir}",
      f"--config.data_dir={os.path.join(SHARED, 'glue')}",
      f"--config.init_checkpoint={pretrained}",
      f"--config.seed={seed}",
      f"--config.learning_rate={args.finetune_lr}",
      "--config.predict_test=False",
      "--config.causal_checkpoint=bidirectional",
    ]
    if task == "sst2" and args.sst2_train_examples:
      cmd.append(f"--config.max_train_examples={args.sst2_train_examples}")
    _run(cmd, workdir + ".log")
  return json.load(open(path))


def _dev_metrics(result: dict) -> dict[str, float]:
  dev = result["dev"]
  dev = next(iter(dev.values())) if all(isinstance(v, dict) for v in dev.values()) else dev
  return {k: float(v) for k, v in dev.items() if isinstance(v, (int, float))}


def _cell(values: list[float]) -> str:
  if not values:
    return "-"
  mean = 100 * statistics.mean(values)
  if len(values) == 1:
    return f"{mean:.1f} (n=1)"
  sd = 100 * statistics.stdev(values)
  return f"{mean:.1f} ± {sd:.1f} (n={len(values)})"


def report(args) -> str:
  rows = []
  header = (
    "| variant | held-out LM loss (ppl) | MRPC acc | MRPC F1 | SST-2 acc | paper |\n"
    "|---|---|---|---|---|---|"
  )
  for name, (objective, _, row) in VARIANTS.items():
    summary_path = os.path.join(args.out_dir, "pretrain", name, "summary.json")
    if not os.path.exists(summary_path):
      continue
    ev = json.load(open(summary_path)).get("eval", {})
    lm = "lm" if objective == "ltr" else "mlm"
    lm_cell = (
      f"{ev[f'{lm}_loss']:.3f} ({ev[f'{lm}_perplexity']:.1f})" if f"{lm}_loss" in ev else "-"
    )
    cells = {}
    for task, (_, keys) in TASKS.items():
      for key in keys:
        values = []
        for seed in args.seeds:
          path = os.path.join(args.out_dir, "finetune", f"{name}-{task}-{seed}", "metrics.json")
          if os.path.exists(path):
            values.append(_dev_metrics(json.load(open(path)))[key])
        cells[(task, key)] = _cell(values)
    paper = "; ".join(t[name] for t in (PAPER_TABLE_5, PAPER_TABLE_8) if name in t)
    label = f"{name} ({row})"
    rows.append(
      f"| {label} | {lm_cell} | {cells[('mrpc', 'accuracy')]} | {cells[('mrpc', 'f1')]} | "
      f"{cells[('sst2', 'accuracy')]} | {paper} |"
    )
  return "\n".join([header, *rows])


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--out_dir", required=True)
  p.add_argument("--variants", default=",".join(VARIANTS))
  p.add_argument("--preset", default="tiny")
  p.add_argument("--pretrain_steps", type=int, default=3000)
  p.add_argument("--pretrain_batch_size", type=int, default=32)
  p.add_argument("--pretrain_lr", type=float, default=1e-3)
  p.add_argument("--vocab_size", type=int, default=8000)
  p.add_argument("--tasks", default="mrpc,sst2")
  p.add_argument("--seeds", default="1,2,3")
  p.add_argument("--finetune_lr", type=float, default=1e-4)
  p.add_argument("--sst2_train_examples", type=int, default=0, help="0: all 67,349")
  p.add_argument("--seed", type=int, default=12345, help="data and pre-training seed")
  p.add_argument("--report", action="store_true", help="only print the table")
  args = p.parse_args()
  args.seeds = [int(s) for s in args.seeds.split(",")]
  variants = [v for v in args.variants.split(",") if v]
  unknown = sorted(set(variants) - set(VARIANTS))
  if unknown:
    p.error(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
  if not args.report:
    t0 = time.time()
    data = prepare_corpus(args.out_dir, args.vocab_size, args.seed)
    print(f"data ready in {time.time() - t0:.0f}s", flush=True)
    pretrained = {name: pretrain(name, args, data) for name in variants}
    for seed in args.seeds:  # seed-major: every variant gets its first seed early
      for name in variants:
        for task in args.tasks.split(","):
          finetune(name, task, seed, args, pretrained[name])
  table = report(args)
  print(table)
  with open(os.path.join(args.out_dir, "table.md"), "w") as f:
    f.write(table + "\n")


if __name__ == "__main__":
  main()
