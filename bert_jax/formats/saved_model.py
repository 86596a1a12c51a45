"""Export a bert_jax model as a TensorFlow SavedModel through ``jax.experimental.jax2tf``.

The SavedModel has one serving signature, ``serving_default``, taking ``input_ids``,
``input_mask`` and ``segment_ids`` (int32 [batch, length]; [batch, choices, length] for
multiple choice) with batch, length (and choices) all polymorphic: one SavedModel serves any
batch size and any length up to ``max_position_embeddings``. Its outputs depend on the head:

======================== =================================================================
encoder                  sequence_output [B, L, D], pooled_output [B, D]
pretraining              + mlm_logits [B, L, V] (every position), nsp_logits [B, 2]
sequence_classification  + logits [B, num_labels]
token_classification     + logits [B, L, num_labels]
question_answering       + start_logits, end_logits [B, L]
multiple_choice          logits [B, C] (+ sequence/pooled outputs per choice, [B*C, ...])
======================== =================================================================

A pre-training export has a second signature, ``masked_lm``: the same inputs plus
``masked_lm_positions`` (int32 [batch, predictions], polymorphic), returning ``mlm_logits``
[B, P, V] at those positions only (as pre-training computes them; far cheaper than at every
position for a large vocabulary) and ``nsp_logits``.

The weights are TensorFlow variables (not constants folded into the graph), so the SavedModel
is about the size of the checkpoint. ``model_config.json``, ``head.json`` and the tokenizer
files go to ``<out>/assets.extra/`` for the serving side's pre-processing.

  export_saved_model(out_dir, params, config, task="sequence_classification", num_labels=3)
  tf.saved_model.load(out_dir).signatures["serving_default"](input_ids=..., input_mask=...,
                                                             segment_ids=...)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from bert_jax import model as models
from bert_jax.checkpoint import ensure_replaceable, replace_dir
from bert_jax.formats.heads import model_for_task, write_model_files
from bert_jax.model.config import BertConfig

INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")
SIGNATURE = "serving_default"
MASKED_LM_SIGNATURE = "masked_lm"  # pre-training exports only
MASKED_LM_POSITIONS = "masked_lm_positions"
# What each head's serving signature returns (besides sequence_output and pooled_output).
HEAD_OUTPUTS = {
  "encoder": (),
  "pretraining": ("mlm_logits", "nsp_logits"),
  "sequence_classification": ("logits",),
  "token_classification": ("logits",),
  "question_answering": ("start_logits", "end_logits"),
  "multiple_choice": ("logits",),
}


def serving_fn(
  config: BertConfig, task: str, num_labels: int | None = None
) -> Callable[..., dict[str, jax.Array]]:
  """``f(params, input_ids, input_mask, segment_ids) -> dict`` in inference mode (no dropout).

  ``params`` are those of the task's model (for "encoder": with the encoder under "bert").
  """
  module = model_for_task(config, task, num_labels)
  keys = ("sequence_output", "pooled_output") + HEAD_OUTPUTS[task]

  def f(params, input_ids, input_mask, segment_ids):
    variables = {"params": params["bert"] if task == "encoder" else params}
    out = module.apply(variables, input_ids, input_mask, segment_ids, deterministic=True)
    return {k: out[k] for k in keys}

  return f


def masked_lm_fn(config: BertConfig) -> Callable[..., dict[str, jax.Array]]:
  """``f(params, input_ids, input_mask, segment_ids, masked_lm_positions)``: MLM logits only at
  the given positions (BxPxV, as pre-training computes them) and NSP logits."""
  module = models.BertForPreTraining(config)

  def f(params, input_ids, input_mask, segment_ids, masked_lm_positions):
    out = module.apply(
      {"params": params},
      input_ids,
      input_mask,
      segment_ids,
      masked_lm_positions=masked_lm_positions,
      deterministic=True,
    )
    return {"mlm_logits": out["mlm_logits"], "nsp_logits": out["nsp_logits"]}

  return f


def polymorphic_spec(task: str) -> str:
  return "(b, c, l)" if task == "multiple_choice" else "(b, l)"


def export_saved_model(
  out_dir: str,
  params: Mapping[str, Any],
  config: BertConfig,
  task: str,
  num_labels: int | None = None,
  tokenizer=None,
  head: Mapping[str, Any] | None = None,
  overwrite: bool = False,
) -> str:
  """Writes a SavedModel of ``task``'s model with ``params`` to ``out_dir``; returns it.

  Written whole or not at all (``replace_dir``): a failure leaves no half-written export, a
  non-empty ``out_dir`` is refused unless ``overwrite`` and then replaced as a whole.
  """
  import tensorflow as tf  # noqa: PLC0415 (heavy; only here)
  from jax.experimental import jax2tf  # noqa: PLC0415 (imports TensorFlow)

  ensure_replaceable(out_dir, overwrite)  # before the (slow) conversion; replace_dir checks again
  params = jax.tree_util.tree_map(np.asarray, dict(params))
  fn = serving_fn(config, task, num_labels)
  spec = polymorphic_spec(task)
  tf_fn = jax2tf.convert(
    fn,
    with_gradient=False,
    polymorphic_shapes=[None, spec, spec, spec],
    polymorphic_constraints=[f"l <= {config.max_position_embeddings}"],
  )
  module = tf.Module()
  module.params = tf.nest.map_structure(lambda x: tf.Variable(x, trainable=False), params)
  rank = 3 if task == "multiple_choice" else 2
  specs = [tf.TensorSpec([None] * rank, tf.int32, name=k) for k in INPUT_KEYS]

  @tf.function(autograph=False, input_signature=specs)
  def serve(input_ids, input_mask, segment_ids):
    return tf_fn(module.params, input_ids, input_mask, segment_ids)

  module.serve = serve
  signatures = {SIGNATURE: serve}
  if task == "pretraining":
    mlm_fn = jax2tf.convert(
      masked_lm_fn(config),
      with_gradient=False,
      polymorphic_shapes=[None, spec, spec, spec, "(b, p)"],
      polymorphic_constraints=[f"l <= {config.max_position_embeddings}"],
    )
    positions = tf.TensorSpec([None, None], tf.int32, name=MASKED_LM_POSITIONS)

    @tf.function(autograph=False, input_signature=specs + [positions])
    def serve_masked_lm(input_ids, input_mask, segment_ids, masked_lm_positions):
      return mlm_fn(module.params, input_ids, input_mask, segment_ids, masked_lm_positions)

    module.serve_masked_lm = serve_masked_lm
    signatures[MASKED_LM_SIGNATURE] = serve_masked_lm
  with replace_dir(out_dir, overwrite) as tmp:
    tf.saved_model.save(module, tmp, signatures=signatures)
    write_model_files(
      os.path.join(tmp, "assets.extra"),
      config,
      head or {"task": task, "num_labels": num_labels, "labels": []},
      tokenizer,
    )
  return out_dir
