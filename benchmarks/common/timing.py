"""Timing repeated calls, the one way every benchmark does it.

  timing = Timer(warmup=1, repeats=3, calls=10).time(lambda i: step(batches[i % len(batches)]))
  timing.median, timing.mean, timing.best    # seconds per call over the repeats
  timing.first                               # the first warm-up call (compiles a jitted step)

``f(i)`` is call ``i``: the warm-up calls get ``i = -warmup .. -1`` and each repeat's calls
``0 .. calls - 1``. Every warm-up call and the last call of each repeat are waited for
(``ready``: jax arrays in any pytree, PyTorch tensors), so a timing ends when the device is done.
Besides wall-clock seconds each repeat records this process's CPU seconds (``cpu_times``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any


def ready(x: Any) -> Any:
  """Waits until ``x`` is computed: jax arrays (any pytree of them) and PyTorch tensors (on a
  GPU: the device is synchronised); anything else is returned as it is."""
  import jax  # heavy: not loaded with the module by host-only timings (speed/tokenizer)

  for leaf in jax.tree_util.tree_leaves(x):
    if type(leaf).__module__.split(".")[0] == "torch":
      if getattr(leaf, "is_cuda", False):
        import torch  # optional (not a bert_jax dependency), heavy

        torch.cuda.synchronize(leaf.device)
    elif hasattr(leaf, "block_until_ready"):
      leaf.block_until_ready()
  return x


@dataclasses.dataclass(frozen=True)
class Timing:
  """Seconds of one ``Timer.time``: each warm-up call, then per call of each repeat."""

  warmup: list[float]
  times: list[float]
  cpu_times: list[float]

  @property
  def first(self) -> float:
    return self.warmup[0]

  @property
  def median(self) -> float:
    return statistics.median(self.times)

  @property
  def mean(self) -> float:
    return statistics.fmean(self.times)

  @property
  def best(self) -> float:
    return min(self.times)


@dataclasses.dataclass(frozen=True)
class Timer:
  """``warmup`` untimed calls (their seconds kept), then ``repeats`` timings of ``calls`` calls."""

  warmup: int = 1
  repeats: int = 1
  calls: int = 1

  def time(self, f: Callable[[int], Any]) -> Timing:
    warmup = []
    for i in range(-self.warmup, 0):
      t = time.perf_counter()
      ready(f(i))
      warmup.append(time.perf_counter() - t)
    times, cpu_times = [], []
    for _ in range(self.repeats):
      c, t = time.process_time(), time.perf_counter()
      out = None
      for i in range(self.calls):
        out = f(i)
      ready(out)
      times.append((time.perf_counter() - t) / self.calls)
      cpu_times.append((time.process_time() - c) / self.calls)
      del out
    return Timing(warmup, times, cpu_times)
