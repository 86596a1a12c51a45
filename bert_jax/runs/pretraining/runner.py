"""BERT pre-training as a task: masked LM + next sentence, the 128 -> 512 curriculum.

  summary = run_pretraining(config, workdir)      # python -m bert_jax.pretrain
  job = build_pretraining_job(config, workdir, mesh)   # what the trainer runs
  job = build_pretraining_job(config)             # abstract: shapes only (bert_jax.compile)

The config is ``configs/pretrain.py``'s. The task supplies the model (``BertForPreTraining``),
the loss, the learning-rate schedule over both phases, one phase per sequence length (its
input: TFRecords, the built-in corpus or synthetic batches) and the held-out evaluation; the
trainer (``bert_jax.train.trainer``) does the rest. The workdir's model_config.json, if any,
must describe the same model (checked before anything is written).

With ``config.packing.enabled`` the training rows hold several instances each
(``bert_jax.data.packing``) and the model sees each packed sequence on its own
(``position_ids``, ``sequence_ids``, ``cls_positions``). The real-token share of the training
rows, packed or not, is logged (at the first batch, every 1,000th and at the end of a completed
run) and written to summary.json as ``input_token_share``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from bert_jax import parallel
from bert_jax.checkpoint import read_json, write_json
from bert_jax.formats import load_pretrained
from bert_jax.formats import pretrained as pretrained_lib
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.model.kernels.attention import platform_of
from bert_jax.model.run_settings import run_attention_kernel, run_bert_config, run_lengths
from bert_jax.runs.rules import MODEL_SIZES, PRETRAINING_RUN
from bert_jax.tasks.pretraining.data import (
  DataSources,
  TokenShare,
  abstract_sources,
  batch_keys,
  check_row_sizes,
  eval_batches,
  input_factory,
  mask_rates,
  resolve_data,
)
from bert_jax.tasks.pretraining.loss import (
  check_objective,
  make_pretraining_eval,
  make_pretraining_loss,
  summarize_eval,
)
from bert_jax.train import flops as flops_lib
from bert_jax.train import optimizers, trainer
from bert_jax.train.job import EvalResult, Job, Phase, Pretrained, Program, RunHooks, RunSettings
from bert_jax.train.loop import phase_index

CURRICULUM_FILE = "curriculum.json"  # in the workdir: {"phase2_start_step": int}


def phase_boundary(config, kept: int | None = None) -> int:
  """The first step of phase 2 (== num_train_steps when there is no phase 2): the last
  ``phase2.fraction`` of ``num_train_steps``, or ``kept`` (a resumed run's phase 2 that has
  begun starts where it began, so a longer run trains on in phase 2)."""
  total = config.num_train_steps
  if not 0 <= config.phase2.fraction < 1:
    raise ValueError(f"config.phase2.fraction must be in [0, 1), got {config.phase2.fraction}")
  if config.phase2.fraction > 0 and kept is not None and kept < total:
    return kept
  return total - int(round(config.phase2.fraction * total))


def latest_checkpoint_step(workdir: str) -> int | None:
  """The step of the workdir's latest saved checkpoint (``checkpoints/<step>``), or None."""
  path = epath.Path(workdir) / "checkpoints"
  if not path.is_dir():
    return None
  steps = [int(p.name) for p in path.iterdir() if p.name.isdigit()]
  return max(steps) if steps else None


def kept_phase_boundary(workdir: str, resumed: int | None) -> int | None:
  """Where phase 2 began in the run ``workdir`` holds, when it has begun by the step resumed
  from (``CURRICULUM_FILE``, or for a workdir without one the boundary its config.json's
  ``num_train_steps`` and ``phase2.fraction`` gave); else None."""
  if resumed is None:
    return None
  path = epath.Path(workdir) / CURRICULUM_FILE
  if path.is_file():
    start = read_json(path).get("phase2_start_step")
  else:
    recorded = epath.Path(workdir) / "config.json"
    if not recorded.is_file():
      return None
    old = read_json(recorded)
    fraction = float(old.get("phase2", {}).get("fraction", 0))
    total = int(old.get("num_train_steps", 0))
    start = total - int(round(fraction * total)) if 0 < fraction < 1 else None
  return int(start) if start is not None and resumed >= int(start) else None


