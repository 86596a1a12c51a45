"""bert_jax's dropout against the definition of inverted dropout (Srivastava et al. 2014).

Each element is zeroed independently with probability ``rate`` and kept elements are scaled so
that the expectation is unchanged. Checked statistically (binomial bounds, 6 sigma), plus: the
draw does not depend on how the array is sharded (1 vs 8 devices), and a model in training mode
really drops (different keys give different outputs; deterministic mode gives the input back).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax.model.kernels.dropout import Dropout, keep_mask, keep_threshold


def _apply(rate, x, key, deterministic=False):
  return Dropout(rate).apply({}, x, deterministic=deterministic, rngs={"dropout": key})


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_rate_scale_and_independence(rate):
  x = jnp.ones((64, 4, 31, 33), jnp.float32)  # odd last axis: the halves are cut to size
  y = np.asarray(_apply(rate, x, jax.random.PRNGKey(0)))
  kept = y != 0
  n, p = kept.size, 1 - rate
  sigma = np.sqrt(n * p * (1 - p))
  assert abs(kept.sum() - n * p) < 6 * sigma
  # Kept values are x / (realised keep probability): E[y] = x exactly.
  np.testing.assert_allclose(y[kept], 65536 / keep_threshold(rate), rtol=1e-6)
  assert abs(y.mean() - 1.0) < 6 * sigma / n / p
  # Independence where the four 16-bit parts of one threefry evaluation land on a CPU (rows i,
  # i + q, i + 2q, i + 3q with q = ceil(31 / 4)), where the two halves of a word land elsewhere
  # (columns c and c + 17), and between neighbours: P(both kept) = p^2.
  q = (31 + 3) // 4
  parts = [kept[..., g * q : g * q + 7, :] for g in range(4)]  # the last part has 31 - 3q = 7
  pairs = {f"parts {a}, {b}": (parts[a], parts[b]) for a in range(4) for b in range(a + 1, 4)}
  pairs["halves"] = (kept[..., :16], kept[..., 17:33])
  pairs["neighbours"] = (kept[..., :-1], kept[..., 1:])
  for name, (a, b) in pairs.items():
    both, m = np.logical_and(a, b).sum(), a.size
    assert abs(both - m * p * p) < 6 * np.sqrt(m * p * p * (1 - p * p)), name
  # Per-position keep rates do not depend on the position within the last axis.
  per_col = kept.reshape(-1, 33).mean(0)
  assert np.all(np.abs(per_col - p) < 6 * np.sqrt(p * (1 - p) / (n / 33)))


def test_draws_are_threefry_of_the_documented_counters():
  """On a CPU, the mask against JAX's threefry-2x32 hash (``jax.extend.random.threefry_2x32``)
  applied to the counters the module documents: hi = the leading axes' flat index, lo = i * last
  + column for i < Q = ceil(rows / 4); row g * Q + i is 16-bit part g of that evaluation (the
  low then high half of the first output word, then of the second)."""
  lead, rows, last = (3, 2), 7, 33
  if jax.default_backend() != "cpu":  # TPUs and GPUs: the two-way form, as for other keys
    _assert_two_way_draw(jax.random.key(7), (*lead, rows, last))
    return
  q = (rows + 3) // 4
  hi, i, c = np.meshgrid(np.arange(6), np.arange(q), np.arange(last), indexing="ij")
  lo = i * last + c
  count = np.concatenate([hi.ravel(), lo.ravel()]).astype(np.uint32)
  for key in [jax.random.PRNGKey(7), jax.random.key(7)]:
    words = np.asarray(jax.random.key_data(key)) if key.shape == () else np.asarray(key)
    out = np.asarray(threefry_2x32((words[0], words[1]), count)).astype(np.uint32)
    first, second = out[: hi.size].reshape(hi.shape), out[hi.size :].reshape(hi.shape)
    parts = [first & 0xFFFF, first >> 16, second & 0xFFFF, second >> 16]
    draws = np.concatenate(parts, axis=1)[:, :rows].reshape(*lead, rows, last)
    want = draws < keep_threshold(0.1)
    got = np.asarray(jax.jit(lambda k: keep_mask(k, (*lead, rows, last), 0.1))(key))
    np.testing.assert_array_equal(got, want)


def _assert_two_way_draw(key, shape):
  """The mask is ``jax.random.bits`` over ``shape`` with the last axis halved, element c of a
  row the low 16 bits of word c and element half + c the high 16 bits."""
  half = (shape[-1] + 1) // 2
  words = np.asarray(jax.random.bits(key, (*shape[:-1], 1, half), jnp.uint32))
  draws = np.concatenate([words & 0xFFFF, words >> 16], axis=-1)
  draws = draws.reshape(*shape[:-1], 2 * half)[..., : shape[-1]]
  got = np.asarray(keep_mask(key, shape, 0.1))
  np.testing.assert_array_equal(got, draws < keep_threshold(0.1))
  return got


def test_other_prng_implementations_draw_with_jax_random_bits():
  """An ``rbg`` key (not threefry's): the mask comes from ``jax.random.bits``, two 16-bit halves
  per word, and still keeps each element with probability threshold / 65536."""
  got = _assert_two_way_draw(jax.random.key(0, impl="rbg"), (64, 4, 31, 33))
  n, p = got.size, 1 - 0.1
  assert abs(got.sum() - n * p) < 6 * np.sqrt(n * p * (1 - p))


def test_realised_rate_is_within_2_pow_minus_17():
  for rate in (0.0, 0.1, 0.15, 0.3, 0.9):
    assert abs((1 - keep_threshold(rate) / 65536) - rate) <= 2**-17


def test_deterministic_and_zero_rate_return_the_input():
  x = jnp.arange(12.0).reshape(3, 4)
  assert _apply(0.1, x, jax.random.PRNGKey(0), deterministic=True) is x
  np.testing.assert_array_equal(_apply(0.0, x, jax.random.PRNGKey(0)), x)
  with pytest.raises(ValueError, match="dropout rate"):
    _apply(1.0, x, jax.random.PRNGKey(0))


def test_keys_give_different_masks_and_bfloat16_keeps_its_dtype():
  x = jnp.ones((8, 128), jnp.bfloat16)
  a = _apply(0.1, x, jax.random.PRNGKey(0))
  b = _apply(0.1, x, jax.random.PRNGKey(1))
  assert a.dtype == jnp.bfloat16 and not np.array_equal(np.asarray(a), np.asarray(b))


def test_same_mask_on_one_device_and_sharded_over_eight():
  devices = jax.devices()
  assert len(devices) >= 8, "tests/conftest.py sets up 8 fake CPU devices"
  key = jax.random.PRNGKey(3)
  shape = (16, 2, 24, 24)
  one = jax.jit(lambda k: keep_mask(k, shape, 0.1))(key)
  mesh = Mesh(np.array(devices[:8]).reshape(4, 2), ("data", "tensor"))
  sharding = NamedSharding(mesh, PartitionSpec("data", "tensor"))
  sharded = jax.jit(lambda k: keep_mask(k, shape, 0.1), out_shardings=sharding)(key)
  assert sharded.sharding == sharding
  np.testing.assert_array_equal(np.asarray(one), np.asarray(sharded))


def test_flax_module_interface():
  class Net(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic):
      return Dropout(0.5)(nn.Dense(4)(x), deterministic=deterministic)

  x = jnp.ones((2, 3))
  params = Net().init(jax.random.PRNGKey(0), x, True)
  out = Net().apply(params, x, False, rngs={"dropout": jax.random.PRNGKey(1)})
  ref = Net().apply(params, x, True)
  kept = np.asarray(out) != 0
  np.testing.assert_allclose(np.asarray(out)[kept], 2 * np.asarray(ref)[kept], rtol=1e-6)
