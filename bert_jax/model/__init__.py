"""The Flax BERT encoder, its heads and its hyper-parameters."""

from bert_jax.model.bert import BertEncoder
from bert_jax.model.config import PRESETS, BertConfig
from bert_jax.model.heads import (
  BertForMultipleChoice,
  BertForPreTraining,
  BertForQuestionAnswering,
  BertForSequenceClassification,
  BertForTokenClassification,
  gather_positions,
)
from bert_jax.model.scalar_mix import ScalarMix

__all__ = [
  "PRESETS",
  "BertConfig",
  "BertEncoder",
  "BertForMultipleChoice",
  "BertForPreTraining",
  "BertForQuestionAnswering",
  "BertForSequenceClassification",
  "BertForTokenClassification",
  "ScalarMix",
  "gather_positions",
]
