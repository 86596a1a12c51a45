"""What this host's CPU can do at best: the peak and bandwidth the benchmarks divide by.

peak_flops = measure_peak_flops()     # FLOP/s of a 2048 x 2048 float32 matmul (best of 5)
bandwidth = measure_bandwidth()       # bytes read + written per second, elementwise, 256 MiB

On an accelerator (jax's default device) the same probes, sized for it:
``measure_peak_flops(8192, jnp.bfloat16)``, ``measure_bandwidth(4096)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks.common.timing import Timer


def _best_seconds(f, x, tries: int = 5, feed_back: bool = False) -> float:
  """The fastest of ``tries`` calls after one untimed call; ``feed_back``: each call's input is
  the previous call's output (for a function that donates its input)."""
  y = x

  def call(i):
    nonlocal y
    y = f(y if feed_back else x)
    return y

  return Timer(warmup=1, repeats=tries).time(call).best


def measure_peak_flops(n: int = 2048, dtype=jnp.float32) -> float:
  """FLOP/s of an n x n matmul in ``dtype`` on jax's default device (random operands: zeros can
  run faster than real data on a GPU)."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype) / n**0.5
  return 2 * n**3 / _best_seconds(jax.jit(lambda x: x @ x), a)


def measure_bandwidth(mib: int = 256) -> float:
  """In place (the input donated, the output fed back): a fresh 256 MiB output would time the
  kernel's page faults (about 10x slower here), not the memory."""
  x = jnp.ones((mib * 1024 * 1024 // 4,), jnp.float32)
  nbytes = x.nbytes
  f = jax.jit(lambda v: v * 1.0001 + 1.0, donate_argnums=0)
  return 2 * nbytes / _best_seconds(f, x, feed_back=True)
