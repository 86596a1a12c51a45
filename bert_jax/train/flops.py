"""Model FLOPs of BERT training, and the peak FLOP/s assumed per device kind (for MFU).

Forward FLOPs of one example (a multiply-add counts 2; L tokens, D hidden, F intermediate,
V vocab, N layers, P masked positions where the MLM head runs):

  per layer:  2*L*(4*D*D)          query, key, value, output projections
            + 2*L*(2*D*F)          the feed-forward block (two matmuls)
            + 2*(2*L*L*D)          attention scores q.k and the weighted sum of values
  last layer, when P < L: the same with Q = P + 1 query rows ([CLS] and the masked positions,
              all that pre-training reads): 2*L*(2*D*D) for keys and values, 2*Q*(2*D*D)
              for query and output, 2*Q*(2*D*F), 2*(2*Q*L*D)
  pooler:     2*D*D ; NSP: 2*D*2
  MLM head:   2*P*(D*D + D*V)      transform + tied decoder, at the P positions only
              (P = L when the head runs over every position, as Hugging Face's does)

Training FLOPs = 3 x forward (the backward pass costs twice the forward). Rematerialisation's
extra forward is not counted: this is *model* FLOPs utilisation, MFU = achieved model FLOP/s /
(peak FLOP/s per device x devices). Embedding lookups, softmax, LayerNorm, gelu are ignored.
"""

from __future__ import annotations

from bert_jax.model import BertConfig

# Dense bf16 peak FLOP/s per chip/GPU from the vendors' data sheets. Matched by substring of
# jax.Device.device_kind (first match wins). Other device kinds (CPUs) use the configured peak.
PEAK_FLOPS_BF16: tuple[tuple[str, float], ...] = (
  ("TPU v6", 918e12),  # Trillium / v6e
  ("TPU v5 lite", 197e12),  # v5e
  ("TPU v5", 459e12),  # v5p
  ("TPU v4", 275e12),
  ("TPU v3", 123e12),
  ("TPU v2", 45e12),
  ("H200", 989e12),
  ("H100", 989e12),  # SXM
  ("A100", 312e12),
  ("L4", 121e12),
  ("V100", 125e12),
)


def forward_flops_per_example(config: BertConfig, seq_len: int, num_predictions: int) -> float:
  """The formula of the module docstring, forward pass only."""
  d, f, v, n, l, p = (
    config.hidden_size,
    config.intermediate_size,
    config.vocab_size,
    config.num_hidden_layers,
    seq_len,
    num_predictions,
  )
  per_layer = 2 * l * 4 * d * d + 2 * l * 2 * d * f + 2 * 2 * l * l * d
  q = p + 1 if p < l else l
  last = 2 * l * 2 * d * d + 2 * q * 2 * d * d + 2 * q * 2 * d * f + 2 * 2 * q * l * d
  heads = 2 * d * d + 2 * d * 2 + 2 * p * (d * d + d * v)
  return float((n - 1) * per_layer + last + heads)


def encoder_train_flops_per_sequence(config: BertConfig, seq_len: int) -> float:
  """Training FLOPs of the encoder alone over one sequence of ``seq_len`` (every layer at every
  position, the pooler; a fine-tuning head's few FLOPs ignored): 3 x the per-layer forward."""
  d, f, l = config.hidden_size, config.intermediate_size, seq_len
  per_layer = 2 * l * 4 * d * d + 2 * l * 2 * d * f + 2 * 2 * l * l * d
  return 3.0 * float(config.num_hidden_layers * per_layer + 2 * d * d)


def train_flops_per_example(config: BertConfig, seq_len: int, num_predictions: int) -> float:
  return 3.0 * forward_flops_per_example(config, seq_len, num_predictions)


def peak_flops_per_device(
  device_kind: str, configured: float = 0.0, cpu_peak: float = 4e11
) -> float:
  """``configured`` when > 0, else the table's entry for ``device_kind``, else ``cpu_peak``."""
  if configured > 0:
    return float(configured)
  for name, peak in PEAK_FLOPS_BF16:
    if name.lower() in device_kind.lower():
      return peak
  return float(cpu_peak)
