"""The BERT encoder in Flax linen (Devlin et al. 2019, as in google-research/bert).

Shapes use suffixes: B batch, L length, D hidden, H heads, K head dim, F intermediate (mlp),
V vocab, P masked positions. Every parameter carries logical axis names from the vocabulary
(vocab, embed, mlp, heads, kv) so that partitioning rules can map them onto a device mesh.
The module knows nothing of data, training or files.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model.config import BertConfig
from bert_jax.model.kernels import matmul
from bert_jax.model.kernels.attention import AttentionMask, fused_attention, kernel_traits
from bert_jax.model.kernels.dropout import Dropout
from bert_jax.model.kernels.layer_norm import layer_norm as layer_norm_kernel
from bert_jax.model.kernels.softmax import masked_softmax_as

Array = jax.Array


def activation(name: str):
  if name == "gelu":
    return functools.partial(jax.nn.gelu, approximate=False)
  if name in ("gelu_new", "gelu_pytorch_tanh"):
    return functools.partial(jax.nn.gelu, approximate=True)
  if name == "relu":
    return jax.nn.relu
  raise ValueError(f"unknown activation {name!r}")


def kernel_init(config: BertConfig, axes: tuple[str | None, ...], initializer=None):
  """BERT's truncated normal (std ``initializer_range`` before truncation), or ``initializer``."""
  return nn.with_logical_partitioning(
    initializer or nn.initializers.truncated_normal(config.initializer_range), axes
  )


def bias_init(axes: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def layer_norm(config: BertConfig, name: str) -> nn.Module:
  """LayerNorm over the hidden axis, its variance the mean of squared deviations (as BERT)."""
  scale_init = nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",))
  return layer_norm_kernel(
    config.layer_norm_eps, config.dtype, config.param_dtype, scale_init, bias_init(("embed",)), name
  )


def dense(config: BertConfig, features: int, axes, name: str, initializer=None) -> Dense:
  """A dense layer over the last axis whose kernel has logical ``axes`` (bias: the last one)."""
  return Dense(config, features, tuple(axes), initializer, name=name)


class Dense(nn.Module):
  """``x @ kernel + bias`` over the last axis, with ``nn.DenseGeneral``'s parameters (names,
  shapes, initialisation, the compute dtype's casts) and the same float32 ops; in bfloat16 the
  product and the bias's gradient take :mod:`bert_jax.model.kernels.matmul`'s CPU forms."""

  config: BertConfig
  features: int
  kernel_axes: tuple[str | None, ...]
  initializer: Any = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c = self.config
    kernel = self.param(
      "kernel",
      kernel_init(c, self.kernel_axes, self.initializer),
      (x.shape[-1], self.features),
      c.param_dtype,
    )
    bias = self.param("bias", bias_init(self.kernel_axes[-1:]), (self.features,), c.param_dtype)
    rows = "abcdefgh"[: x.ndim - 1]
    y = matmul.einsum(f"{rows}y,yz->{rows}z", x, kernel, c.dtype)
    return matmul.add_bias(y, bias)


class Embeddings(nn.Module):
  """Word + learned position + token-type embeddings, then LayerNorm and dropout."""

  config: BertConfig

  def setup(self):
    c = self.config
    embed = functools.partial(
      nn.Embed, features=c.hidden_size, dtype=c.dtype, param_dtype=c.param_dtype
    )
    self.word_embeddings = embed(c.vocab_size, embedding_init=kernel_init(c, ("vocab", "embed")))
    self.position_embeddings = embed(
      c.max_position_embeddings, embedding_init=kernel_init(c, (None, "embed"))
    )
    self.token_type_embeddings = embed(
      c.type_vocab_size, embedding_init=kernel_init(c, (None, "embed"))
    )
    self.LayerNorm = layer_norm(c, "LayerNorm")
    self.dropout = Dropout(c.hidden_dropout_prob)

  def __call__(
    self, input_ids_BxL, segment_ids_BxL, deterministic: bool, position_ids_BxL=None
  ) -> Array:
    """``position_ids_BxL``: each token's position (restarting per packed sequence); by default
    the row's positions 0..L-1."""
    length = input_ids_BxL.shape[-1]
    if length > self.config.max_position_embeddings:
      raise ValueError(
        f"sequence length {length} exceeds max_position_embeddings "
        f"{self.config.max_position_embeddings}"
      )
    # Looked up in the tables' own dtype (float32) and summed there, normalised by the LayerNorm
    # (which computes in float32 and returns the compute dtype): the gradient of
    # a lookup is a scatter-add into its table, and into a bfloat16 table (flax's Embed casts the
    # table first) XLA:GPU adds element by element in compare-and-swap loops, a third of a
    # BERT-base step (benchmarks/results/model_numerics.md). Token types (2 rows, which every
    # token hits): a one-hot product, as google-research/bert computes them, whose gradient is
    # a matmul instead of a scatter into two rows. Positions: a slice (packed rows: a lookup).
    words_BxLxD = jnp.take(self.word_embeddings.embedding, input_ids_BxL, axis=0)
    if position_ids_BxL is None:
      positions_xLxD = self.position_embeddings.embedding[None, :length]
    else:
      positions_xLxD = jnp.take(self.position_embeddings.embedding, position_ids_BxL, axis=0)
    table_TxD = self.token_type_embeddings.embedding
    types_BxLxT = jax.nn.one_hot(segment_ids_BxL, table_TxD.shape[0], dtype=table_TxD.dtype)
    types_BxLxD = jnp.einsum(
      "blt,td->bld", types_BxLxT, table_TxD, precision=jax.lax.Precision.HIGHEST
    )  # exact: each row times 1.0 (GPUs would round a float32 dot to TF32 by default)
    x_BxLxD = words_BxLxD + positions_xLxD + types_BxLxD
    x_BxLxD = self.LayerNorm(x_BxLxD)
    x_BxLxD = self.dropout(x_BxLxD, deterministic=deterministic)
    return nn.with_logical_constraint(x_BxLxD, ("batch", "length", "embed"))

  def attend(self, h_xD: Array) -> Array:
    """Logits against the (tied) word embedding table: the MLM decoder (``Embed.attend``'s
    product, the same values, in :mod:`bert_jax.model.kernels.matmul`'s form)."""
    return matmul.tied_logits(h_xD, self.word_embeddings.embedding, self.config.dtype)


class Projection(nn.Module):
  """``y = einsum(equation, x, kernel) + bias`` with a kernel of a fixed, logically named shape.

  DenseGeneral keeps a flat kernel internally and cannot take its 3-d logical constraint under a
  global mesh; the attention projections (D -> HxK and HxK -> D) are written out instead, with
  the same parameter names and shapes (``kernel``, ``bias``).
  """

  config: BertConfig
  equation: str
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str | None, ...]
  bias_ndim: int

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c = self.config
    kernel = self.param(
      "kernel", kernel_init(c, self.kernel_axes), self.kernel_shape, c.param_dtype
    )
    bias = self.param(
      "bias",
      bias_init(self.kernel_axes[-self.bias_ndim :]),
      self.kernel_shape[-self.bias_ndim :],
      c.param_dtype,
    )
    return matmul.add_bias(matmul.einsum(self.equation, x, kernel, c.dtype), bias)


