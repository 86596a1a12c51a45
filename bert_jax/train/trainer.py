"""The one trainer: assembles and runs any task's job (pre-training, GLUE, SQuAD, SWAG, NER).

  summary = run(config, workdir, build, rules=rules)   # build(config, workdir, mesh) -> Job
  asm = assemble(job, config, mesh, rules)       # what a run compiles, without running it
  asm, params, step = restore_for_evaluation(job, config, mesh, checkpoint_dir)
  lowered = lower_train_step(asm, phase=0)       # e.g. for a TPU topology (bert_jax.compile)

A run, in this order (every task goes through exactly these steps):
  1. the run config's numbers are checked under the task's ``RunRules`` (``check_run_config``;
     the batch layout against the mesh once it is made, ``check_batch_layout``); under a
     launcher that restarts the job, an attempt that cannot help is refused
     (``bert_jax.train.attempts``: the attempts before it saved no checkpoint past the one it
     would resume from); JAX's compilation cache and the multi-process runtime are set up; a
     workdir that holds another job's run (as the task's ``WorkdirIdentity`` tells: its
     config.json names another job, or its model_config.json other sizes) is refused before
     anything is read or written (``check_workdir_identity``); the
     workdir is created and locked for this run (``bert_jax.checkpoint.lock``: a second run on
     it is refused), the attempt is recorded (attempts.json, under a launcher that restarts
     the job), and the temporary directories of an earlier run's interrupted save are removed;
  2. the mesh and logical-axis rules; the task builds its ``Job`` (reads and validates its
     data: bad input fails here, before anything is written);
  3. ``assemble``: the optimizer (with the job's parameter groups), the abstract state
     (``jax.eval_shape``) and its shardings from the logical rules, one jitted donated train
     step per phase, the jitted evaluation step;
  4. the state, by ``bert_jax.checkpoint.restore_or_initialize``'s one documented order:
     resume this run's latest checkpoint, else the pretrained checkpoint (params only), else
     scratch -- created directly in its shardings (``jit(init, out_shardings=...)``); where it
     came from is logged once ("Init: ...");
  5. the task's run files (config.json, model_config.json, tokenizer, head.json);
  6. ``bert_jax.train.loop.train_loop``: steps, logging, evaluation (history kept in
     eval_history.json; with ``job.hooks.keep_best`` the best checkpoint in ``best/``), checkpoints
     with the input position, SIGTERM/SIGINT preemption, non-finite loss stop. A resumed run
     first redoes the evaluations the history lacks (the process died during them): the one
     due at the step it resumed from, and earlier ones whose checkpoint still exists (those
     whose checkpoint is gone are named in one warning);
  7. after a completed run, ``job.hooks.finish`` (predictions, metrics.json); summary.json (with
     ``restarts``, the launch's restarts so far); how the attempt ended; the checkpoint
     managers, the metric writer and the lock are released whatever happened.
A run that fails before it wrote a file leaves the workdir as it found it: the directories it
created (the workdir itself, missing parents, ``checkpoints/``, ``best/``) and an attempts.json
it started are removed when they hold no other file.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from typing import Any

import jax
from absl import logging
from etils import epath
from jax.sharding import NamedSharding

from bert_jax import parallel
from bert_jax.checkpoint import (
  CheckpointManager,
  InitReport,
  read_json,
  restore_or_initialize,
  write_json,
)
from bert_jax.checkpoint.lock import WorkdirLock
from bert_jax.parallel.compilation_cache import enable_compilation_cache
from bert_jax.train import flops as flops_lib
from bert_jax.train import optimizers
from bert_jax.train import state as state_lib
from bert_jax.train import train_step as step_lib
from bert_jax.train.attempts import ATTEMPTS_FILE, Attempts
from bert_jax.train.eval_history import EvalHistory
from bert_jax.train.job import Job, RunRules, WorkdirIdentity
from bert_jax.train.loop import LoopOptions, train_loop
from bert_jax.train.metrics import MetricWriter, json_safe
from bert_jax.train.run_config import check_batch_layout, check_run_config

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
      self.job.program.init_params, self.tx, None, None, self.seed, self.state_shardings
    )

  def with_params(self, state, host_params):
    return state_lib.state_with_params(state, host_params, self.tx, self.state_shardings)

  @property
  def num_params(self) -> int:
    return int(sum(x.size for x in jax.tree_util.tree_leaves(self.abstract_state.params)))


def assemble(job: Job, config, mesh: jax.sharding.Mesh, rules) -> Assembled:
  """Optimizer, abstract state and shardings, the jitted steps (nothing runs, nothing is read)."""
  program = job.program
  for phase in program.phases:
    accum = phase.grad_accum_steps
    if accum < 1 or phase.global_batch_size % accum:
      raise ValueError(
        f"phase {phase.name}: the batch size {phase.global_batch_size} is not divisible by "
        f"its gradient accumulation steps {accum}"
      )
  settings = job.run_settings(config)
  tx = optimizers.create_optimizer(settings.optimizer, program.schedule)
  if program.lr_scale is not None:
    tx = optimizers.with_param_groups(tx, program.lr_scale)
  tx = optimizers.with_optimizer_groups(tx, program.optimizer_groups)
  seed = settings.seed
  abstract, shardings = state_lib.abstract_train_state(program.init_params, tx, mesh, rules, seed)
  steps = [
    step_lib.jit_train_step(
      step_lib.make_train_step(program.loss_fn, tx, program.schedule, phase.grad_accum_steps, mesh),
      shardings,
      mesh,
      rules,
    )
    for phase in program.phases
  ]
  eval_step = step_lib.jit_eval_step(program.eval_step, mesh, rules) if program.eval_step else None
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
  batch = _sharded_batch_spec(asm.job.program.phases[phase].batch_spec, asm.mesh, asm.rules)
  with parallel.mesh_context(asm.mesh, asm.rules):
    return asm.train_steps[phase].jitted.lower(asm.abstract_state, batch)


def lower_eval_step(asm: Assembled):
  """The evaluation step lowered like ``lower_train_step``; None when the job has none."""
  if asm.eval_step is None or asm.job.program.eval_batch_spec is None:
    return None
  batch = _sharded_batch_spec(asm.job.program.eval_batch_spec, asm.mesh, asm.rules)
  with parallel.mesh_context(asm.mesh, asm.rules):
    return asm.eval_step.jitted.lower(asm.abstract_state.params, batch)


def restore_for_evaluation(job: Job, config, mesh: jax.sharding.Mesh, checkpoint_dir: str):
  """``(asm, params, step)``: ``job`` assembled for ``mesh`` (``asm.eval_step`` is its jitted
  evaluation step) and the params of the latest checkpoint in ``checkpoint_dir`` (a workdir or
  its ``best/``), placed in the shardings a run gives them."""
  rules = parallel.normalize_rules(config.logical_axis_rules)
  asm = assemble(job, config, mesh, rules)
  manager = CheckpointManager(checkpoint_dir, keep=1, async_save=False)
  try:
    host = manager.restore_params()
    step = manager.latest_step()
  finally:
    manager.close()
  return asm, state_lib.place_like(host, asm.abstract_state.params), step


def _dotted(d: dict, key: str):
  for part in key.split("."):
    if not isinstance(d, dict) or part not in d:
      return None
    d = d[part]
  return d


def _checkpoint_steps(workdir: str) -> list[int]:
  """The steps of the workdir's saved checkpoints (an interrupted save's temporary directory is
  not one), without opening them."""
  path = epath.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit()) if path.is_dir() else []


def _has_checkpoint(workdir: str) -> bool:
  return bool(_checkpoint_steps(workdir))


def check_workdir_identity(config, workdir: str, identity: WorkdirIdentity | None = None) -> None:
  """ValueError (one line, naming the file and key) when ``workdir`` holds the run of another
  job than ``config``'s, as the task's ``identity`` tells them apart: one of its kind keys (e.g.
  the task) or the model's sizes recorded in config.json / model_config.json differ; or, when
  it holds a checkpoint, one of its fixed keys (dotted config keys the task's resume cannot
  change, e.g. how its input is laid out) differs from config.json's value. What users change
  on a resume (learning rate, steps, intervals, ...) is not compared. Without ``identity``,
  nothing is. Reads only."""
  path = epath.Path(workdir) / "config.json"
  if identity is None or not path.is_file():
    return
  recorded = read_json(path)
  if not isinstance(recorded, dict):
    return
  fixed_keys = identity.fixed_keys(config) if identity.fixed_keys else ()
  if fixed_keys and _has_checkpoint(workdir):
    for key in fixed_keys:
      held, wanted = _dotted(recorded, key), config
      for part in key.split("."):
        wanted = wanted.get(part) if hasattr(wanted, "get") else None
      if held is not None and held != wanted:
        raise ValueError(
          f"workdir {workdir} was trained with config.{key}={held!r} ({path}); a resume "
          f"cannot change it to {wanted!r}: use the workdir's value, or a new --workdir"
        )
  for key in identity.kind_keys(recorded, config):
    if recorded.get(key) != config.get(key):
      what = f"{key}" if recorded.get(key) is not None else f"no {key}"
      held, wanted = identity.describe(recorded), identity.describe(config)
      raise ValueError(
        f"workdir {workdir} holds "
        + (f"a {held} run" if held else f"a run of {identity.unnamed}")
        + f" ({path}: {what}); this config "
        + (f"is {wanted}" if wanted else f"has {identity.unnamed}")
        + ": use a new --workdir"
      )
  model_path = epath.Path(workdir) / "model_config.json"
  if not model_path.is_file() or identity.model_sizes is None:
    return
  sizes = identity.model_sizes(config, recorded)
  if sizes is None:
    return
  check_same_model(model_path, sizes)


def check_same_model(model_path, expected: dict[str, Any]) -> None:
  """ValueError naming each of ``expected``'s keys whose value differs in the workdir's
  ``model_config.json`` (``model_path``); nothing when the file is absent."""
  if not epath.Path(model_path).exists():
    return
  existing = read_json(model_path)
  diff = {k: (existing.get(k), v) for k, v in expected.items() if existing.get(k) != v}
  if diff:
    shown = ", ".join(f"{k}: {a} in the workdir vs {b} now" for k, (a, b) in diff.items())
    raise ValueError(
      f"{model_path}: this workdir holds another model ({shown}); use another --workdir or "
      "the same model settings. Nothing was changed."
    )


@dataclasses.dataclass
class _Created:
  """What preparing a local workdir found: the directories it created (the topmost first) and
  the workdir's entries before."""

  dirs: list[str]
  before: set[str]


