"""Length bucketing: each batch is cut to the shortest configured length that holds its rows.

Fine-tuning rows are padded to ``max_seq_length`` when a split is featurised, but most GLUE
batches are far shorter (CoLA's longest row in a batch of 32 averages 23 word pieces of 128).
Attention masks the padding, so running a batch cut to its longest row gives the same logits,
loss and gradients up to float reassociation, for a fraction of the work. To keep the number of
compiled programs small, the cut length is rounded up to a *bucket*: every bucket is compiled
once (train step and eval step), on first use.

  buckets = parse_buckets(config.length_buckets, config.max_seq_length)   # e.g. (32, 64, 96, 128)
  bucketer = LengthBucketer(buckets, task.sequence_axes, task.position_keys)
  length = bucketer.length_of(rows)          # from the *global* batch: every process agrees
  batch = bucketer.cut(rows, length)         # arrays sliced on their declared length axis
  outputs = bucketer.pad(outputs, task.prediction_axes, max_seq_length)    # back to full length

``config.length_buckets`` (a string, so that ``--config.length_buckets=16,32,128`` works):
  ""  or "0"       off: every batch keeps ``max_seq_length``
  "32"             one number: its multiples up to ``max_seq_length`` (32, 64, 96, 128)
  "16,48,128"      several: exactly these lengths
``max_seq_length`` is always the last bucket (the inference tools' bucket lists,
``bert_jax.data.inference_batches``, are read by ``parse_buckets`` too). The longest row is
found from ``input_mask`` (the last position with mask 1, over every axis but the length axis,
so SWAG's BxCxL counts all four choices). Arrays that hold *positions into* the sequence
(SQuAD's start and end positions) are named by the task's ``position_keys``: the cut length is
raised so that every such position stays inside the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

MASK_KEY = "input_mask"


def parse_buckets(
  setting: str | int | Sequence[int], max_seq_length: int, key: str = "length_buckets"
) -> tuple[int, ...]:
  """Bucket lengths (ascending, ending at ``max_seq_length``) from the config value; () = off.

  ``setting`` may also be a sequence of ints: exactly these lengths (even just one), those
  above ``max_seq_length`` dropped. Errors name ``config.<key>``.
  """
  max_seq_length = int(max_seq_length)
  if isinstance(setting, (list, tuple)):
    values = [int(v) for v in setting]
    bad = [v for v in values if v <= 0]
    if bad:
      raise ValueError(f"config.{key}={setting!r}: lengths must be positive, got {bad}")
    return tuple(sorted(set(v for v in values if v < max_seq_length) | {max_seq_length}))
  text = str(setting).strip().strip("'\"")
  if text in ("", "0", "off", "none", "None"):
    return ()
  try:
    values = [int(v) for v in text.replace(" ", "").split(",") if v]
  except ValueError:
    raise ValueError(
      f"config.{key}={setting!r}: expected '' (off), one number (a multiple, "
      "e.g. '32') or comma-separated lengths (e.g. '32,64,128')"
    ) from None
  bad = [v for v in values if v <= 0]
  if bad:
    raise ValueError(f"config.{key}={setting!r}: lengths must be positive, got {bad}")
  if len(values) == 1:
    step = values[0]
    values = list(range(step, max_seq_length, step))
  else:
    too_long = [v for v in values if v > max_seq_length]
    if too_long:
      raise ValueError(
        f"config.{key}={setting!r}: {too_long} exceed(s) max_seq_length={max_seq_length}"
      )
  return tuple(sorted(set(v for v in values if v < max_seq_length) | {max_seq_length}))


def longest_row(mask: np.ndarray, axis: int) -> int:
  """1 + the last index along ``axis`` where ``mask`` is non-zero anywhere (0 if none)."""
  other = tuple(a for a in range(mask.ndim) if a != axis % mask.ndim)
  used_L = np.any(mask != 0, axis=other)
  nonzero = np.flatnonzero(used_L)
  return int(nonzero[-1]) + 1 if nonzero.size else 0


@dataclasses.dataclass(frozen=True)
class LengthBucketer:
  """Cuts batches to buckets (see the module docstring).

  Attributes:
    buckets: ascending bucket lengths, the last one = max_seq_length; () turns bucketing off.
    sequence_axes: array key -> its length axis, for every array that has one (the task's
      ``sequence_axes``; it must include ``input_mask``).
    position_keys: arrays whose values are positions into the sequence (kept inside the cut).
  """

  buckets: tuple[int, ...]
  sequence_axes: Mapping[str, int]
  position_keys: Sequence[str] = ()

  def __post_init__(self):
    if self.buckets and MASK_KEY not in self.sequence_axes:
      raise ValueError(
        f"length bucketing needs {MASK_KEY!r} among the task's sequence_axes "
        f"{dict(self.sequence_axes)}"
      )

  @property
  def enabled(self) -> bool:
    return len(self.buckets) > 1

  @property
  def max_length(self) -> int:
    return self.buckets[-1] if self.buckets else 0

  def bucket_for(self, needed: int) -> int:
    """The smallest bucket >= ``needed`` (the largest one when none is)."""
    for b in self.buckets:
      if b >= needed:
        return b
    return self.buckets[-1]

  def length_of(self, rows: Mapping[str, np.ndarray]) -> int:
    """The bucket length for a batch of rows (use the whole global batch's rows)."""
    if not self.enabled:
      return self.max_length
    needed = longest_row(rows[MASK_KEY], self.sequence_axes[MASK_KEY])
    for key in self.position_keys:
      if key in rows and rows[key].size:
        needed = max(needed, int(np.max(rows[key])) + 1)
    return self.bucket_for(max(needed, 1))

  def row_lengths(self, rows: Mapping[str, np.ndarray]) -> np.ndarray:
    """Each row's needed length (its own ``length_of`` before rounding to a bucket), shape [N].

    Evaluation sorts a split by this so that rows of similar length share a batch.
    """
    axis = self.sequence_axes[MASK_KEY] % rows[MASK_KEY].ndim
    used_NxL = np.moveaxis(rows[MASK_KEY] != 0, axis, -1)
    used_NxL = used_NxL.reshape(used_NxL.shape[0], -1, used_NxL.shape[-1]).any(axis=1)
    length_N = np.where(
      used_NxL.any(axis=1), used_NxL.shape[1] - np.argmax(used_NxL[:, ::-1], axis=1), 0
    )
    for key in self.position_keys:
      if key in rows and rows[key].size:
        positions = rows[key].reshape(rows[key].shape[0], -1)
        length_N = np.maximum(length_N, positions.max(axis=1) + 1)
    return length_N

  def cut(self, rows: Mapping[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
    """``rows`` with every declared sequence array sliced to ``length`` on its length axis."""
    out = dict(rows)
    if not self.enabled:
      return out
    for key, axis in self.sequence_axes.items():
      if key in out and out[key].shape[axis] != length:
        index = [slice(None)] * out[key].ndim
        index[axis] = slice(0, length)
        out[key] = out[key][tuple(index)]
    return out

  @staticmethod
  def pad(
    outputs: Mapping[str, np.ndarray], axes: Mapping[str, int], length: int
  ) -> dict[str, np.ndarray]:
    """Per-row outputs with a length axis (``axes``) padded back to ``length``.

    Floats (logits) are padded with their dtype's lowest value, so a padded position is never
    an argmax or a top-k pick; integers (label ids) with 0.
    """
    out = dict(outputs)
    for key, axis in axes.items():
      if key in out and out[key].shape[axis] < length:
        x = out[key]
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, length - x.shape[axis])
        fill = np.finfo(x.dtype).min if np.issubdtype(x.dtype, np.floating) else 0
        out[key] = np.pad(x, widths, constant_values=fill)
    return out