class SelfAttention(nn.Module):
  """Multi-head self-attention under an :class:`AttentionMask`.

  Queries come from ``xq_BxQxD`` and keys/values from ``x_BxLxD``: the same array in a normal
  layer, or only the rows at a few positions (Q < L) when only those rows' outputs are needed.
  ``softmax(q k^T / sqrt(K)) v`` is computed by ``config.attention_kernel``: here for the
  reference path (softmax in float32, ``masked_softmax_as``, then dropout), else by a fused
  kernel of :mod:`bert_jax.model.kernels.attention`.
  """

  config: BertConfig

  @nn.compact
  def __call__(self, xq_BxQxD, x_BxLxD, mask, deterministic: bool) -> Array:
    """``mask``: an :class:`AttentionMask`, or its dense form (boolean, Bx1xMxL, M 1 or Q)."""
    c = self.config
    h, k = c.num_attention_heads, c.head_dim
    qkv = functools.partial(
      Projection, c, "bld,dhk->blhk", (c.hidden_size, h, k), ("embed", "heads", "kv"), 2
    )
    q_BxQxHxK = qkv(name="query")(xq_BxQxD)
    k_BxLxHxK = qkv(name="key")(x_BxLxD)
    v_BxLxHxK = qkv(name="value")(x_BxLxD)
    q_BxQxHxK = nn.with_logical_constraint(q_BxQxHxK, ("batch", "length", "heads", "kv"))
    if not kernel_traits(c.attention_kernel).fused:
      ctx_BxQxHxK = self.reference(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, mask, deterministic)
    else:
      ctx_BxQxHxK = fused_attention(c.attention_kernel, q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, mask)
    ctx_BxQxHxK = nn.with_logical_constraint(ctx_BxQxHxK, ("batch", "length", "heads", "kv"))
    return Projection(
      c, "blhk,hkd->bld", (h, k, c.hidden_size), ("heads", "kv", "embed"), 1, name="output"
    )(ctx_BxQxHxK)

  def reference(self, q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, mask: AttentionMask, deterministic):
    c = self.config
    q_BxQxHxK = q_BxQxHxK / jnp.sqrt(c.head_dim).astype(q_BxQxHxK.dtype)
    s_BxHxQxL = jnp.einsum(
      "bqhk,bshk->bhqs", q_BxQxHxK, k_BxLxHxK, preferred_element_type=jnp.float32
    )
    mask_Bx1xMxL = mask.dense() if isinstance(mask, AttentionMask) else mask
    p_BxHxQxL = masked_softmax_as(s_BxHxQxL, mask_Bx1xMxL, c.dtype)
    # In low precision (accelerators, where memory per chip decides the batch) the backward pass
    # keeps only p: the dropout mask is redrawn and p·v's dropped input recomputed.
    low_precision = jnp.dtype(c.dtype) != jnp.float32
    return Dropout(c.attention_probs_dropout_prob, recompute=low_precision)(
      p_BxHxQxL,
      deterministic=deterministic,
      then=lambda p_BxHxQxL, v_BxLxHxK: jnp.einsum("bhqs,bshk->bqhk", p_BxHxQxL, v_BxLxHxK),
      operands=(v_BxLxHxK,),
    )


