"""Attention kernels behind one switch, ``BertConfig.attention_kernel``.

  reference     einsum, masked softmax in float32, dropout on the probabilities, einsum: BERT's
                computation, the only kernel with attention dropout (the paper's 0.1)
  dot_product   ``jax.nn.dot_product_attention``: cuDNN's fused attention on GPUs, XLA's
                elsewhere; no attention dropout
  splash        Pallas splash attention on TPUs (interpreted when lowered for a CPU, which tests
                use); no attention dropout; lengths a multiple of 128

Every kernel computes ``softmax(q k^T / sqrt(K) + mask) v`` under the same :class:`AttentionMask`
(padding, left-to-right, packed sequences); the reference path builds the dense boolean mask,
the fused kernels take what they accept (a mask, segment ids). What the rest of bert_jax knows
of a kernel (fused or not, its platforms, its length block, whether it narrows queries, the
custom call it compiles to, when ``auto`` picks it) is its :class:`KernelTraits` entry in
:data:`ATTENTION_KERNELS`; ``KERNELS``, ``FUSED`` and ``CHOICES`` are read from that table. The
run configs' key ``config.attention_kernel`` adds ``auto``, resolved per platform by
:func:`resolve_attention_kernel`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import struct
from jax import lax

Array = jax.Array
AUTO = "auto"  # the run configs' choice of a kernel per platform (resolve_attention_kernel)


@dataclasses.dataclass(frozen=True)
class KernelTraits:
  """What bert_jax knows of an attention kernel, in one entry of :data:`ATTENTION_KERNELS`.

  Everything that asks about a kernel reads its entry: the model's check and dispatch, the
  ``auto`` choice, the run config's rule, the planner's custom-call count (and so which kernels
  are fused). Adding a kernel is adding an entry.

  Attributes:
    name: the value of ``attention_kernel``.
    fused: one fused kernel computes the attention (no attention dropout); False for the
      reference path, which the encoder computes itself.
    compute: ``(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, mask) -> BxQxHxK`` of a fused kernel.
    platforms: the platforms it runs on ("cpu", "gpu", "tpu"); () = every platform.
    length_multiple: the sequence length must be a multiple of this (its block).
    whole_row_queries: it takes every position of a row as a query (the encoder does not
      narrow the last layer's queries to the positions read).
    custom_calls: platform -> a regex over compiled HLO matching the custom call it compiles
      to there, which XLA's cost analysis counts no FLOPs in (the planner adds them).
    auto_on: the platforms where ``auto`` may choose it; None = every platform.
    auto_rank: among the kernels ``auto`` may choose, it takes the runnable one of lowest rank.
    auto_why: the reason ``auto`` logs for choosing it, formatted with ``platform`` (upper
      case), ``length_key``, ``length`` and ``multiple``.
  """

  name: str
  fused: bool
  compute: Callable[..., Array] | None = None
  platforms: tuple[str, ...] = ()
  length_multiple: int = 1
  whole_row_queries: bool = False
  custom_calls: Mapping[str, str] = dataclasses.field(default_factory=dict)
  auto_on: tuple[str, ...] | None = ()
  auto_rank: int = 0
  auto_why: str = ""

  def runs_on(self, platform: str) -> bool:
    return not self.platforms or platform in self.platforms


def kernel_traits(name: str) -> KernelTraits:
  """The table's entry of ``name``; ValueError for a kernel it does not hold."""
  if name not in ATTENTION_KERNELS:
    raise ValueError(f"attention_kernel={name!r} is not one of {KERNELS}")
  return ATTENTION_KERNELS[name]


def check_kernel(name: str, attention_dropout: float, key: str = "attention_kernel") -> None:
  """ValueError for an unknown kernel, or a fused one asked to drop attention probabilities."""
  if name not in KERNELS:
    raise ValueError(f"{key}={name!r} is not one of {KERNELS}")
  if ATTENTION_KERNELS[name].fused and float(attention_dropout) > 0:
    raise ValueError(
      f"{key}={name!r} has no attention dropout but attention_probs_dropout_prob is "
      f"{attention_dropout}: set it to 0, or use the 'reference' kernel"
    )


def platform_of(mesh) -> str:
  """'cpu', 'gpu' or 'tpu': the platform of ``mesh``'s devices (a topology's mesh too), or of
  jax's default devices without a mesh."""
  devices = jax.devices() if mesh is None else list(np.asarray(mesh.devices).flat)
  platform = devices[0].platform.lower()
  return "gpu" if platform in ("gpu", "cuda", "rocm") else platform


def resolve_attention_kernel(
  requested: str,
  *,
  attention_dropout: float,
  platform: str,
  max_seq_length: int,
  length_key: str = "config.max_seq_length",
) -> str:
  """The kernel a run uses for ``config.attention_kernel``; one-line errors name the keys.

  ``auto``: the kernel of lowest ``auto_rank`` among those the table lets ``auto`` choose on
  ``platform`` that can run (no fused kernel while attention dropout is on; the length a
  multiple of the kernel's block): splash on a TPU (lengths a multiple of 128), cuDNN's through
  ``dot_product`` on a GPU and a TPU's other lengths, and the reference path on a CPU (where it
  is the tuned form) or with attention dropout; the choice and why is logged, once per process.
  """
  if requested not in CHOICES:
    raise ValueError(f"config.attention_kernel={requested!r} is not one of {CHOICES}")
  dropout = float(attention_dropout)
  if requested == AUTO:
    kernel, why = _auto_kernel(dropout, platform, max_seq_length, length_key)
    logging.info("config.attention_kernel='auto' resolved to %r: %s", kernel, why)
    return kernel
  traits = ATTENTION_KERNELS[requested]
  if traits.fused and dropout > 0:
    raise ValueError(
      f"config.attention_kernel={requested!r} has no attention dropout but "
      f"config.attention_probs_dropout_prob={dropout:g}: set it to 0, or use 'reference' "
      "(or 'auto', which falls back to it)"
    )
  if not traits.runs_on(platform):
    where = " and ".join(f"{p.upper()}s" for p in traits.platforms)
    others = [t.name for t in ATTENTION_KERNELS.values() if t.fused and t.runs_on(platform)]
    instead = " or ".join(repr(n) for n in others + [AUTO])
    raise ValueError(
      f"config.attention_kernel={requested!r} runs on {where} only; these devices are "
      f"{platform!r} (use {instead})"
    )
  if max_seq_length % traits.length_multiple:
    raise ValueError(
      f"config.attention_kernel={requested!r} needs {length_key} a multiple of "
      f"{traits.length_multiple}, got {max_seq_length}"
    )
  return requested


def _auto_kernel(dropout: float, platform: str, length: int, length_key: str) -> tuple[str, str]:
  """``auto``'s kernel and why (the platform, the attention dropout, the length)."""
  candidates = sorted(
    (t for t in ATTENTION_KERNELS.values() if t.auto_on is None or platform in t.auto_on),
    key=lambda t: t.auto_rank,
  )
  if dropout > 0:
    chosen = next(t for t in candidates if not t.fused)
    return chosen.name, (
      f"attention dropout (config.attention_probs_dropout_prob={dropout:g}) needs it; set it "
      "to 0 for a fused kernel"
    )
  too_long = [t for t in candidates if length % t.length_multiple]
  chosen = next(t for t in candidates if not length % t.length_multiple)
  passed = [t for t in too_long if t.auto_rank < chosen.auto_rank]
  if passed:
    return chosen.name, (
      f"{platform.upper()}, no attention dropout, but {length_key}={length} is not a multiple "
      f"of {passed[0].length_multiple} ({passed[0].name}'s block)"
    )
  return chosen.name, chosen.auto_why.format(
    platform=platform.upper(),
    length_key=length_key,
    length=length,
    multiple=chosen.length_multiple,
  )


@struct.dataclass
class AttentionMask:
  """Which keys each query sees: the padding, left-to-right order, packed sequences.

  ``key_valid_BxL``: real tokens. ``sequence_ids_BxL`` (packing): 0 on padding, 1..S the packed
  sequence a token belongs to; a query sees only keys of its own sequence. ``causal``: a query
  sees only keys at or before it. ``query_index_BxQ``: the row positions of the queries, where
  they are a subset of the row (the last layer computed at a few positions only).
  """

  key_valid_BxL: Array
  sequence_ids_BxL: Array | None = None
  causal: bool = struct.field(pytree_node=False, default=False)
  query_index_BxQ: Array | None = None

  def at_queries(self, positions_BxQ: Array) -> AttentionMask:
    return self.replace(query_index_BxQ=positions_BxQ.astype(jnp.int32))

  def dense(self) -> Array:
    """Boolean Bx1xMxL, True where a query may attend a key; M = 1 for padding alone."""
    mask_Bx1xMxL = self.key_valid_BxL[:, None, None, :]
    if self.sequence_ids_BxL is None and not self.causal:
      return mask_Bx1xMxL
    length = self.key_valid_BxL.shape[-1]
    if self.query_index_BxQ is None:
      q_BxQ = jnp.broadcast_to(jnp.arange(length), self.key_valid_BxL.shape)
    else:
      q_BxQ = self.query_index_BxQ
    if self.causal:
      k_L = jnp.arange(length)
      mask_Bx1xMxL = mask_Bx1xMxL & (q_BxQ[:, None, :, None] >= k_L[None, None, None, :])
    if self.sequence_ids_BxL is not None:
      ids_BxL = self.sequence_ids_BxL
      q_ids_BxQ = jnp.take_along_axis(ids_BxL, q_BxQ, axis=1)
      same_Bx1xQxL = q_ids_BxQ[:, None, :, None] == ids_BxL[:, None, None, :]
      mask_Bx1xMxL = mask_Bx1xMxL & same_Bx1xQxL
    return mask_Bx1xMxL

  def segment_ids(self) -> Array:
    """Int32 BxL ids under which equal ids attend each other: the packed sequences, or 1 on
    real tokens and 0 on padding (padding queries then see only padding: their rows are never
    read)."""
    if self.sequence_ids_BxL is not None:
      return self.sequence_ids_BxL.astype(jnp.int32)
    return self.key_valid_BxL.astype(jnp.int32)


def fused_attention(
  kernel: str, q_BxQxHxK: Array, k_BxLxHxK: Array, v_BxLxHxK: Array, mask: AttentionMask
) -> Array:
  """``softmax(q k^T / sqrt(K) under mask) v`` by a fused kernel: BxQxHxK in q's dtype."""
  traits = ATTENTION_KERNELS.get(kernel)
  if traits is None or traits.compute is None:
    raise ValueError(f"attention_kernel={kernel!r} is not one of {FUSED}")
  return traits.compute(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, mask)


def _dot_product(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, mask) -> Array:
  """``jax.nn.dot_product_attention`` under the dense mask: cuDNN's fused kernel when lowered
  for an NVIDIA GPU in 16-bit floats (cuDNN has no float32 kernel), XLA's otherwise (the
  function's own default is XLA's on every platform)."""
  dense_Bx1xMxL = mask.dense() if isinstance(mask, AttentionMask) else mask
  dense_Bx1xMxL = jnp.broadcast_to(
    dense_Bx1xMxL, dense_Bx1xMxL.shape[:2] + (q_BxQxHxK.shape[1], k_BxLxHxK.shape[1])
  )

  def run(implementation):
    return lambda q, k, v, m: jax.nn.dot_product_attention(
      q, k, v, mask=m, implementation=implementation
    )

  operands = (q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, dense_Bx1xMxL)
  if jnp.dtype(q_BxQxHxK.dtype) not in (jnp.bfloat16, jnp.float16):
    return run("xla")(*operands)
  try:  # jax checks for cuDNN when it traces the cuDNN form, whatever the platform
    jax.eval_shape(run("cudnn"), *operands)
  except (RuntimeError, ValueError, NotImplementedError) as e:
    logging.log_first_n(
      logging.INFO, "attention_kernel='dot_product': XLA's kernel (cuDNN's: %s)", 1, e
    )
    return run("xla")(*operands)
  return lax.platform_dependent(*operands, cuda=run("cudnn"), default=run("xla"))


def _splash(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, mask: AttentionMask) -> Array:
  """Splash attention over (batch, heads) shards of the current mesh; queries are the whole row
  (the encoder does not narrow a splash layer's queries)."""
  if mask.query_index_BxQ is not None:
    raise ValueError("splash attention takes every position of the row as a query")
  b, length, heads, k = q_BxQxHxK.shape
  scale = 1.0 / np.sqrt(k)
  to_bhlk = lambda x: jnp.swapaxes(x, 1, 2)
  q, kk, v = (
    to_bhlk(q_BxQxHxK * jnp.asarray(scale, q_BxQxHxK.dtype)),
    to_bhlk(k_BxLxHxK),
    to_bhlk(v_BxLxHxK),
  )
  ids_BxL = mask.segment_ids()
  mesh = jax.sharding.get_abstract_mesh()
  spec_bhlk = nn.logical_to_mesh_axes(("batch", "heads", None, None))
  spec_bl = nn.logical_to_mesh_axes(("batch", None))
  shards = _shard_count(mesh, spec_bhlk[1])
  if heads % shards:
    raise ValueError(f"splash attention: {heads} heads do not split over {shards} shards")
  run = functools.partial(_splash_local, causal=mask.causal)
  if mesh.empty or not mesh.axis_names:
    out = run(q, kk, v, ids_BxL)
  else:
    out = jax.shard_map(
      run,
      mesh=mesh,
      in_specs=(spec_bhlk, spec_bhlk, spec_bhlk, spec_bl),
      out_specs=spec_bhlk,
      check_vma=False,
    )(q, kk, v, ids_BxL)
  del b, length
  return to_bhlk(out)


def _shard_count(mesh, axes) -> int:
  if axes is None or mesh.empty:
    return 1
  names = axes if isinstance(axes, tuple) else (axes,)
  return int(np.prod([mesh.shape[n] for n in names]))


def _splash_local(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, ids_BxL, *, causal: bool):
  """The kernel over one device's shard, vmapped over its rows; interpreted on a CPU."""
  heads, length = q_BxHxLxK.shape[1], q_BxHxLxK.shape[2]

  def run(interpret: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import (  # noqa: PLC0415 (Pallas TPU kernel; splash only)
      splash_attention_kernel as splash,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (  # noqa: PLC0415 (Pallas TPU kernel; splash only)
      splash_attention_mask as masks,
    )

    one = masks.CausalMask((length, length)) if causal else masks.FullMask((length, length))
    block = min(512, length)
    sizes = splash.BlockSizes(
      block_q=block,
      block_kv_compute=block,
      block_kv=block,
      block_q_dkv=block,
      block_kv_dkv=block,
      block_kv_dkv_compute=block,
      block_q_dq=block,
      block_kv_dq=block,
    )
    kernel = splash.make_splash_mha(
      masks.MultiHeadMask([one] * heads),
      block_sizes=sizes,
      head_shards=1,
      q_seq_shards=1,
      interpret=interpret,
    )
    row = lambda q, k, v, ids: kernel(q, k, v, segment_ids=splash.SegmentIds(q=ids, kv=ids))
    return lambda *args: jax.vmap(row)(*args)

  operands = (q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, ids_BxL)
  return lax.platform_dependent(*operands, cpu=run(True), tpu=run(False))


SPLASH_BLOCK = 128

ATTENTION_KERNELS: dict[str, KernelTraits] = {
  t.name: t
  for t in (
    KernelTraits(
      name="reference",
      fused=False,
      auto_on=None,
      auto_rank=2,
      auto_why="{platform} devices: the reference path is the tuned form there",
    ),
    KernelTraits(
      name="dot_product",
      fused=True,
      compute=_dot_product,
      custom_calls={"gpu": r'custom_call_target="__cudnn\$fmha'},
      auto_on=("gpu", "tpu"),
      auto_rank=1,
      auto_why="GPU (cuDNN's fused kernel), no attention dropout",
    ),
    KernelTraits(
      name="splash",
      fused=True,
      compute=_splash,
      platforms=("tpu",),
      length_multiple=SPLASH_BLOCK,
      whole_row_queries=True,
      custom_calls={"tpu": r'custom_call_target="tpu_custom_call"'},
      auto_on=("tpu",),
      auto_rank=0,
      auto_why="{platform}, no attention dropout, {length_key}={length} a multiple of {multiple}",
    ),
  )
}
KERNELS = tuple(ATTENTION_KERNELS)
FUSED = tuple(name for name, t in ATTENTION_KERNELS.items() if t.fused)
CHOICES = (AUTO,) + KERNELS
