"""What the tasks decide about a run config before its Job exists: the config's checks and what
makes a workdir hold the same job.

  rules = config_rules(config)          # ConfigRules: pre-training's, or fine-tuning's
  check_run_config(config, mesh=None)   # bert_jax.train.run_config's check under those rules
  identity = workdir_identity(fixed)    # WorkdirIdentity: the job a workdir's config.json holds
  run = run_rules(config)               # both, for bert_jax.train.trainer.run:
                                        # PRETRAINING_RUN or FINETUNING_RUN

A config that names a ``task`` is fine-tuning's, else pre-training's (as ``jobs.build_job``
tells them apart). The identity is one for every task: a workdir holds a job (fine-tuning's
``task``, else pre-training's ``objective``) and a model (the sizes ``model_preset`` or
``bert_config_file`` choose; a fine-tuning run from ``init_checkpoint`` takes that checkpoint's
model, so none is compared), whichever job asks.

Light (no JAX model is built): the entry points, ``bert_jax.compile`` and the launcher's
pre-flight read these first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bert_jax.checkpoint import read_json
from bert_jax.model.config import BertConfig
from bert_jax.runs.finetuning.rules import FINETUNING_RULES
from bert_jax.runs.pretraining.rules import PRETRAINING_RULES
from bert_jax.runs.pretraining.rules import resume_fixed_keys as pretraining_fixed_keys
from bert_jax.train import run_config
from bert_jax.train.job import RunRules, WorkdirIdentity

# The model sizes a workdir's model_config.json must share with the config resuming it.
MODEL_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def is_finetuning(config: Mapping[str, Any]) -> bool:
  return "task" in config


def config_rules(config: Mapping[str, Any]) -> run_config.ConfigRules:
  """The checks of ``config``'s run: fine-tuning's when it names a task, else pre-training's."""
  return FINETUNING_RULES if is_finetuning(config) else PRETRAINING_RULES


def check_run_config(config, mesh=None, *, processes: int | None = None) -> None:
  """``bert_jax.train.run_config.check_run_config`` under ``config_rules(config)``."""
  run_config.check_run_config(config, mesh, processes=processes, rules=config_rules(config))


def _kind_keys(recorded: Mapping[str, Any], config: Mapping[str, Any]) -> tuple[str, ...]:
  """The keys naming the job, compared in order: the task, and for pre-training (neither names
  a task) the objective."""
  if recorded.get("task") or config.get("task"):
    return ("task",)
  return ("task", "objective")


def _describe(config: Mapping[str, Any]) -> str | None:
  """The job a run config describes, e.g. ``'mrpc'`` or ``pre-training (objective 'mlm')``;
  None when it names neither a task nor an objective."""
  if config.get("task"):
    return repr(config.get("task"))
  if config.get("objective"):
    return f"pre-training (objective {config.get('objective')!r})"
  return None


def _model_sizes(config: Mapping[str, Any], recorded: Mapping[str, Any]) -> dict[str, Any] | None:
  """The encoder sizes the config chooses, or None when none are compared: they come from
  elsewhere (a fine-tuning run's init_checkpoint, this one's or the workdir's: a resume
  continues the workdir's own model)."""
  if config.get("task") and (recorded.get("init_checkpoint") or config.get("init_checkpoint")):
    return None
  if config.get("bert_config_file"):
    path = str(config.get("bert_config_file"))
    bert = BertConfig.from_dict(read_json(path), source=path)
  elif config.get("model_preset"):
    bert = BertConfig.from_preset(str(config.get("model_preset")))
  else:
    return None
  return {k: getattr(bert, k) for k in MODEL_SIZES}


def workdir_identity(fixed_keys: Callable[[Any], tuple[str, ...]] | None = None) -> WorkdirIdentity:
  """What a workdir must share with a config to be resumed by it (see the module docstring);
  ``fixed_keys(config)``: the task's keys a resume may not change."""
  return WorkdirIdentity(
    kind_keys=_kind_keys,
    describe=_describe,
    unnamed="no task or objective",
    model_sizes=_model_sizes,
    fixed_keys=fixed_keys,
  )


def run_rules(config: Mapping[str, Any]) -> RunRules:
  """The rules ``bert_jax.train.trainer.run`` applies to ``config``'s run before its Job."""
  return FINETUNING_RUN if is_finetuning(config) else PRETRAINING_RUN


PRETRAINING_RUN = RunRules(PRETRAINING_RULES, workdir_identity(pretraining_fixed_keys))
FINETUNING_RUN = RunRules(FINETUNING_RULES, workdir_identity())