def gather_positions(x_BxLxD: Array, positions_BxP: Array) -> Array:
  """x at the given positions of each row: BxLxD, BxP -> BxPxD (as the original gathers)."""
  return jnp.take_along_axis(x_BxLxD, positions_BxP[..., None].astype(jnp.int32), axis=1)


class TransformerLayer(nn.Module):
  """A post-LayerNorm encoder layer: attention, add & norm, gelu MLP, add & norm.

  With ``positions_BxP`` the layer computes its output only at those positions (BxPxD): keys
  and values still come from every position, so those rows equal the full layer's rows.
  """

  config: BertConfig

  @nn.compact
  def __call__(self, x_BxLxD, mask: AttentionMask, deterministic: bool, positions_BxP=None):
    c = self.config
    drop = Dropout(c.hidden_dropout_prob)
    xq_BxQxD = x_BxLxD
    if positions_BxP is not None:
      xq_BxQxD, mask = gather_positions(x_BxLxD, positions_BxP), mask.at_queries(positions_BxP)
    a_BxQxD = SelfAttention(c, name="attention")(xq_BxQxD, x_BxLxD, mask, deterministic)
    y_BxQxD = layer_norm(c, "attention_LayerNorm")(
      xq_BxQxD + drop(a_BxQxD, deterministic=deterministic)
    )
    h_BxQxF = dense(c, c.intermediate_size, ("embed", "mlp"), "intermediate")(y_BxQxD)
    h_BxQxF = nn.with_logical_constraint(
      activation(c.hidden_act)(h_BxQxF), ("batch", "length", "mlp")
    )
    o_BxQxD = dense(c, c.hidden_size, ("mlp", "embed"), "output")(h_BxQxF)
    y_BxQxD = layer_norm(c, "output_LayerNorm")(
      y_BxQxD + drop(o_BxQxD, deterministic=deterministic)
    )
    return nn.with_logical_constraint(y_BxQxD, ("batch", "length", "embed"))


