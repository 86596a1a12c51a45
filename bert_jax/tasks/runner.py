"""Fine-tuning and evaluation of any registered task on the shared training machinery.

  result = finetune(config, workdir)     # train; evaluate on dev; keep the best; predict test
  result = evaluate(workdir, "dev")      # a fine-tuned workdir -> metrics JSON + predictions

Everything not task specific is the pre-training code's: the mesh (``bert_jax.parallel``), the
sharded TrainState, BERT's AdamW and warmup/linear-decay schedule, the jitted donated train step
(``bert_jax.train``), Orbax checkpoints and the resume / pretrained / scratch order
(``bert_jax.checkpoint.manager``). The task (``bert_jax.tasks.base.Task``) supplies data, head,
loss and metrics.

The run: ``num_train_steps`` = ``num_train_epochs`` x (train rows // ``train_batch_size``)
unless set; rows are shuffled each epoch by a generator seeded with (seed, epoch), so the
batches of a step depend only on the step and a resumed run sees exactly the batches the
uninterrupted one would (``bert_jax.tasks.finetune_input``). With ``length_buckets`` each
train and eval batch is cut to the shortest bucket holding its longest row
(``bert_jax.tasks.length_buckets``); JAX's persistent compilation cache is switched on first
(``config.compilation_cache``), so a re-run with the same shapes loads its compiled steps
(the state's init takes the seed as an argument, so one program serves every seed).

Every ``eval_every_steps`` (0: each epoch) and at the end, the dev split(s) are evaluated; a
checkpoint for resuming goes to ``checkpoints/`` and, when the task's primary metric on the
first dev split improves, to ``best/`` (itself a bert_jax workdir, which
``load_pretrained``/``load_params`` read). At the end the dev predictions of the best
evaluation are written (kept from the loop, not predicted again), the best parameters predict
the test splits into ``predictions/``, and ``metrics.json``/``summary.json`` are written: one
file a sweep collects, ``{"task", "primary_metric", "dev": {...}, "best_step", "hparams", ...}``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from absl import logging

from bert_jax import parallel
from bert_jax.checkpoint.manager import CheckpointManager, InitReport, merge_pretrained_params
from bert_jax.parallel.compilation_cache import enable_compilation_cache
from bert_jax.tasks import create_task
from bert_jax.tasks import runner_io as io
from bert_jax.tasks.base import SplitData, Task
from bert_jax.tasks.finetune_input import FinetuneInput, Predictor, make_bucketer
from bert_jax.train import optimizers
from bert_jax.train import state as state_lib
from bert_jax.train import train_step as step_lib
from bert_jax.train.loop import LoopOptions, Phase, train_loop
from bert_jax.train.metrics import MetricWriter


# --- pieces ---------------------------------------------------------------------------------
def _names(path) -> tuple[str, ...]:
  return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def with_frozen(tx: optax.GradientTransformation, task: Task) -> optax.GradientTransformation:
  """``tx`` whose updates are zeroed on the parameters the task does not train.

  The zeroing comes last, so frozen parameters get neither gradient steps nor weight decay.
  (Their Adam moments exist but stay zero: the task stops their gradients. A stateless mask
  keeps the optimizer state's tree, and so its shardings, the same as without freezing.)
  """
  if type(task).trainable is Task.trainable:
    return tx

  def zero_frozen(updates, params=None):
    del params
    return jax.tree_util.tree_map_with_path(
      lambda p, u: u if task.trainable(_names(p)) else jax.numpy.zeros_like(u), updates
    )

  return optax.chain(tx, optax.stateless(zero_frozen))


def make_loss_fn(task: Task, model):
  def loss_fn(params, batch, rng, deterministic):
    return task.loss(task.apply(model, params, batch, deterministic, rng), batch)

  return loss_fn


def evaluate_split(task: Task, predictor: Predictor, params, data: SplitData):
  """(metrics, task predictions) of one split."""
  return task.evaluate(data, predictor(params, data))


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


def _better(task: Task, new: float, old: float | None) -> bool:
  return old is None or (new > old if task.higher_is_better else new < old)


class _Writer(MetricWriter):
  """TensorBoard scalars, also keeping the training loss curve for summary.json."""

  def __init__(self, workdir: str):
    super().__init__(workdir)
    self.losses: list[list[float]] = []
    self.first_step_seconds: float | None = None  # the loop's first step: mostly compiling

  def scalars(self, step: int, values) -> None:
    if "train/loss" in values:
      self.losses.append([step, float(values["train/loss"])])
    if "train/first_step_sec" in values and self.first_step_seconds is None:
      self.first_step_seconds = float(values["train/first_step_sec"])
    super().scalars(step, values)


# --- fine-tuning ----------------------------------------------------------------------------
def _initial_state(config, setup, manager, abstract, shardings, init_fn, tx):
  """(state, input position, report): resume, else the pretrained encoder (new head), else
  scratch. Only the encoder ("bert") of a pretrained checkpoint is used; everything else it
  holds (pre-training heads, another task's head) is reported as not loaded."""
  step = manager.latest_step()
  if step is not None:
    state, input_state, _ = manager.restore(step, abstract)
    return state, input_state, InitReport("resumed", step=step, path=manager.directory)
  state = init_fn()
  if setup.pretrained is None:
    return state, {}, InitReport("scratch")
  host = (
    jax.tree_util.tree_map(np.asarray, jax.device_get(state.params))
    if jax.process_count() == 1
    else _allgather(state.params)
  )
  pre = setup.pretrained.params
  if "bert" not in pre:
    raise ValueError(f"{config.init_checkpoint}: no encoder ('bert') parameters found")
  merged, report = merge_pretrained_params(host, {"bert": pre["bert"]}, config.init_checkpoint)
  report.not_loaded = sorted(
    report.not_loaded
    + [
      "/".join(_names(p))
      for p, _ in jax.tree_util.tree_flatten_with_path(
        {k: v for k, v in pre.items() if k != "bert"}
      )[0]
    ]
  )
  state = state_lib.state_with_params(state, merged, tx, shardings)
  return state, {}, report


def init_train_state(init_params, tx, shardings, seed: int) -> state_lib.TrainState:
  """``state_lib.init_train_state`` for shardings already derived (one program for every seed)."""
  return state_lib.init_train_state(init_params, tx, None, None, seed, shardings)


def _allgather(tree):
  from jax.experimental import multihost_utils  # noqa: PLC0415

  return multihost_utils.process_allgather(tree, tiled=True)


class _EvalHook:
  """The loop's eval_fn: evaluates the dev split(s), keeps the best checkpoint, records history.

  The history and best so far live in ``<workdir>/eval_history.json`` so a resumed run keeps
  them (entries after the resumed step are dropped).
  """

  def __init__(self, task, predictor, evals, best_manager, workdir, resumed_step):
    self.task, self.predictor, self.evals = task, predictor, evals
    self.best_manager = best_manager
    self.path = os.path.join(workdir, "eval_history.json")
    saved = {}
    if resumed_step is not None and os.path.isfile(self.path):
      with open(self.path) as f:
        saved = json.load(f)
    self.history = [h for h in saved.get("history", []) if h["step"] <= (resumed_step or 0)]
    self.best_value, self.best_step = saved.get("best_value"), saved.get("best_step")
    self.primary_split = task.eval_splits[0] if task.eval_splits else None
    self.seconds = 0.0  # spent evaluating (predict + metrics) in this process's loop
    self.outputs: dict[int, dict[str, tuple[dict, Any]]] = {}  # step -> split -> (metrics, preds)

  def __call__(self, state) -> dict[str, float]:
    step = int(jax.device_get(state.step))
    entry = {"step": step}
    t0 = time.time()
    outputs = {}
    for data in self.evals:
      outputs[data.split] = evaluate_split(self.task, self.predictor, state.params, data)
      entry[data.split] = outputs[data.split][0]
    self.seconds += time.time() - t0
    self.history.append(io.json_safe(entry))
    p = self.primary_split
    if p and entry[p]:
      value = float(entry[p][self.task.primary_metric])
      if _better(self.task, value, self.best_value):
        self.best_value, self.best_step = value, step
        self.best_manager.save(step, state, meta={"best_value": value})
    # The best and the latest evaluations' outputs: the final dev predictions are written from
    # these instead of restoring a checkpoint and predicting the dev split(s) again.
    self.outputs[step] = outputs
    self.outputs = {s: o for s, o in self.outputs.items() if s in (step, self.best_step)}
    if jax.process_index() == 0:
      io.write_json(
        self.path,
        {"history": self.history, "best_value": self.best_value, "best_step": self.best_step},
      )
    return {
      k: v
      for d in self.evals
      for k, v in io.scalar_metrics(entry[d.split], f"{d.split}/").items()
      if "per_type" not in k
    }


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Fine-tunes ``config.task`` in ``workdir`` (resuming if it holds a checkpoint)."""
  t_start = time.time()
  enable_compilation_cache(config.compilation_cache)
  parallel.initialize_distributed(config.distributed)
  os.makedirs(workdir, exist_ok=True)
  setup = io.resolve_model(config, workdir)
  task = create_task(config, setup.tokenizer)
  model = task.build_model(setup.bert_config)
  train = task.load_split(task.train_split)
  evals = [task.load_split(s) for s in task.eval_splits]
  data_stats = {d.split: d.stats for d in [train] + evals}
  logging.info("Data: %s", data_stats)

  mesh = parallel.create_mesh(config.mesh)
  rules = parallel.normalize_rules(config.logical_axis_rules)
  batch_size = int(config.train_batch_size)
  parallel.check_batch_size(batch_size, mesh, "train_batch_size")
  parallel.check_batch_size(int(config.eval_batch_size), mesh, "eval_batch_size")
  per_epoch, total, warmup = _plan(config, train.num_rows)
  schedule = optimizers.warmup_linear_decay(
    config.learning_rate, warmup, total, config.optimizer.schedule
  )
  tx = with_frozen(optimizers.create_optimizer(config.optimizer, schedule), task)
  dp = parallel.data_parallel_size(mesh)
  init_params = lambda rng: task.init_variables(model, rng, dp)["params"]
  abstract, shardings = state_lib.abstract_train_state(init_params, tx, mesh, rules, config.seed)
  init_fn = lambda: init_train_state(init_params, tx, shardings, int(config.seed))
  manager = CheckpointManager(
    workdir, keep=config.checkpoint.keep_checkpoint_max, async_save=config.checkpoint.async_save
  )
  best_dir = os.path.join(workdir, io.BEST_DIR)
  best_manager = CheckpointManager(best_dir, keep=1, async_save=False)
  state, input_state, report = _initial_state(
    config, setup, manager, abstract, shardings, init_fn, tx
  )
  logging.info("Init: %s", report.describe())
  print(f"[finetune] {report.describe()}", flush=True)
  io.write_run_files(workdir, config, setup, task.head_info())
  io.copy_model_files(workdir, best_dir)

  step_fn = step_lib.jit_train_step(
    step_lib.make_train_step(
      make_loss_fn(task, model), tx, schedule, int(config.grad_accum_steps), mesh
    ),
    shardings,
    mesh,
    rules,
  )
  bucketer = make_bucketer(task, config)
  predictor = Predictor(
    task, model, mesh, rules, int(config.eval_batch_size), bucketer, int(config.max_seq_length)
  )
  eval_every = int(config.eval_every_steps) or per_epoch
  hook = _EvalHook(
    task,
    predictor,
    evals,
    best_manager,
    workdir,
    report.step if report.source == "resumed" else None,
  )
  writer = _Writer(workdir)
  phase = Phase(
    "finetune",
    total,
    lambda: FinetuneInput(train, per_epoch, batch_size, int(config.seed), bucketer),
    step_fn,
    batch_size,
    int(config.max_seq_length),
  )
  options = LoopOptions(
    save_every_steps=int(config.save_checkpoints_steps) or eval_every,
    log_every_steps=int(config.logging.log_every_steps),
    eval_every_steps=eval_every,
    save_on_preemption=bool(config.checkpoint.save_on_preemption),
    eval_fn=hook if evals else None,
  )
  logging.info(
    "Fine-tuning %s: %d rows, %d steps (%d per epoch), warmup %d, batch %d, length buckets %s",
    task.name,
    train.num_rows,
    total,
    per_epoch,
    warmup,
    batch_size,
    list(bucketer.buckets) if bucketer.enabled else "off",
  )
  loop = train_loop(state, [phase], manager, options, writer, mesh, rules, input_state=input_state)
  writer.close()
  if loop["status"] != "completed":
    manager.close(), best_manager.close()
    return {"task": task.name, "status": loop["status"], "step": loop["step"]}

  best_step = hook.best_step if config.keep_best and hook.best_step is not None else total
  out_dir = os.path.join(workdir, io.PREDICTIONS_DIR)
  cached = hook.outputs.get(best_step)
  params = None
  if cached is None or (config.predict_test and task.test_splits):
    # The loop donated `state`: the params are those of the last (or best) checkpoint.
    final_params = (
      manager.restore_params(total)
      if best_step == total
      else best_manager.restore_params(best_step)
    )
    params = state_lib.place_like(final_params, abstract.params)
  if cached is None:  # e.g. resumed after the last evaluation
    final = _predict_and_write(task, predictor, params, evals, out_dir)
  else:
    final = {d.split: _write(task, d, *cached[d.split], out_dir) for d in evals}
  if config.predict_test:
    for split in task.test_splits:
      try:
        data = task.load_split(split)
      except (FileNotFoundError, ValueError) as e:
        logging.info("No %s predictions: %s", split, e)
        continue
      data_stats[split] = data.stats
      final.update(_predict_and_write(task, predictor, params, [data], out_dir))
  primary_split = hook.primary_split
  result = {
    "task": task.name,
    "status": "completed",
    "primary_metric": task.primary_metric,
    "primary_split": primary_split,
    "higher_is_better": task.higher_is_better,
    "dev": final.get(primary_split, {}) if primary_split else {},
    "eval": {k: v for k, v in final.items() if v},
    "best_step": best_step,
    "num_train_steps": total,
    "hparams": {
      k: config[k]
      for k in ("learning_rate", "train_batch_size", "num_train_epochs", "seed", "max_seq_length")
    },
    "history": hook.history,
    "data": data_stats,
    "init": report.describe(),
  }
  summary = {
    "task": task.name,
    "status": "completed",
    "steps": loop["step"],
    "train": loop["train"],
    "wall_seconds": time.time() - t_start,
    "loop_seconds": loop["wall_time_sec"],
    "eval_seconds": hook.seconds,
    "train_seconds": loop["wall_time_sec"] - hook.seconds,
    "first_step_seconds": writer.first_step_seconds,
    "primary_metric": task.primary_metric,
    "dev_primary": result["dev"].get(task.primary_metric),
    "best_step": best_step,
    "train_loss_history": writer.losses,
  }
  if jax.process_index() == 0:
    io.write_json(os.path.join(workdir, "metrics.json"), io.json_safe(result))
    io.write_json(os.path.join(workdir, "summary.json"), io.json_safe(summary))
  manager.close()
  best_manager.close()
  return result


def _write(task, data, metrics, preds, out_dir) -> dict:
  """Writes a split's prediction files (process 0); returns its JSON-safe metrics."""
  if jax.process_index() == 0:
    paths = task.write_predictions(data, preds, out_dir)
    logging.info("%s: %s -> %s", data.split, io.scalar_metrics(metrics), paths)
  return io.json_safe(metrics)


def _predict_and_write(task, predictor, params, splits, out_dir) -> dict[str, dict]:
  return {
    data.split: _write(task, data, *evaluate_split(task, predictor, params, data), out_dir)
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
  config = io.read_run_config(workdir)
  for k, v in (overrides or {}).items():
    if k not in config:
      raise KeyError(f"--set {k}=...: {k!r} is not a key of {workdir}/config.json")
    config[k] = v
  enable_compilation_cache(config.compilation_cache)
  best_dir = os.path.join(workdir, io.BEST_DIR)
  source = best_dir if io.has_checkpoint(best_dir) else workdir
  if not io.has_checkpoint(source):
    raise FileNotFoundError(f"{workdir}: no checkpoint to evaluate (checkpoints/ is empty)")
  bert_config = io.read_model_config(workdir).replace(dtype=config.dtype)
  from bert_jax.tokenize import load_tokenizer  # noqa: PLC0415

  task = create_task(config, load_tokenizer(workdir))
  model = task.build_model(bert_config)
  names = {"dev": task.eval_splits, "test": task.test_splits}.get(split, (split,))
  if not names:
    raise ValueError(f"task {task.name} has no {split!r} split")
  mesh = parallel.create_mesh(config.mesh)
  rules = parallel.normalize_rules(config.logical_axis_rules)
  dp = parallel.data_parallel_size(mesh)
  boxed = jax.eval_shape(lambda: task.init_variables(model, jax.random.PRNGKey(0), dp)["params"])
  shardings = parallel.logical_shardings(boxed, mesh, rules)
  manager = CheckpointManager(source, keep=1, async_save=False)
  try:
    host = manager.restore_params()
    step = manager.latest_step()
  finally:
    manager.close()
  params = jax.tree_util.tree_map(
    lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i]), host, shardings
  )
  predictor = Predictor(
    task,
    model,
    mesh,
    rules,
    int(config.eval_batch_size),
    make_bucketer(task, config),
    int(config.max_seq_length),
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
  results = _predict_and_write(task, predictor, params, splits, output_dir)
  out = {
    "task": task.name,
    "primary_metric": task.primary_metric,
    "checkpoint": source,
    "step": step,
    "split": split,
    "eval": results,
  }
  if jax.process_index() == 0:
    io.write_json(os.path.join(output_dir, "metrics.json"), io.json_safe(out))
  return out