def _prepare_workdir(workdir: str) -> _Created:
  path = epath.Path(workdir)
  if path.exists() and not path.is_dir():
    raise FileExistsError(f"--workdir {workdir} is a file, not a directory")
  created = _Created([], set())
  if "://" not in str(workdir):
    missing = os.path.abspath(workdir)
    while not os.path.lexists(missing):
      created.dirs.insert(0, missing)
      missing = os.path.dirname(missing)
    created.before = set(os.listdir(workdir)) if os.path.isdir(workdir) else set()
  path.mkdir(parents=True, exist_ok=True)
  return created


def _holds_no_file(directory: str) -> bool:
  if os.path.islink(directory) or not os.path.isdir(directory):
    return False
  for root, dirs, files in os.walk(directory):
    if files or any(os.path.islink(os.path.join(root, d)) for d in dirs):
      return False
  return True


def _remove_created(workdir: str, created: _Created) -> None:
  """After a run failed: when it wrote no file, removes the directories it created (empty ones
  in the workdir, e.g. ``checkpoints/``; the workdir and its parents if it created them), so
  that the file system is as the run found it. Anything else stays."""
  if jax.process_index() != 0 or "://" in str(workdir) or not os.path.isdir(workdir):
    return
  new = [os.path.join(workdir, n) for n in sorted(set(os.listdir(workdir)) - created.before)]
  if not all(_holds_no_file(p) for p in new if os.path.basename(p) != ATTEMPTS_FILE):
    return
  for p in new:
    if os.path.isdir(p) and not os.path.islink(p):
      shutil.rmtree(p, ignore_errors=True)
    else:
      os.remove(p)
  for d in reversed(created.dirs):
    try:
      os.rmdir(d)  # only while empty: something another process put there stays
    except OSError:
      break
  if created.dirs and not os.path.exists(created.dirs[0]):
    logging.info("Removed %s: the run failed before writing anything there", created.dirs[0])


