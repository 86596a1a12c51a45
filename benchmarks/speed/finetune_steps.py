r"""Steady-state fine-tuning step and evaluation times, bert_jax vs Hugging Face PyTorch.

  python -m benchmarks.quality.finetune_glue --step_timing 10 --max_seq_length 128 \
      --train_batch_size 32 [--tasks rte]
  python -m benchmarks.quality.finetune_glue --eval_timing 3 --tasks rte,mrpc,stsb,cola

Evaluation (``--eval_timing N``): seconds per pass over each task's whole dev set at
``--eval_batch_size``, the mean of N passes after one warm-up pass (which compiles; reported
apart). bert_jax: the runner's ``Predictor`` with ``--length_buckets`` (rows visited shortest
first, each batch cut to its bucket) and with buckets off; PyTorch: ``model.eval()`` under
``torch.no_grad()`` on rows padded to ``max_seq_length`` (``run_glue.py``'s default) and, with
``--hf_dynamic_padding``, padded per batch to its longest row. Both use MiniLM's weights.

Training steps (``--step_timing N``):
MiniLM-L6 with a 2-way head, training mode (dropout 0.1), AdamW + clipping as the fine-tuning
recipe, on real rows of the first ``--tasks`` entry padded to ``max_seq_length`` (no bucketing,
so both sides do the same work). bert_jax: the runner's own pieces (``FinetuneInput`` ->
``make_global_batch`` -> the jitted, donated train step), N steps back to back after 2 warm-up
steps (the first compiles), blocking once at the end, as the training loop runs. PyTorch: N
plain ``forward/backward/clip/step`` iterations after 2 warm-up ones. Prints seconds per step.
"""

from __future__ import annotations

import json

import numpy as np

from benchmarks.common import glue_setup
from benchmarks.common.timing import Timer
from bert_jax import parallel
from bert_jax.runs.finetuning import runner
from bert_jax.runs.finetuning import runner_io as io
from bert_jax.runs.finetuning.inputs import FinetuneInput, Predictor, make_bucketer
from bert_jax.tasks import create_task
from bert_jax.tasks.glue.data import SPECS, read_tsv
from bert_jax.train import optimizers
from bert_jax.train import state as state_lib
from bert_jax.train import train_step as step_lib
from configs import glue


def _bert_jax_steps(args, n: int) -> dict:
  c = glue.get_config(args.tasks.split(",")[0])
  c.data_dir, c.init_checkpoint = args.glue_dir, args.init_checkpoint
  c.max_seq_length, c.train_batch_size = args.max_seq_length, args.train_batch_size
  c.compilation_cache.dir = ""
  setup = io.resolve_model(c, "/nonexistent-workdir")
  task = create_task(c, setup.tokenizer)
  model = task.build_model(setup.bert_config)
  train = task.load_split("train")
  mesh = parallel.create_mesh(c.mesh)
  rules = parallel.normalize_rules(c.logical_axis_rules)
  schedule = optimizers.warmup_linear_decay(c.learning_rate, 10, 1000)
  tx = optimizers.create_optimizer(c.optimizer, schedule)
  init_params = lambda rng: task.init_variables(model, rng, 1)["params"]
  _, shardings = state_lib.abstract_train_state(init_params, tx, mesh, rules, 0)
  state = state_lib.init_train_state(init_params, tx, mesh, rules, 0, shardings)
  step = step_lib.jit_train_step(
    step_lib.make_train_step(runner.make_loss_fn(task, model), tx, schedule, 1, mesh),
    shardings,
    mesh,
    rules,
  )
  inputs = FinetuneInput(train, train.num_rows // c.train_batch_size, c.train_batch_size, 0)

  def call(i):
    nonlocal state
    state, metrics = step(state, parallel.make_global_batch(next(inputs), mesh, rules))
    return metrics

  t = Timer(warmup=2, calls=n).time(call)
  return {"first_step_s": t.warmup[0], "second_step_s": t.warmup[1], "step_s": t.mean}


def _hf_steps(args, n: int) -> dict:
  import torch  # optional (not a bert_jax dependency), heavy
  from transformers import BertForSequenceClassification, BertTokenizerFast  # optional, heavy

  spec = SPECS[args.tasks.split(",")[0]]
  tok = BertTokenizerFast.from_pretrained(args.init_checkpoint)
  ex, _ = read_tsv(spec, f"{args.glue_dir}/{spec.dir_name}/train.tsv", True)
  ex = ex[: args.train_batch_size * (n + 2)]
  enc = tok(
    [e.text_a for e in ex],
    [e.text_b for e in ex] if spec.text_b else None,
    truncation="longest_first",
    max_length=args.max_seq_length,
    padding="max_length",
    return_tensors="pt",
  )
  y = torch.as_tensor(np.array([e.label for e in ex]))
  torch.manual_seed(0)
  model = BertForSequenceClassification.from_pretrained(args.init_checkpoint, num_labels=2)
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=2e-5, eps=1e-6, weight_decay=0.01)
  b = args.train_batch_size

  def call(i):
    sl = slice((i + 2) * b, (i + 3) * b)  # the warm-up steps (i = -2, -1) take the first two
    out = model(
      input_ids=enc["input_ids"][sl],
      attention_mask=enc["attention_mask"][sl],
      token_type_ids=enc["token_type_ids"][sl],
      labels=y[sl],
    )
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    return out.loss

  t = Timer(warmup=2, calls=n).time(call)
  return {
    "first_step_s": t.warmup[0],
    "second_step_s": t.warmup[1],
    "step_s": t.mean,
    "torch_threads": torch.get_num_threads(),
  }


