"""BERT with its pre-training heads and the fine-tuning heads of the paper's tasks.

Every model keeps the encoder under the parameter name ``bert``, so that fine-tuning starts
from any pre-trained encoder by copying ``params["bert"]``. Head parameter names mirror the
Hugging Face classes they export to (BertForPreTraining, BertForSequenceClassification,
BertForQuestionAnswering, BertForTokenClassification, BertForMultipleChoice).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from bert_jax.model.bert import (
  BertEncoder,
  Dense,
  activation,
  dense,
  gather_positions,
  layer_norm,
)
from bert_jax.model.config import BertConfig
from bert_jax.model.kernels.dropout import Dropout
from bert_jax.model.kernels.matmul import add_vocab_bias

Array = jax.Array
HEAD_INITS = ("normal", "truncated_normal")


def head_dense(c: BertConfig, features: int, name: str, head_init: str) -> Dense:
  """A new fine-tuning head's output layer (kernel [embed, features], bias zeros).

  ``head_init`` (the fine-tuning configs' ``head_init``): "normal" draws the kernel from
  N(0, initializer_range^2) as Hugging Face does; "truncated_normal" as google-research/bert
  does (re-drawn beyond 2 standard deviations, so its std is ~0.88 x initializer_range).
  """
  if head_init not in HEAD_INITS:
    raise ValueError(f"config.head_init must be one of {HEAD_INITS}, got {head_init!r}")
  normal = nn.initializers.normal(c.initializer_range) if head_init == "normal" else None
  return dense(c, features, ("embed", None), name, initializer=normal)


class BertForPreTraining(nn.Module):
  """Encoder + masked-LM head (decoder tied to the word embeddings) + next-sentence head.

  When ``masked_lm_positions`` is given, MLM logits are computed only at those positions
  (BxPxV), as google-research/bert does, and so is the encoder's last layer (with [CLS] for
  NSP; the output then has ``gathered_output`` instead of ``sequence_output``, unless hidden
  states are asked for); otherwise MLM logits are computed at every position (BxLxV).

  ``next_sentence=False`` builds no NSP head (no ``nsp`` parameters, no ``nsp_logits``): the
  paper's "No NSP" and left-to-right ablations (Table 5). With ``config.is_decoder`` the same
  head gives next-token logits (row i predicts token i + 1), tied to the embeddings as well.
  """

  config: BertConfig
  next_sentence: bool = True

  @nn.compact
  def __call__(
    self,
    input_ids,
    input_mask=None,
    segment_ids=None,
    masked_lm_positions=None,
    deterministic: bool = True,
    output_hidden_states: bool = False,
    *,
    position_ids=None,
    sequence_ids=None,
    cls_positions=None,
  ) -> dict[str, Any]:
    """Packed rows (``BertEncoder``): ``position_ids``, ``sequence_ids`` and ``cls_positions``
    (BxS); ``nsp_logits`` is then BxSx2, one per packed sequence."""
    c = self.config
    encoder = BertEncoder(c, name="bert")
    sparse = masked_lm_positions is not None and not output_hidden_states
    out = encoder(
      input_ids,
      input_mask,
      segment_ids,
      deterministic,
      output_hidden_states,
      output_positions_BxP=masked_lm_positions if sparse else None,
      position_ids_BxL=position_ids,
      sequence_ids_BxL=sequence_ids,
      cls_positions_BxS=cls_positions,
    )
    # N: the rows MLM logits are computed for, P masked positions or all L positions.
    if sparse:
      h_BxNxD = out["gathered_output"]  # N = P
    elif masked_lm_positions is not None:
      h_BxNxD = gather_positions(out["sequence_output"], masked_lm_positions)  # N = P
    else:
      h_BxNxD = out["sequence_output"]  # N = L
    h_BxNxD = dense(c, c.hidden_size, ("embed", None), "mlm_transform")(h_BxNxD)
    h_BxNxD = layer_norm(c, "mlm_LayerNorm")(activation(c.hidden_act)(h_BxNxD))
    bias_V = self.param(
      "mlm_output_bias",
      nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
      (c.vocab_size,),
      c.param_dtype,
    )
    logits_BxNxV = add_vocab_bias(encoder.attend(h_BxNxD), bias_V.astype(c.dtype))
    out["mlm_logits"] = logits_BxNxV
    if self.next_sentence:
      out["nsp_logits"] = dense(c, 2, ("embed", None), "nsp")(out["pooled_output"])
    return out


class BertForSequenceClassification(nn.Module):
  """[CLS] pooled output -> dropout -> linear; num_labels == 1 is regression (STS-B).

  Packed rows (``BertEncoder``): ``logits`` BxSxN, one per sequence at ``cls_positions``."""

  config: BertConfig
  num_labels: int

  head_init: str = "normal"  # see head_dense

  @nn.compact
  def __call__(
    self,
    input_ids,
    input_mask=None,
    segment_ids=None,
    deterministic: bool = True,
    output_hidden_states: bool = False,
    *,
    position_ids=None,
    sequence_ids=None,
    cls_positions=None,
  ) -> dict[str, Any]:
    c = self.config
    out = BertEncoder(c, name="bert")(
      input_ids,
      input_mask,
      segment_ids,
      deterministic,
      output_hidden_states,
      position_ids_BxL=position_ids,
      sequence_ids_BxL=sequence_ids,
      cls_positions_BxS=cls_positions,
    )
    pooled = Dropout(c.hidden_dropout_prob)(out["pooled_output"], deterministic=deterministic)
    out["logits"] = head_dense(c, self.num_labels, "classifier", self.head_init)(pooled)
    return out


class BertForTokenClassification(nn.Module):
  """Per-token dropout -> linear (NER); packed rows take ``position_ids`` and ``sequence_ids``."""

  config: BertConfig
  num_labels: int

  head_init: str = "normal"  # see head_dense

  @nn.compact
  def __call__(
    self,
    input_ids,
    input_mask=None,
    segment_ids=None,
    deterministic: bool = True,
    output_hidden_states: bool = False,
    *,
    position_ids=None,
    sequence_ids=None,
  ) -> dict[str, Any]:
    c = self.config
    out = BertEncoder(c, name="bert")(
      input_ids,
      input_mask,
      segment_ids,
      deterministic,
      output_hidden_states,
      position_ids_BxL=position_ids,
      sequence_ids_BxL=sequence_ids,
    )
    seq = Dropout(c.hidden_dropout_prob)(out["sequence_output"], deterministic=deterministic)
    out["logits"] = head_dense(c, self.num_labels, "classifier", self.head_init)(seq)
    return out


class BertForQuestionAnswering(nn.Module):
  """Start and end vectors over the sequence output (SQuAD): start_logits, end_logits BxL."""

  config: BertConfig

  head_init: str = "normal"  # see head_dense

  @nn.compact
  def __call__(
    self,
    input_ids,
    input_mask=None,
    segment_ids=None,
    deterministic: bool = True,
    output_hidden_states: bool = False,
  ) -> dict[str, Any]:
    c = self.config
    out = BertEncoder(c, name="bert")(
      input_ids, input_mask, segment_ids, deterministic, output_hidden_states
    )
    logits_BxLx2 = head_dense(c, 2, "qa_outputs", self.head_init)(out["sequence_output"])
    out["start_logits"] = logits_BxLx2[..., 0]
    out["end_logits"] = logits_BxLx2[..., 1]
    return out


class BertForMultipleChoice(nn.Module):
  """Inputs BxCxL (C choices); one score per choice from the pooled output (SWAG): BxC."""

  config: BertConfig

  head_init: str = "normal"  # see head_dense

  @nn.compact
  def __call__(
    self,
    input_ids,
    input_mask=None,
    segment_ids=None,
    deterministic: bool = True,
    output_hidden_states: bool = False,
  ) -> dict[str, Any]:
    c = self.config
    b, n_choices, length = input_ids.shape
    flat = lambda x: None if x is None else x.reshape(b * n_choices, length)
    out = BertEncoder(c, name="bert")(
      flat(input_ids), flat(input_mask), flat(segment_ids), deterministic, output_hidden_states
    )
    pooled = Dropout(c.hidden_dropout_prob)(out["pooled_output"], deterministic=deterministic)
    out["logits"] = head_dense(c, 1, "classifier", self.head_init)(pooled).reshape(b, n_choices)
    return out