def _earlier_summary(workdir: str) -> dict:
  """The workdir's summary.json from an earlier run, or {}."""
  path = os.path.join(workdir, "summary.json")
  return read_json(path) if epath.Path(path).is_file() else {}


def _earlier_losses(workdir: str, resumed: int | None) -> list[list[float]]:
  """The training losses the workdir's summary.json holds up to the step resumed from (the
  loss curve before this run), or none."""
  if resumed is None:
    return []
  history = _earlier_summary(workdir).get("train_loss_history") or []
  return [list(e) for e in history if isinstance(e, list) and len(e) == 2 and e[0] <= resumed]


class _Writer(MetricWriter):
  """TensorBoard scalars, also keeping the training loss curve and the first step's time."""

  def __init__(self, workdir: str, attempts: Attempts):
    super().__init__(workdir)
    self.losses: list[list[float]] = []
    self.first_step_seconds: float | None = None  # the loop's first step: mostly compiling
    self.attempts = attempts  # told the step of each progress line

  def scalars(self, step: int, values) -> None:
    if "train/loss" in values:
      self.losses.append([step, float(values["train/loss"])])
      self.attempts.reached(step)
    if "train/first_step_sec" in values and self.first_step_seconds is None:
      self.first_step_seconds = float(values["train/first_step_sec"])
    super().scalars(step, values)