def learning_rate_schedule(config, boundary: int | None = None):
  """Phase 1's warmup + linear decay over the whole run; phase 2 (from ``boundary``, default
  ``phase_boundary(config)``) continues it, or (with phase2.learning_rate >= 0) restarts with
  its own warmup and decay to 0 at the end."""
  kind = config.optimizer.schedule
  s1 = optimizers.warmup_linear_decay(
    config.learning_rate, config.num_warmup_steps, config.num_train_steps, kind
  )
  boundary = phase_boundary(config) if boundary is None else boundary
  if boundary >= config.num_train_steps or config.phase2.learning_rate < 0:
    return s1
  s2 = optimizers.warmup_linear_decay(
    config.phase2.learning_rate,
    config.phase2.num_warmup_steps,
    config.num_train_steps - boundary,
    kind,
  )
  return optimizers.join_schedules([s1, s2], [boundary])


def bert_config_from(config, vocab_size: int, mesh=None) -> BertConfig:
  """The run's encoder: the preset (or bert_config_file) made the run's by
  ``bert_jax.model.run_settings.run_bert_config`` (dtype, remat, dropout rates, the attention
  kernel resolved for the platform of ``mesh``, or of the default devices without one, at every
  phase's length), left-to-right for the ``ltr`` objective."""
  if config.bert_config_file:
    bert = BertConfig.from_dict(read_json(config.bert_config_file), source=config.bert_config_file)
    if bert.vocab_size != vocab_size:
      raise ValueError(
        f"{config.bert_config_file}: vocab_size {bert.vocab_size} differs from "
        f"the tokenizer's {vocab_size} (config.vocab_file)"
      )
  else:
    bert = BertConfig.from_preset(config.model_preset, vocab_size=vocab_size)
  if bert.is_decoder and config.objective != "ltr":
    raise ValueError(
      f"{config.bert_config_file}: is_decoder=true (left-to-right attention) but "
      f"config.objective={config.objective!r} needs bidirectional attention; set "
      "config.objective='ltr' or use a bidirectional model config"
    )
  longest = max(length for length, _ in run_lengths(config))
  if longest > bert.max_position_embeddings:
    raise ValueError(
      f"config.max_seq_length/phase2.max_seq_length {longest} exceeds the "
      f"model's max_position_embeddings {bert.max_position_embeddings}"
    )
  return run_bert_config(
    bert, config, platform=platform_of(mesh), is_decoder=config.objective == "ltr"
  )


def _check_workdir_model(workdir: str, bert: BertConfig) -> None:
  trainer.check_same_model(epath.Path(workdir) / "model_config.json", bert.to_dict())


def _run_files_writer(config, bert, sources: DataSources, boundary: int, resumed: int | None):
  def write(workdir: str) -> None:
    write_json(os.path.join(workdir, "config.json"), json.loads(config.to_json_best_effort()))
    if boundary < config.num_train_steps:
      write_json(os.path.join(workdir, CURRICULUM_FILE), {"phase2_start_step": boundary})
    write_json(os.path.join(workdir, "model_config.json"), bert.to_dict())
    head = {"task": "pretraining", "objective": config.objective}
    if config.objective == "mlm_nsp":
      head.update(num_labels=2, labels=["IsNext", "NotNext"])
    write_json(os.path.join(workdir, "head.json"), head)
    kept = resumed is not None and os.path.exists(os.path.join(workdir, "tokenizer_config.json"))
    if sources.tokenizer is not None and not kept:  # a resumed run's stays as it was trained
      sources.tokenizer.save(workdir)

  return write


def _validate(config, mesh) -> None:
  """The pre-training checks of ``config`` beyond ``check_run_config``'s (which the trainer and
  ``bert_jax.compile`` run first); with ``mesh`` (a run's), the attention kernel it resolves to."""
  check_objective(config.objective)
  mask_rates(config)
  check_row_sizes(config)
  if config.save_checkpoints_steps <= 0:
    raise ValueError(
      f"config.save_checkpoints_steps must be positive, got {config.save_checkpoints_steps}"
    )
  if mesh is not None:
    run_attention_kernel(  # the kernel's refusal, before any data is prepared
      config,
      platform=platform_of(mesh),
      attention_dropout=float(config.attention_probs_dropout_prob),
    )


