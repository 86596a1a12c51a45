"""BERT pre-training: ``run_pretraining(config, workdir) -> summary`` (the library behind
``python -m bert_jax.pretrain``). The config is ``configs/pretrain.py``'s.

Order: join the processes -> mesh -> data (and tokenizer) -> model config (checked against the
workdir's) -> write config.json / model_config.json / tokenizer / head.json -> optimizer and
the sharded state (resume, else ``init_checkpoint``, else scratch) -> the curriculum's phases ->
``loop.train_loop`` -> summary.json. See ``bert_jax.train.loop`` for how the pieces fit.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
from absl import logging
from etils import epath

from bert_jax import parallel
from bert_jax.checkpoint.manager import (
  CheckpointManager,
  read_json,
  restore_or_initialize,
  write_json,
)
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.parallel.compilation_cache import enable_compilation_cache
from bert_jax.train import flops as flops_lib
from bert_jax.train import optimizers
from bert_jax.train import state as state_lib
from bert_jax.train import train_step as train_step_lib
from bert_jax.train.loop import LoopOptions, Phase, train_loop
from bert_jax.train.metrics import MetricWriter
from bert_jax.train.pretraining_data import DataSources, eval_batches, input_factory, resolve_data
from bert_jax.train.pretraining_loss import (
  make_pretraining_eval,
  make_pretraining_loss,
  summarize_eval,
)


def phase_boundary(config) -> int:
  """The first step of phase 2 (== num_train_steps when there is no phase 2)."""
  total = config.num_train_steps
  if not 0 <= config.phase2.fraction < 1:
    raise ValueError(f"config.phase2.fraction must be in [0, 1), got {config.phase2.fraction}")
  return total - int(round(config.phase2.fraction * total))


def learning_rate_schedule(config):
  """Phase 1's warmup + linear decay over the whole run; phase 2 continues it, or (with
  phase2.learning_rate >= 0) restarts with its own warmup and decay to 0 at the end."""
  kind = config.optimizer.schedule
  s1 = optimizers.warmup_linear_decay(
    config.learning_rate, config.num_warmup_steps, config.num_train_steps, kind
  )
  boundary = phase_boundary(config)
  if boundary >= config.num_train_steps or config.phase2.learning_rate < 0:
    return s1
  s2 = optimizers.warmup_linear_decay(
    config.phase2.learning_rate,
    config.phase2.num_warmup_steps,
    config.num_train_steps - boundary,
    kind,
  )
  return optimizers.join_schedules([s1, s2], [boundary])


def bert_config_from(config, vocab_size: int) -> BertConfig:
  if config.bert_config_file:
    bert = BertConfig.from_dict(read_json(config.bert_config_file), source=config.bert_config_file)
    if bert.vocab_size != vocab_size:
      raise ValueError(
        f"{config.bert_config_file}: vocab_size {bert.vocab_size} differs from "
        f"the tokenizer's {vocab_size} (config.vocab_file)"
      )
  else:
    bert = BertConfig.from_preset(config.model_preset, vocab_size=vocab_size)
  bert = bert.replace(dtype=config.dtype, remat=config.remat)
  longest = max(
    config.max_seq_length, config.phase2.max_seq_length if config.phase2.fraction > 0 else 0
  )
  if longest > bert.max_position_embeddings:
    raise ValueError(
      f"config.max_seq_length/phase2.max_seq_length {longest} exceeds the "
      f"model's max_position_embeddings {bert.max_position_embeddings}"
    )
  return bert


def _check_workdir_model(workdir: str, bert: BertConfig) -> None:
  path = epath.Path(workdir) / "model_config.json"
  if not path.exists():
    return
  existing = read_json(path)
  new = bert.to_dict()
  diff = {k: (existing.get(k), v) for k, v in new.items() if existing.get(k) != v}
  if diff:
    shown = ", ".join(f"{k}: {a} in the workdir vs {b} now" for k, (a, b) in diff.items())
    raise ValueError(
      f"{path}: this workdir holds another model ({shown}); use another "
      "--workdir or the same model settings. Nothing was changed."
    )


def _write_run_files(config, workdir: str, bert: BertConfig, sources: DataSources) -> None:
  if jax.process_index() != 0:
    return
  write_json(os.path.join(workdir, "config.json"), json.loads(config.to_json_best_effort()))
  write_json(os.path.join(workdir, "model_config.json"), bert.to_dict())
  write_json(
    os.path.join(workdir, "head.json"),
    {"task": "pretraining", "num_labels": 2, "labels": ["IsNext", "NotNext"]},
  )
  if sources.tokenizer is not None:
    sources.tokenizer.save(workdir)


def _validate(config, mesh) -> None:
  if config.num_train_steps <= 0:
    raise ValueError(f"config.num_train_steps must be positive, got {config.num_train_steps}")
  if config.save_checkpoints_steps <= 0:
    raise ValueError(
      f"config.save_checkpoints_steps must be positive, got {config.save_checkpoints_steps}"
    )
  checks = [
    ("train_batch_size", config.train_batch_size, config.grad_accum_steps, "grad_accum_steps"),
    ("eval_batch_size", config.eval_batch_size, 1, ""),
  ]
  if config.phase2.fraction > 0:
    checks.append(
      (
        "phase2.train_batch_size",
        config.phase2.train_batch_size,
        config.phase2.grad_accum_steps,
        "phase2.grad_accum_steps",
      )
    )
  for key, batch, accum, accum_key in checks:
    if accum < 1 or batch % accum:
      raise ValueError(f"config.{key}={batch} is not divisible by config.{accum_key}={accum}")
    parallel.check_batch_size(batch // accum, mesh, key if accum == 1 else f"{key} / {accum_key}")


def run_pretraining(config, workdir: str) -> dict[str, Any]:
  """Pre-trains (or resumes pre-training) into ``workdir``; returns the summary dict."""
  enable_compilation_cache(config.compilation_cache)
  parallel.initialize_distributed(config.distributed)
  mesh = parallel.create_mesh(config.mesh)
  rules = parallel.normalize_rules(config.logical_axis_rules)
  _validate(config, mesh)
  logging.info(
    "Mesh %s over %d devices (%d processes)",
    dict(mesh.shape),
    jax.device_count(),
    jax.process_count(),
  )
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  sources = resolve_data(config, workdir)
  bert = bert_config_from(config, sources.vocab_size)
  _check_workdir_model(workdir, bert)

  model = BertForPreTraining(bert)
  schedule = learning_rate_schedule(config)
  tx = optimizers.create_optimizer(config.optimizer, schedule)
  p0 = sources.phases[0]

  def init_params(rng):
    ids = jnp.zeros((1, p0.max_seq_length), jnp.int32)
    return model.init(rng, ids, ids, ids, jnp.zeros((1, p0.max_predictions_per_seq), jnp.int32))[
      "params"
    ]

  abstract, shardings = state_lib.abstract_train_state(init_params, tx, mesh, rules, config.seed)
  manager = CheckpointManager(
    workdir, config.checkpoint.keep_checkpoint_max, config.checkpoint.async_save
  )
  state, input_state, meta, report = restore_or_initialize(
    manager,
    abstract,
    lambda: state_lib.init_train_state(init_params, tx, mesh, rules, config.seed, shardings),
    init_checkpoint=config.init_checkpoint,
    with_params=lambda s, p: state_lib.state_with_params(s, p, tx, shardings),
  )
  _write_run_files(config, workdir, bert, sources)

  loss_fn = make_pretraining_loss(model)
  boundary = phase_boundary(config)
  phase_cfgs = [(config.train_batch_size, config.grad_accum_steps, boundary)]
  if boundary < config.num_train_steps:
    phase_cfgs.append(
      (config.phase2.train_batch_size, config.phase2.grad_accum_steps, config.num_train_steps)
    )
  phases = []
  for data, (batch, accum, end) in zip(sources.phases, phase_cfgs):
    step_fn = train_step_lib.jit_train_step(
      train_step_lib.make_train_step(loss_fn, tx, schedule, accum, mesh), shardings, mesh, rules
    )
    phases.append(
      Phase(
        name=f"seq{data.max_seq_length}",
        end_step=end,
        make_input=input_factory(config, sources, data, parallel.host_batch_size(batch)),
        train_step=step_fn,
        global_batch_size=batch,
        seq_len=data.max_seq_length,
        flops_per_example=flops_lib.train_flops_per_example(
          bert, data.max_seq_length, data.max_predictions_per_seq
        ),
      )
    )

  eval_step = train_step_lib.jit_eval_step(make_pretraining_eval(model), mesh, rules)
  eval_host_batch = parallel.host_batch_size(config.eval_batch_size)

  def evaluate(st) -> dict[str, float]:
    step = int(jax.device_get(st.step))
    from bert_jax.train.loop import phase_index  # noqa: PLC0415

    data = sources.phases[phase_index(phases, max(step - 1, 0))]
    sums = None
    for host_batch in eval_batches(config, sources, data, eval_host_batch):
      out = eval_step(st.params, parallel.make_global_batch(host_batch, mesh, rules))
      sums = out if sums is None else jax.tree_util.tree_map(jnp.add, sums, out)
    return summarize_eval(jax.device_get(sums)) if sums is not None else {}

  peak = flops_lib.peak_flops_per_device(
    jax.devices()[0].device_kind,
    config.logging.peak_flops_per_device,
    config.logging.cpu_peak_flops_per_device,
  )
  options = LoopOptions(
    save_every_steps=config.save_checkpoints_steps,
    log_every_steps=config.logging.log_every_steps,
    eval_every_steps=config.eval_every_steps,
    peak_flops_per_device=peak,
    save_on_preemption=config.checkpoint.save_on_preemption,
    eval_fn=evaluate,
  )
  writer = MetricWriter(workdir)
  logging.info(
    "Model %s: %d layers, hidden %d, vocab %d; %d params; %s",
    config.model_preset,
    bert.num_hidden_layers,
    bert.hidden_size,
    bert.vocab_size,
    sum(x.size for x in jax.tree_util.tree_leaves(abstract.params)),
    report.describe(),
  )
  try:
    summary = train_loop(
      state,
      phases,
      manager,
      options,
      writer,
      mesh,
      rules,
      input_state=input_state,
      input_phase=meta.get("phase"),
    )
  finally:
    writer.close()
    manager.close()
  summary.update(
    init=report.source,
    init_checkpoint=report.path,
    not_loaded=report.not_loaded,
    newly_initialized=report.newly_initialized,
    num_params=int(sum(x.size for x in jax.tree_util.tree_leaves(abstract.params))),
    mesh=dict(mesh.shape),
    num_devices=jax.device_count(),
    num_processes=jax.process_count(),
    peak_flops_per_device=peak,
  )
  if jax.process_index() == 0:
    write_json(os.path.join(workdir, "summary.json"), summary)
  return summary