@dataclasses.dataclass
class FinishContext:
  """What ``job.hooks.finish`` gets after a completed run."""

  asm: Assembled
  workdir: str
  loop: dict[str, Any]
  report: InitReport
  history: EvalHistory
  restore_params: Any  # step -> params placed like the state's (from checkpoints/ or best/)


def _redo_earlier_evaluations(history, evaluate, every: int, resumed: int, restore_state) -> None:
  """Evaluates the checkpoints of the steps before ``resumed`` whose evaluation was due
  (multiples of ``every``) but is not in the history; those whose checkpoint is gone are named
  in one warning. (The one due at ``resumed`` itself is the loop's.)"""
  missing = [s for s in range(every, resumed, every) if s not in history.steps] if every else []
  gone = []
  for step in missing:
    state = restore_state(step)
    if state is None:
      gone.append(step)
      continue
    logging.warning(
      "The evaluation of step %d is missing from %s: evaluating its checkpoint", step, history.path
    )
    evaluate(state)
  if gone:
    logging.warning(
      "The evaluations of steps %s are missing from %s and their checkpoints are gone: they "
      "stay missing",
      ", ".join(map(str, gone)),
      history.path,
    )


def run(
  config, workdir: str, build, purpose: str = "train", rules: RunRules | None = None
) -> dict[str, Any]:
  """Runs the job ``build(config, workdir, mesh)`` in ``workdir`` (resuming if it can);
  ``purpose`` names the run in the workdir lock (a refused second run is told it); ``rules``,
  the task's checks of its config and of the workdir's identity, made before the job is built
  (None: every run config's checks, any workdir)."""
  t_start = time.time()
  rules = RunRules() if rules is None else rules
  check_run_config(config, rules=rules.config)
  attempts = Attempts.from_environ(workdir)  # a plain run unless a launcher restarts the job
  resume_step = (_checkpoint_steps(workdir) or [0])[-1]
  attempts.refuse_without_progress(resume_step)
  enable_compilation_cache(config.compilation_cache)
  parallel.initialize_distributed(config.distributed)
  check_workdir_identity(config, workdir, rules.identity)
  created = _prepare_workdir(workdir)
  try:
    with WorkdirLock(workdir, purpose=purpose) as lock:
      attempts.start(resume_step, writer=jax.process_index() == 0)
      try:
        mesh = parallel.create_mesh(config.mesh)
        check_batch_layout(
          config, mesh, rules=rules.config
        )  # every batch against accumulation, data x fsdp, hosts
        rules = parallel.normalize_rules(config.logical_axis_rules)
        logging.info(
          "Mesh %s over %d devices (%d processes)",
          dict(mesh.shape),
          jax.device_count(),
          jax.process_count(),
        )
        job = build(config, workdir, mesh)
        summary = _run_job(job, config, workdir, mesh, rules, lock, t_start, attempts)
      except BaseException as e:
        how = "interrupted" if isinstance(e, KeyboardInterrupt) else f"failed: {type(e).__name__}"
        _record_end(attempts, how)
        raise
      _record_end(attempts, summary["status"], summary["step"])
      return summary
  except BaseException:
    _remove_created(workdir, created)
    raise


