"""The one trainer: assembles and runs any task's job (pre-training, GLUE, SQuAD, SWAG, NER).

  summary = run(config, workdir, build)          # build(config, workdir, mesh) -> Job
  asm = assemble(job, config, mesh, rules)       # what a run compiles, without running it
  lowered = lower_train_step(asm, phase=0)       # e.g. for a TPU topology (bert_jax.compile)

A run, in this order (every task goes through exactly these steps):
  1. the run config's numbers are checked (``check_run_config``), JAX's compilation cache and
     the multi-process runtime are set up, the workdir is created and locked for this run
     (``bert_jax.checkpoint.lock``: a second run on it is refused);
  2. the mesh and logical-axis rules; the task builds its ``Job`` (reads and validates its
     data: bad input fails here, before anything is written);
  3. ``assemble``: the optimizer (with the job's parameter groups), the abstract state
     (``jax.eval_shape``) and its shardings from the logical rules, one jitted donated train
     step per phase, the jitted evaluation step;
  4. the state, by ``bert_jax.checkpoint.restore_or_initialize``'s one documented order:
     resume this run's latest checkpoint, else the pretrained checkpoint (params only), else
     scratch -- created directly in its shardings (``jit(init, out_shardings=...)``);
  5. the task's run files (config.json, model_config.json, tokenizer, head.json);
  6. ``bert_jax.train.loop.train_loop``: steps, logging, evaluation (history kept in
     eval_history.json; with ``job.keep_best`` the best checkpoint in ``best/``), checkpoints
     with the input position, SIGTERM/SIGINT preemption, non-finite loss stop;
  7. after a completed run, ``job.finish`` (predictions, metrics.json); summary.json; the
     checkpoint managers, the metric writer and the lock are released whatever happened.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
from absl import logging
from etils import epath
from jax.sharding import NamedSharding

from bert_jax import parallel
from bert_jax.checkpoint import CheckpointManager, InitReport, restore_or_initialize, write_json
from bert_jax.checkpoint.lock import WorkdirLock
from bert_jax.parallel.compilation_cache import enable_compilation_cache
from bert_jax.train import flops as flops_lib
from bert_jax.train import optimizers
from bert_jax.train import state as state_lib
from bert_jax.train import train_step as step_lib
from bert_jax.train.eval_history import EvalHistory
from bert_jax.train.job import Job
from bert_jax.train.loop import LoopOptions, Phase, train_loop
from bert_jax.train.metrics import MetricWriter, json_safe
from bert_jax.train.run_config import check_run_config

BEST_DIR = "best"


@dataclasses.dataclass
class Assembled:
  """A job made concrete for a mesh: what a run compiles and executes."""

  job: Job
  mesh: jax.sharding.Mesh
  rules: Any
  tx: Any
  abstract_state: Any  # ShapeDtypeStructs carrying their NamedShardings
  state_shardings: Any
  train_steps: list  # one jitted, donated step per phase (``run.jitted`` is the jax.jit)
  eval_step: Any  # jitted (params, batch) -> outputs, or None
  seed: int

  def init_state(self):
    """A fresh state created directly in its shardings (one program for every seed)."""
    return state_lib.init_train_state(
      self.job.init_params, self.tx, None, None, self.seed, self.state_shardings
    )

  def with_params(self, state, host_params):
    return state_lib.state_with_params(state, host_params, self.tx, self.state_shardings)

  @property
  def num_params(self) -> int:
    return int(sum(x.size for x in jax.tree_util.tree_leaves(self.abstract_state.params)))


def assemble(job: Job, config, mesh: jax.sharding.Mesh, rules) -> Assembled:
  """Optimizer, abstract state and shardings, the jitted steps (nothing runs, nothing is read)."""
  for phase in job.phases:
    accum = phase.grad_accum_steps
    if accum < 1 or phase.global_batch_size % accum:
      raise ValueError(
        f"phase {phase.name}: the batch size {phase.global_batch_size} is not divisible by "
        f"its gradient accumulation steps {accum}"
      )
  tx = optimizers.create_optimizer(config.optimizer, job.schedule)
  if job.lr_scale is not None:
    tx = optimizers.with_param_groups(tx, job.lr_scale)
  tx = optimizers.with_optimizer_groups(tx, job.optimizer_groups)
  seed = int(config.seed)
  abstract, shardings = state_lib.abstract_train_state(job.init_params, tx, mesh, rules, seed)
  steps = [
    step_lib.jit_train_step(
      step_lib.make_train_step(job.loss_fn, tx, job.schedule, phase.grad_accum_steps, mesh),
      shardings,
      mesh,
      rules,
    )
    for phase in job.phases
  ]
  eval_step = step_lib.jit_eval_step(job.eval_step, mesh, rules) if job.eval_step else None
  return Assembled(job, mesh, rules, tx, abstract, shardings, steps, eval_step, seed)


def _sharded_batch_spec(batch_spec, mesh, rules) -> dict[str, jax.ShapeDtypeStruct]:
  return {
    k: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=NamedSharding(mesh, parallel.batch_spec(len(x.shape), rules))
    )
    for k, x in batch_spec.items()
  }


def lower_train_step(asm: Assembled, phase: int = 0):
  """The train step of ``phase`` lowered for the abstract state and batch (``jax.stages.Lowered``;
  ``.compile()`` it for the mesh's devices, e.g. a TPU topology's)."""
  batch = _sharded_batch_spec(asm.job.phases[phase].batch_spec, asm.mesh, asm.rules)
  with parallel.mesh_context(asm.mesh, asm.rules):
    return asm.train_steps[phase].jitted.lower(asm.abstract_state, batch)


def lower_eval_step(asm: Assembled):
  """The evaluation step lowered like ``lower_train_step``; None when the job has none."""
  if asm.eval_step is None or asm.job.eval_batch_spec is None:
    return None
  batch = _sharded_batch_spec(asm.job.eval_batch_spec, asm.mesh, asm.rules)
  with parallel.mesh_context(asm.mesh, asm.rules):
    return asm.eval_step.jitted.lower(asm.abstract_state.params, batch)


def _prepare_workdir(workdir: str) -> None:
  path = epath.Path(workdir)
  if path.exists() and not path.is_dir():
    raise FileExistsError(f"--workdir {workdir} is a file, not a directory")
  path.mkdir(parents=True, exist_ok=True)


class _Writer(MetricWriter):
  """TensorBoard scalars, also keeping the training loss curve and the first step's time."""

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