def batch_spec(
  batch: int, seq_len: int, predictions: int, objective: str = "mlm_nsp", sequences: int = 0
) -> dict[str, jax.ShapeDtypeStruct]:
  """One global pre-training batch: google-research/bert's TFRecord features that
  ``objective`` reads (all of them for mlm_nsp); ``sequences > 0``: packed rows of up to that
  many sequences (``bert_jax.data.packing``'s features)."""
  i32 = np.int32
  if sequences:
    spec = {
      k: jax.ShapeDtypeStruct((batch, seq_len), i32)
      for k in ("input_ids", "input_mask", "segment_ids", "position_ids", "sequence_ids")
    }
    spec.update(
      masked_lm_positions=jax.ShapeDtypeStruct((batch, predictions), i32),
      masked_lm_ids=jax.ShapeDtypeStruct((batch, predictions), i32),
      masked_lm_weights=jax.ShapeDtypeStruct((batch, predictions), np.float32),
      cls_positions=jax.ShapeDtypeStruct((batch, sequences), i32),
      next_sentence_labels=jax.ShapeDtypeStruct((batch, sequences), i32),
      sequence_weights=jax.ShapeDtypeStruct((batch, sequences), np.float32),
    )
    return {k: spec[k] for k in batch_keys(objective, packed=True)}
  spec = {
    "input_ids": jax.ShapeDtypeStruct((batch, seq_len), i32),
    "input_mask": jax.ShapeDtypeStruct((batch, seq_len), i32),
    "segment_ids": jax.ShapeDtypeStruct((batch, seq_len), i32),
    "masked_lm_positions": jax.ShapeDtypeStruct((batch, predictions), i32),
    "masked_lm_ids": jax.ShapeDtypeStruct((batch, predictions), i32),
    "masked_lm_weights": jax.ShapeDtypeStruct((batch, predictions), np.float32),
    "next_sentence_labels": jax.ShapeDtypeStruct((batch,), i32),
  }
  return {k: spec[k] for k in batch_keys(objective)}


def build_pretraining_job(config, workdir: str | None = None, mesh=None) -> Job:
  """The pre-training ``Job``; with ``workdir=None``, abstract (no data read, nothing written)."""
  abstract = workdir is None
  _validate(config, None if abstract else mesh)
  resumed = None if abstract else latest_checkpoint_step(workdir)
  if abstract:
    sources = abstract_sources(config)
  else:
    if resumed is None and config.init_checkpoint:
      check_init_checkpoint_model(config)  # before any corpus work
    # A resumed run reads its data with the vocabulary its checkpoint was trained with.
    vocab = os.path.join(workdir, "vocab.txt")
    sources = resolve_data(
      config, workdir, vocab if resumed is not None and os.path.exists(vocab) else ""
    )
  vocab_size = sources.vocab_size
  if abstract and config.bert_config_file:
    vocab_size = int(read_json(config.bert_config_file)["vocab_size"])
  bert = bert_config_from(config, vocab_size, mesh)
  if not abstract:
    _check_workdir_model(workdir, bert)
  objective = config.objective
  model = BertForPreTraining(bert, next_sentence=objective == "mlm_nsp")
  p0 = sources.phases[0]

  def init_params(rng):
    ids = jnp.zeros((1, p0.max_seq_length), jnp.int32)
    preds = None if objective == "ltr" else jnp.zeros((1, p0.max_predictions_per_seq), jnp.int32)
    return model.init(rng, ids, ids, ids, preds)["params"]

  boundary = phase_boundary(config, None if abstract else kept_phase_boundary(workdir, resumed))
  shares = [TokenShare(f"seq{d.max_seq_length}", d.packed) for d in sources.phases]
  settings = [(config.train_batch_size, config.grad_accum_steps, boundary)]
  if boundary < config.num_train_steps:
    settings.append(
      (config.phase2.train_batch_size, config.phase2.grad_accum_steps, config.num_train_steps)
    )
  phases = [
    Phase(
      name=f"seq{data.max_seq_length}",
      end_step=end,
      global_batch_size=batch,
      seq_len=data.max_seq_length,
      batch_spec=batch_spec(
        batch, data.max_seq_length, data.row_predictions, objective, data.max_sequences_per_row
      ),
      grad_accum_steps=accum,
      flops_per_example=flops_lib.train_flops_per_example(
        bert,
        data.max_seq_length,
        data.max_seq_length if objective == "ltr" else data.row_predictions,
      ),
      make_input=None
      if abstract
      else input_factory(config, sources, data, parallel.host_batch_size(batch), share),
    )
    for data, (batch, accum, end), share in zip(sources.phases, settings, shares)
  ]
  last = sources.phases[-1]
  program = Program(
    init_params=init_params,
    loss_fn=make_pretraining_loss(model, objective),
    schedule=learning_rate_schedule(config, boundary),
    phases=phases,
    eval_step=make_pretraining_eval(model, objective),
    eval_batch_spec=batch_spec(
      config.eval_batch_size, last.max_seq_length, last.max_predictions_per_seq, objective
    ),
  )
  hooks = RunHooks(
    eval_every_steps=int(config.eval_every_steps),
    save_every_steps=int(config.save_checkpoints_steps),
  )
  if not abstract:
    hooks.write_run_files = _run_files_writer(config, bert, sources, boundary, resumed)
    hooks.finish = _token_share_report(shares)
    if config.synthetic_data or any(d.eval_input_files for d in sources.phases):
      hooks.evaluate = _evaluator(config, sources, phases, mesh)
  return Job(
    name="pretraining",
    program=program,
    pretrained=Pretrained(
      checkpoint=config.init_checkpoint,
      params=(lambda: load_pretrained(config.init_checkpoint).params)
      if config.init_checkpoint
      else None,
    ),
    hooks=hooks,
    describe=(
      f"Pre-training {config.model_preset} ({objective}): {bert.num_hidden_layers} layers, "
      f"hidden {bert.hidden_size}, vocab {bert.vocab_size}"
    ),
    settings=RunSettings.from_config(config),
  )