class BertEncoder(nn.Module):
  """Embeddings, the layer stack and the tanh pooler on [CLS].

  Attention is bidirectional (BERT), or left-to-right with ``config.is_decoder`` (each position
  sees itself and the positions before it).

  Returns a dict: ``sequence_output`` (BxLxD), ``pooled_output`` (BxD) and, when asked,
  ``hidden_states``: a tuple of num_hidden_layers + 1 arrays (embedding output, then each layer).

  ``output_positions_BxP`` (pre-training, where only the masked positions and [CLS] are read):
  the last layer is computed only at [CLS] and those positions, and ``sequence_output`` is
  replaced by ``gathered_output`` (BxPxD, the rows at ``output_positions_BxP``), equal to
  ``gather_positions(sequence_output, output_positions_BxP)`` of the full computation. At
  BERT-base and seq 128 with 20 predictions this skips ~6% of the encoder's FLOPs. Not
  combinable with ``output_hidden_states``. (With the splash kernel, which takes whole rows as
  queries, the last layer is computed in full and the rows gathered: the same values.)

  Packed rows (several sequences per row, Krell et al. 2021): ``sequence_ids_BxL`` (0 on
  padding, 1..S the sequence of each token) confines attention to each sequence (and causal
  attention to the sequence's earlier tokens), ``position_ids_BxL`` restarts positions per
  sequence, and ``cls_positions_BxS`` (each sequence's [CLS]) makes ``pooled_output`` BxSxD, one
  per sequence. A sequence's outputs are then those of the sequence alone in a row.
  """

  config: BertConfig

  def setup(self):
    c = self.config
    self.embeddings = Embeddings(c)
    layer_cls = nn.remat(TransformerLayer, static_argnums=(3,)) if c.remat else TransformerLayer
    self.layers = [layer_cls(c, name=f"layer_{i}") for i in range(c.num_hidden_layers)]
    self.pooler = dense(c, c.hidden_size, ("embed", None), "pooler")

  def __call__(
    self,
    input_ids_BxL,
    input_mask_BxL=None,
    segment_ids_BxL=None,
    deterministic: bool = True,
    output_hidden_states: bool = False,
    output_positions_BxP=None,
    *,
    position_ids_BxL=None,
    sequence_ids_BxL=None,
    cls_positions_BxS=None,
  ) -> dict[str, Any]:
    c = self.config
    if output_positions_BxP is not None and output_hidden_states:
      raise ValueError(
        "output_positions_BxP and output_hidden_states are exclusive: hidden "
        "states need the last layer at every position"
      )
    if input_mask_BxL is None:
      input_mask_BxL = jnp.ones_like(input_ids_BxL)
    if segment_ids_BxL is None:
      segment_ids_BxL = jnp.zeros_like(input_ids_BxL)
    mask = AttentionMask(input_mask_BxL > 0, sequence_ids_BxL, causal=c.is_decoder)
    x_BxLxD = self.embeddings(input_ids_BxL, segment_ids_BxL, deterministic, position_ids_BxL)
    hidden = [x_BxLxD]
    for layer in self.layers[:-1]:
      x_BxLxD = layer(x_BxLxD, mask, deterministic)
      hidden.append(x_BxLxD)
    # C: the [CLS] rows the pooler reads, 1 (position 0) or S (packed sequences).
    cls_BxC = cls_positions_BxS
    if cls_BxC is None:
      cls_BxC = jnp.zeros(input_ids_BxL.shape[:1] + (1,), jnp.int32)
    n_cls = cls_BxC.shape[1]
    if output_positions_BxP is None:
      x_BxLxD = self.layers[-1](x_BxLxD, mask, deterministic)
      hidden.append(x_BxLxD)
      out = {"sequence_output": x_BxLxD}
      cls_BxCxD = (
        x_BxLxD[:, :1] if cls_positions_BxS is None else gather_positions(x_BxLxD, cls_BxC)
      )
    else:  # the [CLS] rows first, for the pooler
      positions_BxCpP = jnp.concatenate(
        [cls_BxC.astype(jnp.int32), output_positions_BxP.astype(jnp.int32)], 1
      )
      if kernel_traits(c.attention_kernel).whole_row_queries:
        x_BxLxD = self.layers[-1](x_BxLxD, mask, deterministic)
        x_BxCpPxD = gather_positions(x_BxLxD, positions_BxCpP)
      else:
        x_BxCpPxD = self.layers[-1](x_BxLxD, mask, deterministic, positions_BxCpP)
      out = {"gathered_output": x_BxCpPxD[:, n_cls:]}
      cls_BxCxD = x_BxCpPxD[:, :n_cls]
    # BxSxD for packed rows, BxD (the [CLS] at 0) otherwise
    cls_xD = cls_BxCxD if cls_positions_BxS is not None else cls_BxCxD[:, 0]
    out["pooled_output"] = jnp.tanh(self.pooler(cls_xD))
    if output_hidden_states:
      out["hidden_states"] = tuple(hidden)
    return out

  def attend(self, h_xD: Array) -> Array:
    return self.embeddings.attend(h_xD)
