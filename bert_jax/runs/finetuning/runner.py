"""Fine-tuning and evaluation of any registered task on the one trainer.

  result = finetune(config, workdir)     # train; evaluate on dev; keep the best; predict test
  result = evaluate(workdir, "dev")      # a fine-tuned workdir -> metrics JSON + predictions
  job = build_finetune_job(config, workdir, mesh)   # the Job the trainer runs
  job = build_finetune_job(config)                  # abstract: shapes only (bert_jax.compile)

The task (``bert_jax.tasks.base.Task``) supplies data, head, loss and metrics; this module turns
it into a ``bert_jax.train.job.Job`` and the trainer (``bert_jax.train.trainer``) runs it like
any other job: mesh, sharded state, BERT's AdamW and schedule, the donated train step, Orbax
checkpoints and the resume / pretrained encoder / scratch order, evaluation history and the
best checkpoint. Parameters a task does not train (``Task.trainable``) form a frozen group.

The run: ``num_train_steps`` = ``num_train_epochs`` x (train rows // ``train_batch_size``)
unless set; rows are shuffled each epoch by a generator seeded with (seed, epoch), so the
batches of a step depend only on the step and a resumed run sees exactly the batches the
uninterrupted one would (``bert_jax.runs.finetuning.inputs``). With ``length_buckets`` each
train and eval batch is cut to the shortest bucket holding its longest row
(``bert_jax.data.length_buckets``). With ``config.packing.enabled`` (GLUE, NER) each step's rows are
packed several to a row instead, and dev/test splits are packed and their predictions unpacked
(``bert_jax.runs.finetuning.inputs.Packer``); the loss and metrics are the unpacked ones.
The encoder's config is the run's (``config.attention_kernel`` resolved for the mesh's platform)
by ``runner_io.run_model_config``, i.e. ``bert_jax.model.run_settings.run_bert_config``.

Every ``eval_every_steps`` (0: each epoch) and at the end, the dev split(s) are evaluated; the
state whose primary metric on the first dev split is best is kept in ``best/`` (itself a
bert_jax workdir, which ``load_pretrained``/``load_params`` read). At the end the dev
predictions of the best evaluation are written (kept from the loop, not predicted again), the
best parameters predict the test splits into ``predictions/``, and ``metrics.json`` is written:
one file a sweep collects, ``{"task", "primary_metric", "dev": {...}, "best_step", "hparams",
...}``.

Each evaluation and prediction pass logs its progress (batches, rate, ETA) at least every 30 s,
and a split is run in batches of at most its rows (rounded up to the data-parallel size): an
``eval_batch_size`` beyond the largest dev split is cut to it before training, with one line
(``bert_jax.runs.finetuning.inputs.split_batch_size``).
"""

from __future__ import annotations

import math
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from bert_jax import parallel
from bert_jax.checkpoint import write_json
from bert_jax.checkpoint.lock import WorkdirLock
from bert_jax.model import BertConfig
from bert_jax.model.run_settings import NUMERICS_KEYS
from bert_jax.parallel.compilation_cache import enable_compilation_cache
from bert_jax.runs.finetuning import runner_io as io
from bert_jax.runs.finetuning.inputs import (
  FinetuneInput,
  Packer,
  Predictor,
  make_bucketer,
  split_batch_size,
)
from bert_jax.runs.rules import FINETUNING_RUN
from bert_jax.tasks.base import SplitData, Task
from bert_jax.tasks.registry import create_task
from bert_jax.tokenize import load_tokenizer
from bert_jax.train import flops as flops_lib
from bert_jax.train import optimizers, trainer
from bert_jax.train.best_checkpoint import checkpoint_dir, has_checkpoint
from bert_jax.train.job import EvalResult, Job, Phase, Pretrained, Program, RunHooks, RunSettings
from bert_jax.train.metrics import json_safe, scalar_metrics
from bert_jax.train.trainer import BEST_DIR


# --- pieces ---------------------------------------------------------------------------------
def make_loss_fn(task: Task, model):
  def loss_fn(params, batch, rng, deterministic):
    return task.loss(task.apply(model, params, batch, deterministic, rng), batch)

  return loss_fn