def _token_share_report(shares: list[TokenShare]):
  """``RunHooks.finish``: logs each phase's real-token share of the training rows this process
  delivered and returns them for summary.json as ``input_token_share`` (per phase name)."""

  def finish(ctx) -> dict[str, Any]:
    del ctx
    for share in shares:
      if share.rows:
        share.log()
    return {"input_token_share": {s.name: s.summary() for s in shares if s.rows}}

  return finish


def _evaluator(config, sources: DataSources, phases, mesh):
  """Held-out MLM/NSP loss and accuracy at the phase of the step evaluated."""
  rules = parallel.normalize_rules(config.logical_axis_rules)
  host_batch = parallel.host_batch_size(config.eval_batch_size)

  def evaluate(params, step: int, jitted) -> EvalResult:
    data = sources.phases[phase_index(phases, max(step - 1, 0))]
    sums = None
    for batch in eval_batches(config, sources, data, host_batch):
      out = jitted(params, parallel.make_global_batch(batch, mesh, rules))
      sums = out if sums is None else jax.tree_util.tree_map(jnp.add, sums, out)
    metrics = summarize_eval(jax.device_get(sums)) if sums is not None else {}
    return EvalResult(metrics=metrics, record=dict(metrics))

  return evaluate


def _model_sizes(bert: BertConfig) -> dict[str, int]:
  return {k: getattr(bert, k) for k in MODEL_SIZES}


def check_init_checkpoint_model(config) -> None:
  """A one-line ValueError when ``config.init_checkpoint``'s model config (model_config.json,
  a Hugging Face config.json, bert_config.json) has other sizes than the run's model; reads
  only that file (a checkpoint of no known layout is left to the loader's own error)."""
  path = epath.Path(config.init_checkpoint)
  step = pretrained_lib.step_checkpoint(path)
  candidates = [step[0] / "model_config.json"] if step else []
  candidates += [path / name for name in ("model_config.json", "config.json", "bert_config.json")]
  candidates.append(path.parent / "bert_config.json")  # a TensorFlow checkpoint's prefix
  found = next((c for c in candidates if c.is_file()), None)
  if found is None:
    return
  try:
    theirs = _model_sizes(BertConfig.from_dict(read_json(found), source=str(found)))
  except (ValueError, TypeError, KeyError):
    return  # not a model config: the loader says what the checkpoint is
  if config.bert_config_file:
    ours = BertConfig.from_dict(read_json(config.bert_config_file), source=config.bert_config_file)
  else:
    ours = BertConfig.from_preset(config.model_preset)
  diff = {k: (a, b) for (k, a), b in zip(theirs.items(), _model_sizes(ours).values()) if a != b}
  if diff:
    shown = ", ".join(f"{k}: {a} there vs {b} in this config" for k, (a, b) in diff.items())
    raise ValueError(
      f"{found}: config.init_checkpoint holds another model ({shown}); set "
      "config.model_preset / config.bert_config_file to its sizes"
    )


def run_pretraining(config, workdir: str) -> dict[str, Any]:
  """Pre-trains (or resumes pre-training) into ``workdir``; returns the summary dict."""
  return trainer.run(
    config, workdir, build_pretraining_job, purpose="pretrain", rules=PRETRAINING_RUN
  )
