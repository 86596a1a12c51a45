"""What a task hands the trainer: a ``Job``. The trainer (``bert_jax.train.trainer``) knows no
task; every task (pre-training, GLUE, SQuAD, SWAG, NER) builds one of these and nothing else
is task specific in a run.

  Job(name, init_params, loss_fn, schedule, phases, ...)

Compiling needs only the first group of fields (model, loss, optimizer schedule, the phases'
batch shapes): ``bert_jax.tasks.build_job(config, abstract=True)`` fills those without reading
data, which is how ``python -m bert_jax.compile`` assembles exactly the step a run would. A run
also needs the phases' inputs (``make_input``) and the hooks (evaluation, run files, finish).

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

from bert_jax.train.train_step import LossFn

BatchSpec = Mapping[str, jax.ShapeDtypeStruct]


@dataclasses.dataclass
class PhaseSpec:
  """A stretch of training with one input stream and one compiled step.

  Steps ``[previous phase's end_step, end_step)`` run in this phase. ``batch_spec`` is one
  global batch (shapes and dtypes, no shardings: the trainer shards it along ``batch``).
  ``make_input()`` returns an iterator of this host's numpy batches, with
  ``get_state()``/``set_state(dict)`` when its position can be saved and resumed.
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
class Job:
  """Everything task specific about a run (see the module docstring).

  Attributes:
    name: the task's name (logs, summary.json).
    init_params: ``rng -> boxed params`` (``model.init(...)["params"]`` with logical names).
    loss_fn: ``(params, batch, rng, deterministic) -> (loss, {metric: scalar})``.
    schedule: the learning-rate schedule over the whole run.
    phases: the run's phases in order (one for fine-tuning; two for the 128 -> 512 curriculum).
    lr_scale: per-parameter-group learning-rate factor (0 = frozen); None = one group.
    optimizer_groups: name -> ``OptimizerGroup``: parameters with their own optimizer.
    eval_step: ``(params, batch) -> {name: array}``, the jitted-once evaluation computation
      (``eval_batch_spec`` its global batch), for compiling; a run evaluates through ``evaluate``.
    init_checkpoint: a pretrained checkpoint to initialise from when not resuming ("" = none).
    pretrained_params: the pretrained params (host numpy) or a zero-argument loader of them
      (called only when the run does not resume); required with ``init_checkpoint``.
    pretrained_subtrees: take only these top-level subtrees of the pretrained params (e.g.
      ``("bert",)``: the encoder); None = every tensor the model has.
    evaluate: ``(params, step, eval_step) -> EvalResult`` or None when there is nothing to
      evaluate; ``eval_step`` is ``eval_step`` above jitted once by the trainer (sharded
      inputs, replicated outputs, run under the mesh), or None.
    eval_every_steps: evaluate every this many steps (0: only at the end).
    save_every_steps: save a checkpoint every this many steps (and at the end).
    keep_best: keep the checkpoint whose ``EvalResult.primary`` is best in ``<workdir>/best``.
    higher_is_better: direction of ``primary``.
    write_run_files: ``workdir -> None``, the task's files (config, model config, tokenizer,
      head.json), written by process 0 after the inputs were validated and the state built.
    finish: ``FinishContext -> dict`` after a completed run: post-processing (predictions,
      metrics.json); what it returns is added to summary.json and returned by the run.
    describe: a one-line description of the run for the log.
  """

  name: str
  init_params: Callable[[jax.Array], Any]
  loss_fn: LossFn
  schedule: optax.Schedule
  phases: list[PhaseSpec]
  lr_scale: Callable[[tuple[str, ...]], float] | None = None
  optimizer_groups: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  eval_step: Callable[[Any, Mapping[str, jax.Array]], dict[str, jax.Array]] | None = None
  eval_batch_spec: BatchSpec | None = None
  init_checkpoint: str = ""
  pretrained_params: Any = None
  pretrained_subtrees: tuple[str, ...] | None = None
  evaluate: Callable[[Any, int, Any], EvalResult] | None = None
  eval_every_steps: int = 0
  save_every_steps: int = 0
  keep_best: bool = False
  higher_is_better: bool = True
  write_run_files: Callable[[str], None] | None = None
  finish: Callable[[Any], dict[str, Any]] | None = None
  describe: str = ""

  @property
  def num_train_steps(self) -> int:
    return self.phases[-1].end_step
