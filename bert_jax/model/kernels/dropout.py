"""Inverted dropout drawing 16 random bits per element instead of 32.

``flax.linen.Dropout`` draws a 32-bit uniform per element (``jax.random.bernoulli``). With
``jax_threefry_partitionable`` (jax's default) every element then costs one threefry-2x32
evaluation, and on CPU the attention-probability dropout (B x H x L x L) was a quarter of the
tiny preset's train step at sequence length 512. Here each 32-bit word of ``jax.random.bits``
serves two elements (its low and high 16 bits): a third of the time of flax's dropout in a
micro-benchmark on CPU. On a CPU one threefry-2x32 evaluation serves four elements instead:
``jax.random.bits`` XORs the hash's two 32-bit output words into one, and this form calls the
hash (``jax.extend.random.threefry2x32_p``) and uses both: rows ``g * Q + i`` (Q a quarter of
the rows, rounded up) take 16-bit part g of the evaluation at counter (the leading axes' flat
index, ``i * last + column``), iotas over the array's global shape. Not elsewhere: compiled for
a TPU the four-way form needed about 10% more memory per chip
(benchmarks/results/model_numerics.md), so
``lax.platform_dependent`` keeps the two-way form for TPUs and GPUs. The masks (a random
stream) differ between the two forms. Keys of another PRNG implementation (``rbg``) take the
two-way form everywhere. Either form is drawn over the global shape, so the mask is the same on
1 or N devices.

The keep decision is ``bits16 < round((1 - rate) * 65536)`` and the kept values are scaled by
``65536 / threshold``, so ``E[y] = x`` exactly and the realised rate is within 2^-17 of
``rate`` (0.1 becomes 0.1000061). The 16-bit parts are spread over the array by broadcasting
against selections and shifts rather than by concatenating them: a concatenation kept the TPU
compiler from fusing the draw into its consumers, and was slower on CPU too
(benchmarks/results/history/pretrain_step_memory_tpu.md). Same interface as ``nn.Dropout`` (a "dropout" rng stream,
``deterministic``).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.random import threefry2x32_p

_ONE = 1 << 16


def keep_threshold(rate: float) -> int:
  """Elements whose 16-bit draw is below this are kept."""
  return int(round((1.0 - rate) * _ONE))


def keep_mask(key: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """Boolean keep mask of ``shape``: each element kept with probability threshold / 65536."""
  shape_2 = (1, 1, *shape)[-max(2, len(shape)) :]  # at least (rows, last)
  threshold = jnp.uint32(keep_threshold(rate))
  bits = lambda key: (_bits_draws(key, shape_2) < threshold).reshape(shape)
  if _threefry_words(key) is None or not _fits_two_counters(shape_2):
    return bits(key)
  cpu = lambda key: (_threefry_draws(key, shape_2) < threshold).reshape(shape)
  return lax.platform_dependent(key, cpu=cpu, default=bits)


def _threefry_words(key: jax.Array):
  """The key's two uint32 words if it is a threefry-2x32 key (jax's default), else None."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if str(jax.random.key_impl(key)) != "threefry2x32":
      return None
    key = jax.random.key_data(key)
  elif key.shape != (2,) or jax.config.jax_default_prng_impl != "threefry2x32":
    return None
  return key[0], key[1]


def _fits_two_counters(shape: tuple[int, ...]) -> bool:
  *lead, rows, last = shape
  return math.prod(lead) < 2**32 and -(-rows // 4) * last < 2**32


def _threefry_draws(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """16-bit draws (uint32) of ``shape`` (at least 2-d), four per threefry-2x32 evaluation."""
  words = _threefry_words(key)
  *lead, rows, last = shape
  quarter = -(-rows // 4)
  # Counters, one per (leading index, row < quarter, column): hi = the leading axes' flat
  # index, lo = row * last + column. Iotas over the global shape: partitioned by XLA.
  shape_W = (*lead, 1, 1, quarter, last)
  n = len(lead)
  hi = jnp.zeros(shape_W, jnp.uint32)
  stride = 1
  for axis in reversed(range(n)):
    hi = hi + lax.broadcasted_iota(jnp.uint32, shape_W, axis) * jnp.uint32(stride)
    stride *= lead[axis]
  lo = lax.broadcasted_iota(jnp.uint32, shape_W, n + 2) * jnp.uint32(last)
  lo = lo + lax.broadcasted_iota(jnp.uint32, shape_W, n + 3)
  first, second = threefry2x32_p.bind(words[0], words[1], hi, lo)
  # Row r = g * quarter + i of the array takes 16-bit part g of evaluation (i, column): output
  # word g // 2, its low half for even g, high for odd. Stacked over rows by broadcasting
  # selections and shifts (fusible), not by concatenating; over rows rather than columns, which
  # was slower on a CPU (benchmarks/results/model_numerics.md).
  word_2x1x1x1 = lax.broadcasted_iota(jnp.uint32, (2, 1, 1, 1), 0)
  shifts_2x1x1 = jnp.array([0, 16], jnp.uint32).reshape(2, 1, 1)
  words_2x1xQxL = jnp.where(word_2x1x1x1 == 0, first, second)
  parts_2x2xQxL = (words_2x1xQxL >> shifts_2x1x1) & jnp.uint32(0xFFFF)
  return parts_2x2xQxL.reshape((*lead, 4 * quarter, last))[..., :rows, :]


def _bits_draws(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """16-bit draws (uint32) of ``shape``, two per 32-bit word of ``jax.random.bits``."""
  last, half = shape[-1], (shape[-1] + 1) // 2
  words_Nx1xW = jax.random.bits(key, shape[:-1] + (1, half), jnp.uint32)
  # Element j of a row takes the low 16 bits of word j (j < half), the high 16 bits of word
  # j - half otherwise: a broadcast against the two shifts (fusible), not a concatenation.
  shifts_2x1 = jnp.array([[0], [16]], jnp.uint32)
  halves_Nx2xW = (words_Nx1xW >> shifts_2x1) & jnp.uint32(0xFFFF)
  return halves_Nx2xW.reshape(shape[:-1] + (2 * half,))[..., :last]


class Dropout(nn.Module):
  """Inverted dropout (``rate`` is the probability of zeroing an element).

  ``then(dropped, *operands)``, when given, is applied to the result, and with ``recompute`` the
  two run under ``jax.checkpoint``: the backward pass redraws the keep mask from its key and
  recomputes ``dropped`` instead of keeping both (for the attention probabilities, B x H x L x L
  per layer, that is 1 byte of mask and 2-4 bytes of dropped values per element) at the cost of
  drawing the random bits twice. The mask, and so every value, is the same either way.
  """

  rate: float
  recompute: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool, then=None, operands=()) -> jax.Array:
    then = then or (lambda y: y)
    if deterministic or self.rate == 0.0:
      return then(x, *operands)
    if not 0.0 <= self.rate < 1.0:
      raise ValueError(f"dropout rate must be in [0, 1), got {self.rate}")
    threshold = keep_threshold(self.rate)
    if threshold == _ONE:  # a rate below 2^-17 rounds to keeping everything
      return then(x, *operands)
    rate = self.rate

    def apply(x, key, *operands):
      keep = keep_mask(key, x.shape, rate)
      scale = jnp.asarray(_ONE / threshold, x.dtype)
      return then(jnp.where(keep, x * scale, jnp.zeros((), x.dtype)), *operands)

    if self.recompute:
      apply = jax.checkpoint(apply)
    return apply(x, self.make_rng("dropout"), *operands)
