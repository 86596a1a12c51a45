"""Checks of a run config's numbers, before anything runs, compiles or is written.

``check_run_config(config, rules=...)`` raises one ValueError naming every key whose value is
out of range (a negative learning rate would train by gradient ascent and report "completed"; a
learning rate of 0 trains nothing). The rules are a ``ConfigRules``: ``GENERIC_RULES`` (what
every run config has: learning rate, batch sizes, dropout, the attention kernel, ``optimizer.*``,
``checkpoint.*``, ``logging.*``) extended by the task with its own keys and the batches only its
runs feed (``bert_jax.runs.rules.config_rules(config)`` picks a config's). A rule applies
to a key only where the config has it, and each rule says what its values mean.

``check_run_config(config, mesh, rules=...)`` (a ``jax.sharding.Mesh`` or its sizes, ``{"data":
2, "fsdp": 4, ...}``) checks the batch layout too (``check_batch_layout``): each batch (train,
eval, and the task's others) divides into its gradient-accumulation steps, each micro-batch into
the data-parallel size (data x fsdp) and the processes. ``pretrain``, ``finetune``,
``bert_jax.compile`` (and its planner) and the launcher's pre-flight refuse a config with the
same one-line error. Without ``rules`` (callers from before the argument) the tasks' pick for
the config is used.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

# (dotted key, its check, what its values must be: words, or a function giving them)
_Rule = tuple[str, Callable[[Any], bool], "str | Callable[[], str]"]


def finite(x) -> bool:
  """A finite int or float (a rule's first test of a number)."""
  return isinstance(x, (int, float)) and math.isfinite(x)


def _attention_kernels() -> tuple[str, ...]:
  """The values of ``attention_kernel``: the kernel table's, and ``auto``."""
  from bert_jax.model.kernels.attention import CHOICES  # noqa: PLC0415 (the checks stay light)

  return CHOICES


def _one_of_kernels() -> str:
  """The rule's words for ``attention_kernel``, e.g. "auto, reference, dot_product or splash"."""
  *most, last = _attention_kernels()
  return f"{', '.join(most)} or {last}"


@dataclasses.dataclass(frozen=True)
class ConfigRules:
  """A run config's checks: ``ranges``, (dotted key, check, what its values must be) in the
  order their problems are named; ``batches(config)``, the (batch key, accumulation key or "")
  of the batches a run feeds besides the train and eval batches (a task's later phases)."""

  ranges: tuple[_Rule, ...]
  batches: Callable[[Any], list[tuple[str, str]]] | None = None

  def extended(
    self,
    *rules: _Rule,
    after: str | None = None,
    batches: Callable[[Any], list[tuple[str, str]]] | None = None,
  ) -> ConfigRules:
    """These rules with ``rules`` added after the rule of key ``after`` (None: at the end), and
    ``batches`` where given."""
    keys = [r[0] for r in self.ranges]
    at = len(keys) if after is None else keys.index(after) + 1
    ranges = self.ranges[:at] + tuple(rules) + self.ranges[at:]
    return ConfigRules(ranges, self.batches if batches is None else batches)


GENERIC_RULES = ConfigRules(
  (
    ("learning_rate", lambda v: finite(v) and v > 0, "a positive number"),
    ("train_batch_size", lambda v: v > 0, "positive"),
    ("eval_batch_size", lambda v: v > 0, "positive"),
    ("grad_accum_steps", lambda v: v >= 1, ">= 1"),
    ("save_checkpoints_steps", lambda v: v >= 0, ">= 0"),
    ("eval_every_steps", lambda v: v >= 0, ">= 0"),
    ("max_seq_length", lambda v: v > 1, "> 1"),
    ("hidden_dropout_prob", lambda v: finite(v) and 0 <= v < 1, "in [0, 1)"),
    ("attention_probs_dropout_prob", lambda v: finite(v) and 0 <= v < 1, "in [0, 1)"),
    ("attention_kernel", lambda v: v in _attention_kernels(), _one_of_kernels),
    ("optimizer.weight_decay", lambda v: finite(v) and v >= 0, ">= 0"),
    ("optimizer.b1", lambda v: finite(v) and 0 <= v < 1, "in [0, 1)"),
    ("optimizer.b2", lambda v: finite(v) and 0 <= v < 1, "in [0, 1)"),
    ("optimizer.eps", lambda v: finite(v) and v > 0, "positive"),
    ("checkpoint.keep_checkpoint_max", lambda v: v >= 1, ">= 1"),
    (
      "checkpoint.keep_period",
      lambda v: v >= 0,
      ">= 0 (0: keep only the last keep_checkpoint_max)",
    ),
    ("logging.log_every_steps", lambda v: v >= 1, ">= 1"),
  )
)


def _lookup(config, dotted: str) -> tuple[bool, Any]:
  node = config
  for part in dotted.split("."):
    if part not in node:
      return False, None
    node = node[part]
  return True, node


def check_run_config(
  config, mesh=None, *, rules: ConfigRules, processes: int | None = None
) -> None:
  """ValueError naming each out-of-range key under ``rules`` (see the module docstring); with
  ``mesh``, then the batch layout (``check_batch_layout``)."""
  problems = []
  for key, ok, what in rules.ranges:
    present, value = _lookup(config, key)
    if present and not ok(value):
      words = what() if callable(what) else what
      problems.append(f"config.{key}={value!r} (must be {words})")
  if problems:
    raise ValueError("invalid config: " + "; ".join(problems))
  if mesh is not None:
    check_batch_layout(config, mesh, processes=processes, rules=rules)


def _batch_keys(config, rules: ConfigRules) -> list[tuple[str, str]]:
  """(batch key, its accumulation key or "") of each batch the run feeds."""
  keys = [("train_batch_size", "grad_accum_steps" if "grad_accum_steps" in config else "")]
  if "eval_batch_size" in config:
    keys.append(("eval_batch_size", ""))
  if rules.batches is not None:
    keys += rules.batches(config)
  return keys


def check_batch_layout(config, mesh, *, rules: ConfigRules, processes: int | None = None) -> None:
  """ValueError naming the key when a batch does not divide into its accumulation steps, or a
  (micro-)batch into the data-parallel size data x fsdp of ``mesh`` (a Mesh or its sizes) or
  into ``processes`` (default: this run's, ``jax.process_count()``; a compile for a topology
  passes its hosts'). The batches are the train and eval ones and ``rules.batches``'. The messages are ``bert_jax.parallel.check_batch_size``'s."""
  shape = dict(mesh.shape) if hasattr(mesh, "axis_names") else dict(mesh)
  dp = int(shape.get("data", 1)) * int(shape.get("fsdp", 1))
  if processes is None:
    import jax  # noqa: PLC0415 (the range checks stay light)

    processes = jax.process_count()
  for key, accum_key in _batch_keys(config, rules):
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
