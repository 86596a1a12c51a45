"""TEMPORARY: the pre-training job assembled from today's pieces, with the API that
``bert_jax.tasks.build_job`` + ``bert_jax.train.trainer`` will provide (same names, same steps:
``state.abstract_train_state``, ``train_step.make_train_step`` / ``jit_train_step``, the batch
sharded along ``batch``). Deleted once the trainer is committed; nothing else imports it but
``bert_jax.plan.assembly``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from bert_jax import parallel
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.tasks.pretraining_loss import make_pretraining_eval, make_pretraining_loss
from bert_jax.train import flops as flops_lib
from bert_jax.train import optimizers
from bert_jax.train import state as state_lib
from bert_jax.train import train_step as step_lib


@dataclasses.dataclass
class PhaseSpec:
  name: str
  global_batch_size: int
  grad_accum_steps: int
  seq_len: int
  flops_per_example: float
  batch_spec: dict


@dataclasses.dataclass
class Job:
  name: str
  init_params: Any
  loss_fn: Any
  schedule: Any
  phases: list
  eval_step: Any
  eval_batch_spec: dict


@dataclasses.dataclass
class Assembled:
  job: Job
  mesh: Any
  rules: Any
  tx: Any
  abstract_state: Any
  state_shardings: Any
  train_steps: list
  eval_step: Any


def _batch_spec(batch: int, seq: int, preds: int) -> dict:
  i32 = np.int32
  shapes = {
    "input_ids": ((batch, seq), i32),
    "input_mask": ((batch, seq), i32),
    "segment_ids": ((batch, seq), i32),
    "masked_lm_positions": ((batch, preds), i32),
    "masked_lm_ids": ((batch, preds), i32),
    "masked_lm_weights": ((batch, preds), np.float32),
    "next_sentence_labels": ((batch,), i32),
  }
  return {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in shapes.items()}


def build_job(config, *, abstract: bool = True) -> Job:
  del abstract
  bert = BertConfig.from_preset(config.model_preset, vocab_size=30522).replace(
    dtype=config.dtype, remat=config.remat
  )
  model = BertForPreTraining(bert)
  seq, preds = config.max_seq_length, config.max_predictions_per_seq

  def init_params(rng):
    ids = jnp.zeros((1, seq), jnp.int32)
    return model.init(rng, ids, ids, ids, jnp.zeros((1, preds), jnp.int32))["params"]

  settings = [
    (config.train_batch_size, config.grad_accum_steps, seq, preds),
  ]
  if config.phase2.fraction > 0:
    p2 = config.phase2
    settings.append(
      (p2.train_batch_size, p2.grad_accum_steps, p2.max_seq_length, p2.max_predictions_per_seq)
    )
  phases = [
    PhaseSpec(
      f"seq{s}", b, a, s, flops_lib.train_flops_per_example(bert, s, p), _batch_spec(b, s, p)
    )
    for b, a, s, p in settings
  ]
  schedule = optimizers.warmup_linear_decay(
    config.learning_rate, config.num_warmup_steps, config.num_train_steps, config.optimizer.schedule
  )
  last = settings[-1]
  return Job(
    "pretraining",
    init_params,
    make_pretraining_loss(model),
    schedule,
    phases,
    make_pretraining_eval(model),
    _batch_spec(config.eval_batch_size, last[2], last[3]),
  )


def assemble(job: Job, config, mesh, rules) -> Assembled:
  tx = optimizers.create_optimizer(config.optimizer, job.schedule)
  abstract, shardings = state_lib.abstract_train_state(
    job.init_params, tx, mesh, rules, config.seed
  )
  steps = [
    step_lib.jit_train_step(
      step_lib.make_train_step(job.loss_fn, tx, job.schedule, p.grad_accum_steps, mesh),
      shardings,
      mesh,
      rules,
    )
    for p in job.phases
  ]
  eval_step = jax.jit(
    job.eval_step, out_shardings=NamedSharding(mesh, jax.sharding.PartitionSpec())
  )
  return Assembled(job, mesh, rules, tx, abstract, shardings, steps, eval_step)


def _sharded(spec, mesh, rules) -> dict:
  return {
    k: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=NamedSharding(mesh, parallel.batch_spec(len(x.shape), rules))
    )
    for k, x in spec.items()
  }


def lower_train_step(asm: Assembled, phase: int = 0):
  batch = _sharded(asm.job.phases[phase].batch_spec, asm.mesh, asm.rules)
  with parallel.mesh_context(asm.mesh, asm.rules):
    return asm.train_steps[phase].jitted.lower(asm.abstract_state, batch)


def lower_eval_step(asm: Assembled):
  batch = _sharded(asm.job.eval_batch_spec, asm.mesh, asm.rules)
  with parallel.mesh_context(asm.mesh, asm.rules):
    return asm.eval_step.lower(asm.abstract_state.params, batch)
