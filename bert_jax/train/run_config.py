"""Checks of a run config's numbers, before anything runs, compiles or is written.

``check_run_config(config)`` raises one ValueError naming every key whose value is out of range
(a negative learning rate would train by gradient ascent and report "completed"; a learning
rate of 0 trains nothing). A rule applies to a key only where the config has it: pre-training
and fine-tuning configs share most keys, and each rule says what its values mean.

``check_run_config(config, mesh)`` (a ``jax.sharding.Mesh`` or its sizes, ``{"data": 2, "fsdp":
4, ...}``) checks the batch layout too (``check_batch_layout``): each batch (train, eval, phase
2's where the run has one) divides into its gradient-accumulation steps, each micro-batch into
the data-parallel size (data x fsdp) and the processes. ``pretrain``, ``finetune``,
``bert_jax.compile`` (and its planner) and the launcher's pre-flight refuse a config with the
same one-line error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# (dotted key, its check, what its values must be: words, or a function giving them)
_Rule = tuple[str, Callable[[Any], bool], "str | Callable[[], str]"]


def _finite(x) -> bool:
  return isinstance(x, (int, float)) and math.isfinite(x)


def _attention_kernels() -> tuple[str, ...]:
  """The values of ``attention_kernel``: the kernel table's, and ``auto``."""
  from bert_jax.model.kernels.attention import CHOICES  # noqa: PLC0415 (the checks stay light)

  return CHOICES


def _one_of_kernels() -> str:
  """The rule's words for ``attention_kernel``, e.g. "auto, reference, dot_product or splash"."""
  *most, last = _attention_kernels()
  return f"{', '.join(most)} or {last}"


_RULES: tuple[_Rule, ...] = (
  ("learning_rate", lambda v: _finite(v) and v > 0, "a positive number"),
  ("train_batch_size", lambda v: v > 0, "positive"),
  ("eval_batch_size", lambda v: v > 0, "positive"),
  ("grad_accum_steps", lambda v: v >= 1, ">= 1"),
  ("num_train_epochs", lambda v: _finite(v) and v > 0, "a positive number"),
  ("warmup_proportion", lambda v: _finite(v) and 0 <= v <= 1, "in [0, 1]"),
  ("save_checkpoints_steps", lambda v: v >= 0, ">= 0"),
  ("eval_every_steps", lambda v: v >= 0, ">= 0"),
  ("masked_lm_prob", lambda v: _finite(v) and 0 < v < 1, "in (0, 1)"),
  ("max_predictions_per_seq", lambda v: v > 0, "positive"),
  ("max_seq_length", lambda v: v > 1, "> 1"),
  ("hidden_dropout_prob", lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
  ("attention_probs_dropout_prob", lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
  (
    "attention_kernel",
    lambda v: v in _attention_kernels(),
    _one_of_kernels,
  ),
  ("phase2.fraction", lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
  ("phase2.train_batch_size", lambda v: v > 0, "positive"),
  ("phase2.grad_accum_steps", lambda v: v >= 1, ">= 1"),
  ("phase2.num_warmup_steps", lambda v: v >= 0, ">= 0"),
  ("phase2.learning_rate", lambda v: _finite(v) and v != 0, "> 0 (or < 0: continue phase 1's)"),
  ("optimizer.weight_decay", lambda v: _finite(v) and v >= 0, ">= 0"),
  ("optimizer.b1", lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
  ("optimizer.b2", lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
  ("optimizer.eps", lambda v: _finite(v) and v > 0, "positive"),
  ("checkpoint.keep_checkpoint_max", lambda v: v >= 1, ">= 1"),
  ("checkpoint.keep_period", lambda v: v >= 0, ">= 0 (0: keep only the last keep_checkpoint_max)"),
  ("logging.log_every_steps", lambda v: v >= 1, ">= 1"),
)


def _lookup(config, dotted: str) -> tuple[bool, Any]:
  node = config
  for part in dotted.split("."):
    if part not in node:
      return False, None
    node = node[part]
  return True, node


def check_run_config(config, mesh=None, *, processes: int | None = None) -> None:
  """ValueError naming each out-of-range key (see the module docstring); with ``mesh``, then
  the batch layout (``check_batch_layout``)."""
  problems = []
  for key, ok, what in _RULES:
    present, value = _lookup(config, key)
    if present and not ok(value):
      words = what() if callable(what) else what
      problems.append(f"config.{key}={value!r} (must be {words})")
  present, warmup = _lookup(config, "num_warmup_steps")
  if present:
    # Fine-tuning configs (which have warmup_proportion) use -1 for "from the proportion".
    floor = -1 if "warmup_proportion" in config else 0
    if warmup < floor:
      problems.append(f"config.num_warmup_steps={warmup!r} (must be >= {floor})")
  present, steps = _lookup(config, "num_train_steps")
  if present:
    floor = 0 if "num_train_epochs" in config else 1  # fine-tuning: 0 = from the epochs
    if steps < floor:
      problems.append(f"config.num_train_steps={steps!r} (must be >= {floor})")
  if problems:
    raise ValueError("invalid config: " + "; ".join(problems))
  if mesh is not None:
    check_batch_layout(config, mesh, processes=processes)


def _batch_keys(config) -> list[tuple[str, str]]:
  """(batch key, its accumulation key or "") of each batch the run feeds."""
  keys = [("train_batch_size", "grad_accum_steps" if "grad_accum_steps" in config else "")]
  if "eval_batch_size" in config:
    keys.append(("eval_batch_size", ""))
  present, fraction = _lookup(config, "phase2.fraction")
  if present and fraction > 0:
    keys.append(("phase2.train_batch_size", "phase2.grad_accum_steps"))
  return keys


def check_batch_layout(config, mesh, *, processes: int | None = None) -> None:
  """ValueError naming the key when a batch does not divide into its accumulation steps, or a
  (micro-)batch into the data-parallel size data x fsdp of ``mesh`` (a Mesh or its sizes) or
  into ``processes`` (default: this run's, ``jax.process_count()``; a compile for a topology
  passes its hosts'). The messages are ``bert_jax.parallel.check_batch_size``'s."""
  shape = dict(mesh.shape) if hasattr(mesh, "axis_names") else dict(mesh)
  dp = int(shape.get("data", 1)) * int(shape.get("fsdp", 1))
  if processes is None:
    import jax  # noqa: PLC0415 (the range checks stay light)

    processes = jax.process_count()
  for key, accum_key in _batch_keys(config):
    batch = _lookup(config, key)[1]
    accum = _lookup(config, accum_key)[1] if accum_key else 1
    if accum < 1 or batch % accum:
      raise ValueError(f"config.{key}={batch} is not divisible by config.{accum_key}={accum}")
    micro, what = batch // accum, key if accum == 1 else f"{key} / {accum_key}"
    if micro <= 0 or micro % dp:
      raise ValueError(
        f"config.{what}={micro} is not divisible by the data-parallel size {dp} "
        f"(mesh data={shape.get('data', 1)} x fsdp={shape.get('fsdp', 1)})"
      )
    if micro % processes:
      raise ValueError(
        f"config.{what}={micro} is not divisible by the number of processes {processes}"
      )
