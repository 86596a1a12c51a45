"""Training metrics out: TensorBoard event files (tensorboardX) and a concise console line.

writer = MetricWriter(workdir)                    # <workdir>/tensorboard, process 0 only
writer.scalars(step, {"train/loss": 3.2, ...})
logging.info(progress_line(step, total, metrics))
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import jax


class MetricWriter:
  """Scalars to ``<workdir>/tensorboard``; a no-op on processes other than 0."""

  def __init__(self, workdir: str, enabled: bool | None = None):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self._writer = None
    if self.enabled:
      from tensorboardX import SummaryWriter  # noqa: PLC0415 (heavy; only on process 0)

      self._writer = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    if self._writer is None:
      return
    for name, value in values.items():
      if value is not None and math.isfinite(float(value)):
        self._writer.add_scalar(name, float(value), step)
    self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None


def _fmt_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def progress_line(step: int, total: int, m: Mapping[str, float], phase: str = "") -> str:
  """'step 100/600 [seq128] loss 5.12 | mlm 4.43 acc 0.213 | nsp 0.69 acc 0.55 | ...'."""
  parts = [f"step {step}/{total}" + (f" [{phase}]" if phase else "")]
  if "loss" in m:
    parts.append(f"loss {m['loss']:.4f}")
  for task in ("mlm", "lm", "nsp"):
    if f"{task}_loss" in m:
      parts.append(f"{task} {m[f'{task}_loss']:.3f} acc {m.get(f'{task}_accuracy', 0.0):.3f}")
  if "learning_rate" in m:
    parts.append(f"lr {m['learning_rate']:.2e}")
  if "grad_norm" in m:
    parts.append(f"gnorm {m['grad_norm']:.2f}")
  if "examples_per_sec" in m:
    perf = f"{m['examples_per_sec']:.1f} ex/s {m.get('tokens_per_sec', 0.0):,.0f} tok/s"
    if "mfu" in m:
      perf += f" MFU {100 * m['mfu']:.1f}%"
    parts.append(perf)
  if "first_step_sec" in m:
    parts.append(f"first step (compiling) {m['first_step_sec']:.1f}s")
  if "compile_sec" in m:
    parts.append(f"compiling new batch shapes {m['compile_sec']:.1f}s (not in the rates)")
  if "eta_sec" in m:
    parts.append(f"eta {_fmt_duration(m['eta_sec'])}")
  return " | ".join(parts)


def json_safe(x: Any) -> Any:
  """Floats, ints, strings, lists and dicts only (numpy and JAX scalars converted)."""
  if isinstance(x, dict):
    return {str(k): json_safe(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [json_safe(v) for v in x]
  if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
    return x.item()
  return x


def scalar_metrics(metrics: Mapping, prefix: str = "") -> dict[str, float]:
  """Flattened numeric entries of a (nested) metrics dict, for TensorBoard and console."""
  out = {}
  for k, v in metrics.items():
    if isinstance(v, Mapping):
      out.update(scalar_metrics(v, f"{prefix}{k}/"))
    elif isinstance(v, (int, float)) or (hasattr(v, "ndim") and v.ndim == 0):
      out[f"{prefix}{k}"] = float(v)
  return out