@dataclasses.dataclass
class FinishContext:
  """What ``job.finish`` gets after a completed run."""

  asm: Assembled
  workdir: str
  loop: dict[str, Any]
  report: InitReport
  history: EvalHistory
  restore_params: Any  # step -> params placed like the state's (from checkpoints/ or best/)


def run(config, workdir: str, build, purpose: str = "train") -> dict[str, Any]:
  """Runs the job ``build(config, workdir, mesh)`` in ``workdir`` (resuming if it can);
  ``purpose`` names the run in the workdir lock (a refused second run is told it)."""
  t_start = time.time()
  check_run_config(config)
  enable_compilation_cache(config.compilation_cache)
  parallel.initialize_distributed(config.distributed)
  _prepare_workdir(workdir)
  with WorkdirLock(workdir, purpose=purpose) as lock:
    mesh = parallel.create_mesh(config.mesh)
    rules = parallel.normalize_rules(config.logical_axis_rules)
    logging.info(
      "Mesh %s over %d devices (%d processes)",
      dict(mesh.shape),
      jax.device_count(),
      jax.process_count(),
    )
    job = build(config, workdir, mesh)
    return _run_job(job, config, workdir, mesh, rules, lock, t_start)


def _run_job(job: Job, config, workdir, mesh, rules, lock, t_start) -> dict[str, Any]:
  asm = assemble(job, config, mesh, rules)
  ckpt = config.checkpoint
  manager = CheckpointManager(
    workdir,
    keep=ckpt.keep_checkpoint_max,
    async_save=ckpt.async_save,
    keep_period=ckpt.keep_period,
  )
  best = (
    CheckpointManager(os.path.join(workdir, BEST_DIR), keep=1, async_save=False)
    if job.keep_best
    else None
  )
  writer = None
  try:
    state, input_state, meta, report = restore_or_initialize(
      manager,
      asm.abstract_state,
      asm.init_state,
      init_checkpoint=job.init_checkpoint,
      with_params=asm.with_params,
      pretrained_params=job.pretrained_params,
      pretrained_subtrees=job.pretrained_subtrees,
    )
    logging.info("Init: %s", report.describe())
    print(f"[{job.name}] {report.describe()}", flush=True)
    if job.write_run_files is not None and jax.process_index() == 0:
      job.write_run_files(workdir)
    resumed = report.step if report.source == "resumed" else None
    history = EvalHistory(workdir, resumed, job.higher_is_better, best)
    peak = flops_lib.peak_flops_per_device(
      jax.devices()[0].device_kind,
      config.logging.peak_flops_per_device,
      config.logging.cpu_peak_flops_per_device,
    )
    phases = [
      Phase(p.name, p.end_step, p.make_input, step, p.global_batch_size, p.seq_len,
            p.flops_per_example)
      for p, step in zip(job.phases, asm.train_steps)
    ]  # fmt: skip
    evaluate = None
    if job.evaluate is not None:
      evaluate = history.evaluator(lambda params, step: job.evaluate(params, step, asm.eval_step))
    options = LoopOptions(
      save_every_steps=job.save_every_steps or job.eval_every_steps or job.num_train_steps,
      log_every_steps=int(config.logging.log_every_steps),
      eval_every_steps=job.eval_every_steps,
      peak_flops_per_device=peak,
      save_on_preemption=bool(ckpt.save_on_preemption),
      eval_fn=evaluate,
      before_save=lock.check,
    )
    if job.evaluate is None:
      logging.warning("No evaluation data configured: the run will not be evaluated")
    logging.info("%s: %d params; %s", job.describe or job.name, asm.num_params, report.describe())
    writer = _Writer(workdir)
    loop = train_loop(
      state, phases, manager, options, writer, mesh, rules,
      input_state=input_state, input_phase=meta.get("phase"),
    )  # fmt: skip
    summary = dict(
      loop,
      task=job.name,
      init=report.source,
      init_checkpoint=report.path,
      not_loaded=report.not_loaded,
      newly_initialized=report.newly_initialized,
      num_params=asm.num_params,
      mesh=dict(mesh.shape),
      num_devices=jax.device_count(),
      num_processes=jax.process_count(),
      peak_flops_per_device=peak,
      eval_history=history.history,
      best_step=history.best_step,
      eval_seconds=history.seconds,
      train_seconds=loop["wall_time_sec"] - history.seconds,
      first_step_seconds=writer.first_step_seconds,
      train_loss_history=writer.losses,
    )
    lock.check()  # nothing of this run's is written over another run's
    if loop["status"] == "completed" and job.finish is not None:

      def restore_params(step: int):
        source = best if best is not None and step in best.all_steps() else manager
        return state_lib.place_like(source.restore_params(step), asm.abstract_state.params)

      summary.update(job.finish(FinishContext(asm, workdir, loop, report, history, restore_params)))
    summary["wall_seconds"] = time.time() - t_start
    if jax.process_index() == 0:
      write_json(os.path.join(workdir, "summary.json"), json_safe(summary))
    return summary
  finally:
    if writer is not None:
      writer.close()
    manager.close()
    if best is not None:
      best.close()
