"""What a task hands the trainer: a ``Job``, in three parts (and its run-wide settings). The trainer
(``bert_jax.train.trainer``) knows no task; every task (pre-training, GLUE, SQuAD, SWAG, NER)
builds one of these and nothing else is task specific in a run.

  Job(name, Program(init_params, loss_fn, schedule, phases, ...),   # what is compiled
      Pretrained(checkpoint, params, subtrees),                      # where weights come from
      RunHooks(evaluate, eval_every_steps, finish, ...),             # what a run does around it
      settings=RunSettings(optimizer, seed, checkpoint, logging))    # run-wide settings

Before the Job, a task's ``RunRules`` (the config's checks, the workdir's identity) are given
to ``trainer.run``: they are checked before the task reads or writes anything.

Compiling needs only the ``Program`` (model, loss, optimizer schedule and groups, the phases'
batch shapes, the evaluation step): ``bert_jax.runs.jobs.build_job(config, abstract=True)``
fills it without reading data, which is how ``python -m bert_jax.compile`` assembles exactly
the step a run would. A run also needs the phases' inputs (``Phase.make_input``), the
pretrained weights when it does not resume, and the hooks.

Per-parameter groups: ``lr_scale(path) -> float`` multiplies the optimizer's update of the
parameter at ``path`` (a tuple of names, e.g. ``("bert", "encoder", ...)``): 0 freezes it (no
gradient step, no weight decay), 1 trains it as usual, anything else is a group learning rate
relative to the schedule. ``None`` (the default) trains everything with one learning rate.
``optimizer_groups`` (name -> ``optimizers.OptimizerGroup``) gives the parameters a group claims
their own optimizer and learning rate (a defence's adversary); the rest keep the run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import optax

from bert_jax.train.run_config import GENERIC_RULES, ConfigRules
from bert_jax.train.train_step import LossFn

BatchSpec = Mapping[str, jax.ShapeDtypeStruct]


@dataclasses.dataclass
class Phase:
  """A stretch of training with one input stream and one compiled step.

  Steps ``[previous phase's end_step, end_step)`` run in this phase. ``batch_spec`` is one
  global batch (shapes and dtypes, no shardings: the trainer shards it along ``batch``).
  ``make_input()`` returns an iterator of this host's numpy batches, with
  ``get_state()``/``set_state(dict)`` when its position can be saved and resumed (None in an
  abstract job). ``flops_per_example`` (0: unknown) gives the progress line its MFU.
  """

  name: str
  end_step: int
  global_batch_size: int
  seq_len: int
  batch_spec: BatchSpec
  grad_accum_steps: int = 1
  flops_per_example: float = 0.0
  make_input: Callable[[], Iterator[dict]] | None = None


@dataclasses.dataclass
class EvalResult:
  """One evaluation: ``metrics`` (scalars logged and put in summary.json), ``record`` (the
  JSON-safe entry kept in eval_history.json), ``primary`` (the value that selects the best
  checkpoint when the job keeps one; None: this evaluation says nothing about it) and the
  task's own ``outputs`` (e.g. predictions), kept for the best and the latest step."""

  metrics: dict[str, float]
  record: dict[str, Any] = dataclasses.field(default_factory=dict)
  primary: float | None = None
  outputs: Any = None


@dataclasses.dataclass
class Program:
  """What a run compiles: the model's parameters, the loss, the optimizer's schedule and
  parameter groups, the phases, the evaluation step.

  Attributes:
    init_params: ``rng -> boxed params`` (``model.init(...)["params"]`` with logical names).
    loss_fn: ``(params, batch, rng, deterministic) -> (loss, {metric: scalar})``.
    schedule: the learning-rate schedule over the whole run.
    phases: the run's phases in order (one for fine-tuning; two for the 128 -> 512 curriculum).
    lr_scale: per-parameter-group learning-rate factor (0 = frozen); None = one group.
    optimizer_groups: name -> ``OptimizerGroup``: parameters with their own optimizer.
    eval_step: ``(params, batch) -> {name: array}``, the evaluation computation the trainer
      jits once (``eval_batch_spec`` its global batch); None when there is none.
  """

  init_params: Callable[[jax.Array], Any]
  loss_fn: LossFn
  schedule: optax.Schedule
  phases: list[Phase]
  lr_scale: Callable[[tuple[str, ...]], float] | None = None
  optimizer_groups: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  eval_step: Callable[[Any, Mapping[str, jax.Array]], dict[str, jax.Array]] | None = None
  eval_batch_spec: BatchSpec | None = None

  @property
  def num_train_steps(self) -> int:
    return self.phases[-1].end_step


@dataclasses.dataclass
class Pretrained:
  """Where a run that does not resume takes its weights from (nothing: from scratch).

  Attributes:
    checkpoint: the pretrained checkpoint's path ("" = none), for the log and the summary.
    params: its params (host numpy) or a zero-argument loader of them (called only when the
      run does not resume); required with ``checkpoint``.
    subtrees: take only these top-level subtrees (e.g. ``("bert",)``: the encoder); None =
      every tensor the model has.
  """

  checkpoint: str = ""
  params: Any = None
  subtrees: tuple[str, ...] | None = None


@dataclasses.dataclass
class RunHooks:
  """What a run does around the training loop; none of it is compiled.

  Attributes:
    evaluate: ``(params, step, eval_step) -> EvalResult`` or None when there is nothing to
      evaluate; ``eval_step`` is ``Program.eval_step`` jitted once by the trainer (sharded
      inputs, replicated outputs, run under the mesh), or None.
    eval_every_steps: evaluate every this many steps (0: only at the end).
    save_every_steps: save a checkpoint every this many steps (and at the end).
    keep_best: keep the checkpoint whose ``EvalResult.primary`` is best in ``<workdir>/best``.
    higher_is_better: direction of ``primary``.
    write_run_files: ``workdir -> None``, the task's files (config, model config, tokenizer,
      head.json), written by process 0 after the inputs were validated and the state built.
    finish: ``FinishContext -> dict`` after a completed run: post-processing (predictions,
      metrics.json); what it returns is added to summary.json and returned by the run.
  """

  evaluate: Callable[[Any, int, Any], EvalResult] | None = None
  eval_every_steps: int = 0
  save_every_steps: int = 0
  keep_best: bool = False
  higher_is_better: bool = True
  write_run_files: Callable[[str], None] | None = None
  finish: Callable[[Any], dict[str, Any]] | None = None


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """The run-wide settings the trainer applies to any job, as the task read them from its
  config: ``optimizer`` (``optimizers.create_optimizer``'s section), ``seed`` (the state's
  initialisation), ``checkpoint`` (the checkpoint manager's options) and ``logging`` (progress
  cadence, the MFU peaks)."""

  optimizer: Any
  seed: int
  checkpoint: Any
  logging: Any

  @classmethod
  def from_config(cls, config) -> RunSettings:
    """A run config's ``optimizer``, ``seed``, ``checkpoint`` and ``logging`` sections."""
    return cls(config.optimizer, int(config.seed), config.checkpoint, config.logging)


@dataclasses.dataclass
class Job:
  """A task's run for the trainer: its ``name`` (logs, summary.json), the ``program`` it
  compiles, the ``pretrained`` weights it starts from, the ``hooks`` it runs, ``describe``, a
  one-line description for the log, and the run-wide ``settings`` (None, a hand-built job:
  the run config's, ``RunSettings.from_config``)."""

  name: str
  program: Program
  pretrained: Pretrained = dataclasses.field(default_factory=Pretrained)
  hooks: RunHooks = dataclasses.field(default_factory=RunHooks)
  describe: str = ""
  settings: RunSettings | None = None

  def run_settings(self, config) -> RunSettings:
    """``settings``, or for a job without them ``config``'s."""
    return self.settings if self.settings is not None else RunSettings.from_config(config)


@dataclasses.dataclass(frozen=True)
class WorkdirIdentity:
  """What makes a workdir's run (its config.json, model_config.json) the job of a config, as
  the task sees it (``bert_jax.train.trainer.check_workdir_identity`` applies it).

  Attributes:
    kind_keys: ``(recorded, config) -> keys`` naming the kind of job, compared in order: the
      first whose value differs refuses the workdir.
    describe: ``config -> words`` for the job a run config (or a recorded one) describes, or
      None when it names none.
    unnamed: the words for a config that names no job (after "a run of" / "has").
    model_sizes: ``(config, recorded) -> {size: value}`` the workdir's model_config.json must
      hold, or None when no sizes are compared.
    fixed_keys: ``config -> dotted keys`` a resume may not change (e.g. how its input is laid
      out); None: none.
  """

  kind_keys: Callable[[Mapping, Mapping], tuple[str, ...]]
  describe: Callable[[Mapping], str | None]
  unnamed: str = "no name"
  model_sizes: Callable[[Mapping, Mapping], dict[str, Any] | None] | None = None
  fixed_keys: Callable[[Any], tuple[str, ...]] | None = None


@dataclasses.dataclass(frozen=True)
class RunRules:
  """What a task decides about its run before its Job is built (the trainer checks these
  before anything is read or written): the run config's checks, and the workdir's identity
  (None: any workdir)."""

  config: ConfigRules = GENERIC_RULES
  identity: WorkdirIdentity | None = None