def make_predict_fn(task: Task, model):
  """``(params, batch) -> task.predict(outputs)``: the evaluation computation."""
  return lambda params, batch: task.predict(task.apply(model, params, batch, True))


def lr_scale(task: Task):
  """The job's parameter groups: 0 (frozen) where ``task.trainable`` says so; None when the
  task trains everything."""
  if type(task).trainable is Task.trainable:
    return None
  return lambda path: 1.0 if task.trainable(path) else 0.0


def evaluate_split(task: Task, predictor: Predictor, params, data: SplitData, what: str = ""):
  """(metrics, task predictions) of one split; ``what`` names the pass in its progress lines."""
  return task.evaluate(data, predictor(params, data, what))


def _plan(config, num_rows: int) -> tuple[int, int, int]:
  """(steps per epoch, total steps, warmup steps)."""
  b = int(config.train_batch_size)
  if num_rows < b:
    raise ValueError(
      f"the training split has {num_rows} rows, fewer than config.train_batch_size={b}"
    )
  per_epoch = num_rows // b
  total = int(config.num_train_steps) or max(1, int(round(config.num_train_epochs * per_epoch)))
  warmup = (
    int(config.num_warmup_steps)
    if config.num_warmup_steps >= 0
    else int(config.warmup_proportion * total)
  )
  return per_epoch, total, warmup


def _eval_batch_size(config, evals: list[SplitData], mesh) -> int:
  """``config.eval_batch_size``, or the largest dev split's rows rounded up to the data-parallel
  size where that is smaller (logged): a split is never padded to a batch beyond its rows."""
  batch = int(config.eval_batch_size)
  if not evals:
    return batch
  largest = max(evals, key=lambda d: d.num_rows)
  capped = split_batch_size(batch, largest.num_rows, mesh)
  if capped < batch:
    logging.info(
      "config.eval_batch_size=%d is more than the %d rows of %s: evaluating in batches of %d",
      batch,
      largest.num_rows,
      largest.split,
      capped,
    )
  return capped


def _flops_per_row(task: Task, bert_config: BertConfig) -> float:
  """Model training FLOPs of one row at ``max_seq_length`` (a SWAG row holds several sequences)."""
  shape = task.init_batch(1)["input_ids"].shape
  sequences = int(np.prod(shape[1:-1]))
  return sequences * flops_lib.encoder_train_flops_per_sequence(bert_config, int(shape[-1]))


def _abstract_bert_config(config, mesh=None) -> BertConfig:
  """The encoder an abstract job compiles: ``config.model_preset`` at BERT's 30,522 pieces,
  made the run's (numerics, dropout rates, the kernel resolved on ``mesh``)."""
  return io.run_model_config(BertConfig.from_preset(config.model_preset), config, mesh)


def make_packer(task: Task, config) -> Packer | None:
  """The run's ``Packer`` when ``config.packing.enabled`` is on (a one-line ValueError naming the key
  where the task cannot be packed), else None."""
  return Packer.for_task(task, config) if config.packing.enabled else None


def _row_granule(mesh) -> int:
  """What a packed batch's row count is a multiple of: the data-parallel size and processes."""
  dp = parallel.data_parallel_size(mesh) if mesh is not None else 1
  return math.lcm(dp, jax.process_count())


def _batch_spec(task: Task, packer: Packer | None, batch_size: int):
  """A global batch's shapes: the task's, or packed rows of them."""
  spec = task.train_batch_spec(batch_size)
  return spec if packer is None else packer.batch_spec(spec)


