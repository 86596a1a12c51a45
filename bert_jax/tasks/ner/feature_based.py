"""The feature-based approach (paper section 5.4): frozen BERT features feeding a BiLSTM tagger.

BERT runs without dropout and without gradient (``jax.lax.stop_gradient``); only the two-layer
bidirectional LSTM (flax ``nn.Bidirectional`` of ``nn.RNN(nn.LSTMCell)``) and the linear
classifier above it are trained — ``trainable`` tells the runner to leave everything under
params["bert"] untouched (no update, no weight decay). The features, as in Table 7:

  ``layer``             one hidden layer: ``feature_layer`` indexes the ``num_hidden_layers + 1``
                        hidden states (0 = embeddings, -1 = last layer, -2 = second-to-last)
  ``sum_last_four``     the sum of the last four hidden layers
  ``concat_last_four``  their concatenation (4 x hidden_size features)
  ``sum_all``           the sum of all layers' outputs (embeddings excluded)
  ``scalar_mix``        ELMo's learned mix (``bert_jax.model.scalar_mix``, Peters et al. 2018
                        eq. 1) over all ``num_hidden_layers + 1`` hidden states, the embeddings
                        included: ``gamma * sum_k softmax(w)_k h_k``; ``w`` and ``gamma``
                        (params["scalar_mix"]) train with the BiLSTM, the encoder stays frozen.
                        ``param_report`` gives the learned weights and their centre of gravity.

Config keys (configs/ner_feature_based.py): those of NER plus ``feature_mode``,
``feature_layer``, ``lstm_hidden_size`` (paper: 768 per direction) and ``lstm_num_layers``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import BertConfig, BertEncoder
from bert_jax.model import scalar_mix as scalar_mix_lib
from bert_jax.tasks.ner.task import NerTask

FEATURE_MODES = ("layer", "sum_last_four", "concat_last_four", "sum_all", "scalar_mix")


def select_features(hidden_states, mode: str, layer: int = -1) -> jax.Array:
  """BxLxF features from the tuple of (num_layers + 1) BxLxD hidden states (fixed modes; the
  learned ``scalar_mix`` is a module, see ``FeatureBasedTagger``)."""
  if mode == "layer":
    return hidden_states[layer]
  if mode == "sum_last_four":
    return sum(hidden_states[-4:])
  if mode == "concat_last_four":
    return jnp.concatenate(hidden_states[-4:], axis=-1)
  if mode == "sum_all":
    return sum(hidden_states[1:])
  raise ValueError(f"feature_mode {mode!r} is not one of {FEATURE_MODES}")


class BiLstmTagger(nn.Module):
  """Stacked bidirectional LSTMs over BxLxF features (padding excluded), then a linear layer."""

  num_labels: int
  hidden_size: int = 768
  num_layers: int = 2
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, x_BxLxF, mask_BxL, deterministic: bool = True):
    lengths_B = mask_BxL.sum(-1).astype(jnp.int32)
    x = x_BxLxF.astype(jnp.float32)
    for i in range(self.num_layers):
      x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
      # Params: tagger/lstm_<i>_forward/{ii,if,ig,io,hi,...}, tagger/lstm_<i>_backward/...
      x = nn.Bidirectional(
        nn.RNN(nn.LSTMCell(self.hidden_size, name=f"lstm_{i}_forward")),
        nn.RNN(nn.LSTMCell(self.hidden_size, name=f"lstm_{i}_backward")),
      )(x, seq_lengths=lengths_B)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    return nn.Dense(self.num_labels, name="classifier")(x)


class FeatureBasedTagger(nn.Module):
  """Frozen BertEncoder (params["bert"]) -> selected features -> BiLstmTagger."""

  config: BertConfig
  num_labels: int
  feature_mode: str = "concat_last_four"
  feature_layer: int = -1
  lstm_hidden_size: int = 768
  lstm_num_layers: int = 2

  @nn.compact
  def __call__(
    self,
    input_ids,
    input_mask=None,
    segment_ids=None,
    deterministic: bool = True,
    output_hidden_states: bool = False,
  ):
    out = BertEncoder(self.config, name="bert")(
      input_ids, input_mask, segment_ids, deterministic=True, output_hidden_states=True
    )
    hidden = tuple(jax.lax.stop_gradient(h) for h in out["hidden_states"])
    if self.feature_mode == "scalar_mix":
      # Params: scalar_mix/{weights (num_hidden_layers + 1,), gamma ()}; index 0 = embeddings.
      feats_BxLxF = scalar_mix_lib.ScalarMix(name="scalar_mix")(hidden)
    else:
      feats_BxLxF = select_features(hidden, self.feature_mode, self.feature_layer)
    mask = jnp.ones_like(input_ids) if input_mask is None else input_mask
    logits = BiLstmTagger(
      self.num_labels,
      self.lstm_hidden_size,
      self.lstm_num_layers,
      self.config.hidden_dropout_prob,
      name="tagger",
    )(feats_BxLxF, mask, deterministic)
    result = {"logits": logits}
    if output_hidden_states:
      result["hidden_states"] = hidden
    return result


class FeatureBasedNerTask(NerTask):
  """NER with frozen BERT features and a trained BiLSTM (see the module docstring)."""

  name = "ner_feature_based"

  def build_model(self, bert_config: BertConfig):
    c = self.config
    if c.feature_mode not in FEATURE_MODES:
      raise ValueError(f"config.feature_mode {c.feature_mode!r} is not one of {FEATURE_MODES}")
    n = bert_config.num_hidden_layers + 1
    if c.feature_mode.endswith("last_four") and bert_config.num_hidden_layers < 4:
      raise ValueError(
        f"config.feature_mode {c.feature_mode!r} needs at least 4 layers; the "
        f"encoder has {bert_config.num_hidden_layers}"
      )
    if c.feature_mode == "layer" and not -n <= c.feature_layer < n:
      raise ValueError(
        f"config.feature_layer {c.feature_layer} is out of range for {n} hidden "
        "states (embeddings + layers)"
      )
    return FeatureBasedTagger(
      bert_config,
      self.num_labels,
      c.feature_mode,
      c.feature_layer,
      c.lstm_hidden_size,
      c.lstm_num_layers,
    )

  def trainable(self, path: tuple[str, ...]) -> bool:
    return not path or path[0] != "bert"

  def param_report(self, params) -> dict:
    """What the trained params tell beyond the metrics: in ``scalar_mix`` mode, the learned
    mix (``scalar_mix.summary``: softmax weights over embeddings + layers, index 0 the
    embeddings; gamma; the centre of gravity ``sum_k k * s_k``); otherwise nothing."""
    if self.config.feature_mode != "scalar_mix":
      return {}
    if "scalar_mix" not in params:
      raise ValueError(
        f"feature_mode 'scalar_mix' but the params have no 'scalar_mix' entry "
        f"(top-level keys: {sorted(params)})"
      )
    return {"scalar_mix": scalar_mix_lib.summary(jax.device_get(params["scalar_mix"]))}