def _bert_jax_eval(args, task_name: str, n: int) -> dict:
  c, task, model, params = glue_setup.bert_jax_setup(task_name, 0, args)
  dev = task.load_split("dev")
  mesh = parallel.create_mesh(c.mesh)
  rules = parallel.normalize_rules(c.logical_axis_rules)
  out = {"rows": dev.num_rows}
  for name, bucketer in (("bucketed", make_bucketer(task, c)), ("full_length", None)):
    predict = Predictor(
      task, model, mesh, rules, args.eval_batch_size, bucketer, int(c.max_seq_length)
    )
    t = Timer(calls=n).time(lambda i, predict=predict: predict(params, dev))
    out[f"{name}_first_pass_s"] = t.first
    out[f"{name}_pass_s"] = t.mean
  return out


def _hf_eval(args, task_name: str, n: int) -> dict:
  import torch  # optional (not a bert_jax dependency), heavy
  from transformers import BertForSequenceClassification, BertTokenizerFast  # optional, heavy

  spec = SPECS[task_name]
  tok = BertTokenizerFast.from_pretrained(args.init_checkpoint)
  model = BertForSequenceClassification.from_pretrained(
    args.init_checkpoint, num_labels=max(1, len(spec.labels))
  ).eval()
  path = f"{args.glue_dir}/{spec.dir_name}/{dict(spec.eval_files)['dev']}"
  pad = not args.hf_dynamic_padding
  dev, y = glue_setup.hf_encode(tok, spec, path, 0, args.max_seq_length, pad)
  pad_to = args.max_seq_length if pad else None

  def one_pass():
    with torch.no_grad():
      for s in range(0, len(y), args.eval_batch_size):
        model(
          **glue_setup.hf_batch(dev, range(s, min(s + args.eval_batch_size, len(y))), pad_to, torch)
        )

  t = Timer(calls=n).time(lambda i: one_pass())
  return {
    "rows": len(y),
    "padding": "max_length" if pad else "per_batch",
    "first_pass_s": t.first,
    "pass_s": t.mean,
  }


def time_eval(args) -> None:
  n = int(args.eval_timing)
  for task_name in args.tasks.split(","):
    for fw in args.frameworks.split(","):
      result = (
        _bert_jax_eval(args, task_name, n) if fw == "bert_jax" else _hf_eval(args, task_name, n)
      )
      print(
        json.dumps(
          {
            "framework": fw,
            "task": task_name,
            "batch": args.eval_batch_size,
            "seq": args.max_seq_length,
            "passes": n,
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()},
          }
        ),
        flush=True,
      )


def time_steps(args) -> None:
  n = int(args.step_timing)
  for fw in args.frameworks.split(","):
    result = _bert_jax_steps(args, n) if fw == "bert_jax" else _hf_steps(args, n)
    print(
      json.dumps(
        {
          "framework": fw,
          "task": args.tasks.split(",")[0],
          "batch": args.train_batch_size,
          "seq": args.max_seq_length,
          "steps": n,
          **{k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()},
        }
      ),
      flush=True,
    )