# --- the job --------------------------------------------------------------------------------
class _Finetuning:
  """A fine-tuning run's task-side state: its data, the evaluation and the end of the run."""

  def __init__(self, config, workdir: str, mesh):
    self.config, self.workdir, self.mesh = config, workdir, mesh
    self.setup = io.resolve_model(config, workdir, mesh)
    self.task = create_task(config, self.setup.tokenizer)
    self.packer = make_packer(self.task, config)  # before any data is read
    self.model = self.task.build_model(self.setup.bert_config)
    self.train = self.task.load_split(self.task.train_split)
    self.evals = [self.task.load_split(s) for s in self.task.eval_splits]
    self.data_stats = {d.split: d.stats for d in [self.train] + self.evals}
    logging.info("Data: %s", self.data_stats)
    self.eval_batch_size = _eval_batch_size(config, self.evals, mesh)
    self.per_epoch, self.total, self.warmup = _plan(config, self.train.num_rows)
    self.bucketer = make_bucketer(self.task, config)
    self.rules = parallel.normalize_rules(config.logical_axis_rules)
    self._predictor = None
    self.result: dict[str, Any] = {}

  def predictor(self, eval_step) -> Predictor:
    if self._predictor is None:
      self._predictor = Predictor(
        self.task,
        self.model,
        self.mesh,
        self.rules,
        self.eval_batch_size,
        self.bucketer,
        int(self.config.max_seq_length),
        step=eval_step,
        packer=self.packer,
      )
    return self._predictor

  def evaluate(self, params, step: int, eval_step) -> EvalResult:
    predictor = self.predictor(eval_step)
    outputs = {
      d.split: evaluate_split(
        self.task, predictor, params, d, f"evaluating {d.split} at step {step}"
      )
      for d in self.evals
    }
    record = {split: metrics for split, (metrics, _) in outputs.items()}
    primary_split = self.evals[0].split
    primary = record[primary_split].get(self.task.primary_metric) if record[primary_split] else None
    scalars = {
      k: v
      for d in self.evals
      for k, v in scalar_metrics(record[d.split], f"{d.split}/").items()
      if "per_type" not in k
    }
    return EvalResult(scalars, record, None if primary is None else float(primary), outputs)

  def write_run_files(self, workdir: str) -> None:
    io.write_run_files(workdir, self.config, self.setup, self.task.head_info())
    io.copy_model_files(workdir, os.path.join(workdir, BEST_DIR))

  def finish(self, ctx: trainer.FinishContext) -> dict[str, Any]:
    """Dev predictions of the best step, test predictions, metrics.json."""
    config, task, history = self.config, self.task, ctx.history
    best_step = (
      history.best_step if config.keep_best and history.best_step is not None else self.total
    )
    out_dir = os.path.join(self.workdir, io.PREDICTIONS_DIR)
    cached = history.outputs.get(best_step)
    params = None
    reports = type(task).param_report is not Task.param_report
    if cached is None or (config.predict_test and task.test_splits) or reports:
      params = ctx.restore_params(best_step)
    predictor = self.predictor(ctx.asm.eval_step)
    if cached is None:  # e.g. resumed after the last evaluation
      final = _predict_and_write(task, predictor, params, self.evals, out_dir, "evaluating")
    else:
      final = {d.split: _write(task, d, *cached[d.split], out_dir) for d in self.evals}
    if config.predict_test:
      for split in task.test_splits:
        try:
          data = task.load_split(split)
        except (FileNotFoundError, ValueError) as e:
          logging.info("No %s predictions: %s", split, e)
          continue
        self.data_stats[split] = data.stats
        final.update(_predict_and_write(task, predictor, params, [data], out_dir, "predicting"))
    primary_split = self.evals[0].split if self.evals else None
    self.result = {
      "task": task.name,
      "status": "completed",
      "primary_metric": task.primary_metric,
      "primary_split": primary_split,
      "higher_is_better": task.higher_is_better,
      "dev": final.get(primary_split, {}) if primary_split else {},
      "eval": {k: v for k, v in final.items() if v},
      "best_step": best_step,
      "num_train_steps": self.total,
      "hparams": {
        k: config[k]
        for k in ("learning_rate", "train_batch_size", "num_train_epochs", "seed", "max_seq_length")
      },
      "history": history.history,
      "data": self.data_stats,
      "init": ctx.report.describe(),
    }
    if reports:
      self.result["param_report"] = task.param_report(jax.device_get(params))
    if jax.process_index() == 0:
      write_json(os.path.join(self.workdir, "metrics.json"), json_safe(self.result))
    return {
      "steps": ctx.loop["step"],
      "loop_seconds": ctx.loop["wall_time_sec"],
      "primary_metric": task.primary_metric,
      "dev_primary": self.result["dev"].get(task.primary_metric),
      "best_step": best_step,
    }

  def job(self) -> Job:
    config, task = self.config, self.task
    batch = int(config.train_batch_size)
    eval_every = int(config.eval_every_steps) or self.per_epoch
    program = _program(
      config,
      task,
      self.model,
      self.packer,
      total=self.total,
      warmup=self.warmup,
      eval_batch_size=self.eval_batch_size,
      init_batch=parallel.data_parallel_size(self.mesh),
      # Bucketed (or packed) batches are not `batch` rows of max_seq_length: no MFU rather
      # than an inflated one.
      flops_per_example=0.0
      if self.bucketer.enabled or self.packer is not None
      else _flops_per_row(task, self.setup.bert_config),
      make_input=lambda: FinetuneInput(
        self.train,
        self.per_epoch,
        batch,
        int(config.seed),
        self.bucketer,
        packer=self.packer,
        grad_accum_steps=int(config.grad_accum_steps),
        row_granule=_row_granule(self.mesh),
      ),
    )
    return Job(
      name=task.name,
      program=program,
      pretrained=Pretrained(
        checkpoint=config.init_checkpoint,
        params=self.setup.pretrained.params if self.setup.pretrained else None,
        subtrees=("bert",),
      ),
      hooks=RunHooks(
        evaluate=self.evaluate if self.evals else None,
        eval_every_steps=eval_every,
        save_every_steps=int(config.save_checkpoints_steps) or eval_every,
        keep_best=True,
        higher_is_better=task.higher_is_better,
        write_run_files=self.write_run_files,
        finish=self.finish,
      ),
      settings=RunSettings.from_config(config),
      describe=(
        f"Fine-tuning {task.name}: {self.train.num_rows} rows, {self.total} steps "
        f"({self.per_epoch} per epoch), warmup {self.warmup}, batch {batch}, "
        + (
          f"packed (at most {self.packer.max_sequences} sequences a row)"
          if self.packer is not None
          else f"length buckets {list(self.bucketer.buckets) if self.bucketer.enabled else 'off'}"
        )
      ),
    )