def _record_end(attempts: Attempts, how: str, step: int | None = None) -> None:
  """How the attempt ended, in attempts.json; a failure to write it is a warning (it must not
  hide the run's own outcome)."""
  try:
    attempts.end(how, step)
  except Exception as e:
    logging.warning("Could not record how this attempt ended in %s: %s", attempts.path, e)


def _run_job(job: Job, config, workdir, mesh, rules, lock, t_start, attempts) -> dict[str, Any]:
  asm = assemble(job, config, mesh, rules)
  program, hooks, settings = job.program, job.hooks, job.run_settings(config)
  ckpt = settings.checkpoint
  manager = CheckpointManager(
    workdir,
    keep=ckpt.keep_checkpoint_max,
    async_save=ckpt.async_save,
    keep_period=ckpt.keep_period,
  )
  best = (
    CheckpointManager(os.path.join(workdir, BEST_DIR), keep=1, async_save=False)
    if hooks.keep_best
    else None
  )
  writer = None
  try:
    for m in (manager, best):
      if m is not None:
        m.remove_incomplete()
    state, input_state, meta, report = restore_or_initialize(
      manager,
      asm.abstract_state,
      asm.init_state,
      init_checkpoint=job.pretrained.checkpoint,
      with_params=asm.with_params,
      pretrained_params=job.pretrained.params,
      pretrained_subtrees=job.pretrained.subtrees,
    )
    logging.info("Init: %s", report.describe())
    if hooks.write_run_files is not None and jax.process_index() == 0:
      hooks.write_run_files(workdir)
    resumed = report.step if report.source == "resumed" else None
    history = EvalHistory(workdir, resumed, hooks.higher_is_better, best)

    def restore_state(step: int):
      """The run's own checkpoint of ``step`` as a state, or None when it is gone."""
      if step not in manager.all_steps():
        return None
      return manager.restore(step, asm.abstract_state)[0]

    if resumed is not None:
      history.reconcile_best(restore_state)
    peak = flops_lib.peak_flops_per_device(
      jax.devices()[0].device_kind,
      settings.logging.peak_flops_per_device,
      settings.logging.cpu_peak_flops_per_device,
    )
    evaluate = None
    if hooks.evaluate is not None:
      evaluate = history.evaluator(lambda params, step: hooks.evaluate(params, step, asm.eval_step))
      if resumed is not None:
        every = hooks.eval_every_steps
        _redo_earlier_evaluations(history, evaluate, every, resumed, restore_state)
    options = LoopOptions(
      save_every_steps=hooks.save_every_steps or hooks.eval_every_steps or program.num_train_steps,
      log_every_steps=int(settings.logging.log_every_steps),
      eval_every_steps=hooks.eval_every_steps,
      peak_flops_per_device=peak,
      save_on_preemption=bool(ckpt.save_on_preemption),
      eval_fn=evaluate,
      before_save=lock.check,
      evaluated=lambda step: step in history.steps,
    )
    if hooks.evaluate is None:
      logging.warning("No evaluation data configured: the run will not be evaluated")
    logging.info("%s: %d params", job.describe or job.name, asm.num_params)
    writer = _Writer(workdir, attempts)
    loop = train_loop(
      state, program.phases, asm.train_steps, manager, options, writer, mesh, rules,
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
      train_loss_history=_earlier_losses(workdir, resumed) + writer.losses,
      restarts=attempts.restarts(),
    )
    if not summary["train"] and resumed is not None:  # resumed at its last step: nothing trained
      summary["train"] = _earlier_summary(workdir).get("train") or {}
    lock.check()  # nothing of this run's is written over another run's
    if loop["status"] == "completed" and hooks.finish is not None:

      def restore_params(step: int):
        source = best if best is not None and step in best.all_steps() else manager
        return state_lib.place_like(source.restore_params(step), asm.abstract_state.params)

      summary.update(
        hooks.finish(FinishContext(asm, workdir, loop, report, history, restore_params))
      )
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
