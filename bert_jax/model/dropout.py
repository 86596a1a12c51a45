"""Inverted dropout drawing 16 random bits per element instead of 32.

``flax.linen.Dropout`` draws a 32-bit uniform per element (``jax.random.bernoulli``). With
``jax_threefry_partitionable`` (jax's default) every element then costs one threefry-2x32
evaluation, and on CPU the attention-probability dropout (B x H x L x L) was a quarter of the
tiny preset's train step at sequence length 512. Here one 32-bit draw serves two elements (its
low and high halves): a third of the time of flax's dropout in a micro-benchmark on CPU.

The keep decision is ``bits16 < round((1 - rate) * 65536)`` and the kept values are scaled by
``65536 / threshold``, so ``E[y] = x`` exactly and the realised rate is within 2^-17 of
``rate`` (0.1 becomes 0.1000061). The random bits are drawn with ``x``'s shape except for the last
axis (halved), so the draw is sharded like ``x`` and is the same on 1 or N devices. The halves
are spread over the row by broadcasting against the two shifts rather than by concatenating
them (the same mask bit for bit): the concatenation kept the TPU compiler from fusing the draw
into its consumers, and was slower on CPU too (docs/pretraining.md). Same interface as
``nn.Dropout`` (a "dropout" rng stream, ``deterministic``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

_ONE = 1 << 16


def keep_threshold(rate: float) -> int:
  """Elements whose 16-bit draw is below this are kept."""
  return int(round((1.0 - rate) * _ONE))


def keep_mask(key: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """Boolean keep mask of ``shape``: each element kept with probability threshold / 65536."""
  shape_1 = tuple(shape) or (1,)
  last, half = shape_1[-1], (shape_1[-1] + 1) // 2
  words_Nx1xW = jax.random.bits(key, shape_1[:-1] + (1, half), jnp.uint32)
  # Element j of a row takes the low 16 bits of word j (j < half), the high 16 bits of word
  # j - half otherwise: a broadcast against the two shifts (fusible), not a concatenation.
  shifts_2x1 = jnp.array([[0], [16]], jnp.uint32)
  halves_Nx2xW = (words_Nx1xW >> shifts_2x1) & jnp.uint32(0xFFFF)
  halves = halves_Nx2xW.reshape(shape_1[:-1] + (2 * half,))[..., :last]
  return (halves < jnp.uint32(keep_threshold(rate))).reshape(shape)


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