def _program(
  config,
  task: Task,
  model,
  packer: Packer | None,
  *,
  total: int,
  warmup: int,
  eval_batch_size: int,
  init_batch: int = 1,
  flops_per_example: float,
  make_input=None,
) -> Program:
  """What a fine-tuning run compiles: one phase of ``total`` steps at ``train_batch_size``."""
  batch = int(config.train_batch_size)
  return Program(
    init_params=lambda rng: task.init_variables(model, rng, init_batch)["params"],
    loss_fn=make_loss_fn(task, model),
    schedule=optimizers.warmup_linear_decay(
      config.learning_rate, warmup, total, config.optimizer.schedule
    ),
    phases=[
      Phase(
        "finetune",
        total,
        batch,
        int(config.max_seq_length),
        _batch_spec(task, packer, batch),
        grad_accum_steps=int(config.grad_accum_steps),
        flops_per_example=flops_per_example,
        make_input=make_input,
      )
    ],
    lr_scale=lr_scale(task),
    optimizer_groups=task.optimizer_groups(),
    eval_step=make_predict_fn(task, model),
    eval_batch_spec=_batch_spec(task, packer, eval_batch_size),
  )


def build_finetune_job(config, workdir: str | None = None, mesh=None) -> Job:
  """The fine-tuning ``Job`` of ``config.task``; with ``workdir=None``, abstract (no data read,
  nothing written; the encoder is ``config.model_preset``)."""
  if workdir is not None:
    return _Finetuning(config, workdir, mesh).job()
  task = create_task(config, None)
  return _abstract_job(config, task, _abstract_bert_config(config, mesh))


def _abstract_job(config, task: Task, bert_config: BertConfig) -> Job:
  """A Job of ``task`` on ``bert_config`` with its program only: for compiling, or evaluating
  a checkpoint (``config.eval_batch_size``; ``num_train_steps`` at least 1)."""
  packer = make_packer(task, config)
  model = task.build_model(bert_config)
  program = _program(
    config,
    task,
    model,
    packer,
    total=max(int(config.num_train_steps), 1),
    warmup=0,
    eval_batch_size=int(config.eval_batch_size),
    flops_per_example=0.0 if packer is not None else _flops_per_row(task, bert_config),
  )
  return Job(name=task.name, program=program, settings=RunSettings.from_config(config))


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Fine-tunes ``config.task`` in ``workdir`` (resuming if it holds a checkpoint); returns the
  metrics (metrics.json's content), or ``{"task", "status", "step"}`` when stopped early."""
  runs: list[_Finetuning] = []

  def build(config, workdir, mesh) -> Job:
    runs.append(_Finetuning(config, workdir, mesh))
    return runs[-1].job()

  summary = trainer.run(config, workdir, build, purpose="finetune", rules=FINETUNING_RUN)
  if summary["status"] != "completed":
    return {"task": summary["task"], "status": summary["status"], "step": summary["step"]}
  return runs[-1].result


def _write(task, data, metrics, preds, out_dir) -> dict:
  """Writes a split's prediction files (process 0); returns its JSON-safe metrics."""
  if jax.process_index() == 0:
    paths = task.write_predictions(data, preds, out_dir)
    logging.info("%s: %s -> %s", data.split, scalar_metrics(metrics), paths)
  return json_safe(metrics)


def _predict_and_write(task, predictor, params, splits, out_dir, verb) -> dict[str, dict]:
  """Each split's metrics, its prediction files written; progress lines read '<verb> <split>'."""
  return {
    data.split: _write(
      task, data, *evaluate_split(task, predictor, params, data, f"{verb} {data.split}"), out_dir
    )
    for data in splits
  }


# --- evaluation of a fine-tuned workdir ------------------------------------------------------
def evaluate(
  workdir: str, split: str = "dev", output_dir: str = "", overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
  """Evaluates the best (else latest) checkpoint of a fine-tuning workdir on ``split``.

  ``split`` is "dev" (every dev split of the task), "test" (every test split) or a split's own
  name (e.g. "dev_mismatched", "ax"). Writes ``<output_dir>/metrics.json`` and the task's
  prediction files (default output_dir: ``<workdir>/eval_<split>``) and returns the metrics.
  ``overrides`` replace run-config keys (e.g. a data path that moved).
  """
  with WorkdirLock(workdir, purpose="evaluate"):
    return _evaluate(workdir, split, output_dir, overrides)


def _evaluate(workdir: str, split: str, output_dir: str, overrides) -> dict[str, Any]:
  config = io.read_run_config(workdir)
  for k, v in (overrides or {}).items():
    if k not in config:
      raise KeyError(f"--set {k}=...: {k!r} is not a key of {workdir}/config.json")
    config[k] = v
  enable_compilation_cache(config.compilation_cache)
  source = checkpoint_dir(workdir, "best")
  if not has_checkpoint(source):
    raise FileNotFoundError(f"{workdir}: no checkpoint to evaluate (checkpoints/ is empty)")
  mesh = parallel.create_mesh(config.mesh)
  # The workdir's model as trained (its dropout rates, its attention), the run's numerics.
  bert_config = io.run_model_config(io.read_model_config(workdir), config, mesh, keys=NUMERICS_KEYS)
  task = create_task(config, load_tokenizer(workdir))
  names = {"dev": task.eval_splits, "test": task.test_splits}.get(split, (split,))
  if not names:
    raise ValueError(f"task {task.name} has no {split!r} split")
  job = _abstract_job(config, task, bert_config)
  asm, params, step = trainer.restore_for_evaluation(job, config, mesh, source)
  predictor = Predictor(
    task,
    None,  # the model is in asm.eval_step
    mesh,
    asm.rules,
    int(config.eval_batch_size),
    make_bucketer(task, config),
    int(config.max_seq_length),
    step=asm.eval_step,
    packer=make_packer(task, config),
  )
  output_dir = output_dir or os.path.join(workdir, f"eval_{split}")
  splits = []
  for name in names:
    try:
      splits.append(task.load_split(name))
    except FileNotFoundError as e:
      if len(names) == 1:
        raise
      logging.warning("Skipping split %s: %s", name, e)  # e.g. MNLI's AX file is absent
  verb = "predicting" if split == "test" or split in task.test_splits else "evaluating"
  results = _predict_and_write(task, predictor, params, splits, output_dir, verb)
  out = {
    "task": task.name,
    "primary_metric": task.primary_metric,
    "checkpoint": source,
    "step": step,
    "split": split,
    "eval": results,
  }
  if jax.process_index() == 0:
    write_json(os.path.join(output_dir, "metrics.json"), json_safe(out))
  return out
