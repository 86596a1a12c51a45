"""Learning-rate schedules and optimizers as BERT uses them (optax).

  schedule = warmup_linear_decay(peak=1e-4, num_warmup_steps=10_000, num_train_steps=1_000_000)
  tx = create_optimizer(config.optimizer, schedule)      # clip(1.0) -> AdamW / LAMB

The schedule is google-research/bert's ``optimization.create_optimizer``: the learning rate
decays linearly from ``peak`` at step 0 to 0 at ``num_train_steps``, and during the first
``num_warmup_steps`` it is replaced by ``peak * step / num_warmup_steps``. AdamW is decoupled
weight decay (0.01 by default) applied to every parameter except LayerNorm parameters and biases;
``config.optimizer.schedule="linear_after_warmup"`` instead decays from ``peak`` at the end of
warmup to 0 (Hugging Face's ``get_linear_schedule_with_warmup``: after warmup the learning rate
is ``T / (T - warmup)`` times BERT's, 11% higher at 10% warmup);
the gradient is clipped to global norm 1.0 first. Unlike the original TF AdamWeightDecayOptimizer,
optax's Adam applies the usual bias correction (it matters only in the first ~1/(1-b2) steps).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

# google-research/bert: exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"].
_NO_DECAY_SUBSTRINGS = ("LayerNorm", "layer_norm", "bias")


def warmup_linear_decay(
  peak: float, num_warmup_steps: int, num_train_steps: int, kind: str = "linear"
) -> optax.Schedule:
  """BERT's schedule (see module docstring); ``kind="constant"`` keeps ``peak`` after warmup,
  ``kind="linear_after_warmup"`` decays from ``peak`` at the end of warmup to 0."""
  kinds = ("linear", "linear_after_warmup", "constant")
  if kind not in kinds:
    raise ValueError(f"config.optimizer.schedule must be one of {kinds}, got {kind!r}")
  total = max(int(num_train_steps), 1)
  warmup = max(int(num_warmup_steps), 0)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    if kind == "linear":
      lr = peak * jnp.maximum(1.0 - step / total, 0.0)
    elif kind == "linear_after_warmup":
      lr = peak * jnp.maximum((total - step) / max(total - warmup, 1), 0.0)
    else:
      lr = jnp.full_like(step, peak)
    if warmup:
      lr = jnp.where(step < warmup, peak * step / warmup, lr)
    return lr

  return schedule


def join_schedules(
  schedules: Sequence[optax.Schedule], boundaries: Sequence[int]
) -> optax.Schedule:
  """Schedule i runs from boundaries[i-1]; each sees steps counted from its own start."""
  return optax.join_schedules(list(schedules), list(boundaries))


def decay_mask(params: Any) -> Any:
  """True for parameters that get weight decay (not LayerNorm parameters, not biases)."""

  def use_decay(path, _):
    name = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
    return not any(s in name for s in _NO_DECAY_SUBSTRINGS)

  return jax.tree_util.tree_map_with_path(use_decay, params)


def create_optimizer(
  cfg: Mapping[str, Any], learning_rate: optax.Schedule | float
) -> optax.GradientTransformation:
  """Global-norm clipping then AdamW or LAMB, from a ``config.optimizer`` section."""
  name = cfg["name"]
  kwargs = dict(
    learning_rate=learning_rate,
    b1=cfg["b1"],
    b2=cfg["b2"],
    eps=cfg["eps"],
    weight_decay=cfg["weight_decay"],
    mask=decay_mask,
  )
  if name == "adamw":
    tx = optax.adamw(**kwargs)
  elif name == "lamb":
    tx = optax.lamb(**kwargs)
  else:
    raise ValueError(f"config.optimizer.name must be 'adamw' or 'lamb', got {name!r}")
  if cfg["max_grad_norm"] > 0:
    tx = optax.chain(optax.clip_by_global_norm(cfg["max_grad_norm"]), tx)
  return tx


def _names(path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def with_param_groups(
  tx: optax.GradientTransformation, lr_scale: Callable[[tuple[str, ...]], float]
) -> optax.GradientTransformation:
  """``tx`` whose update of each parameter is multiplied by ``lr_scale(path)`` (its group's
  learning-rate factor; 0 freezes the parameter: no gradient step and no weight decay).

  The scaling comes last and is stateless, so the optimizer state's tree (and so its shardings
  and checkpoints) is the same as without groups. Frozen updates are exactly zero.
  """

  def scale(updates, params=None):
    del params

    def one(path, u):
      factor = float(lr_scale(_names(path)))
      if factor == 1.0:
        return u
      return jnp.zeros_like(u) if factor == 0.0 else u * factor

    return jax.tree_util.tree_map_with_path(one, updates)

  return optax.chain(tx, optax.stateless(scale))


@dataclasses.dataclass(frozen=True)
class OptimizerGroup:
  """Parameters trained by their own optimizer: those whose path ``match`` accepts, by Adam at a
  constant ``learning_rate`` (no clipping, no weight decay), e.g. a defence's adversary."""

  match: Callable[[tuple[str, ...]], bool]
  learning_rate: float
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8


MAIN_GROUP = "main"


def with_optimizer_groups(
  tx: optax.GradientTransformation, groups: Mapping[str, OptimizerGroup]
) -> optax.GradientTransformation:
  """``tx`` for every parameter no group claims, each group's own Adam for its parameters
  (``optax.multi_transform``: the main optimizer never sees the groups' parameters, so its
  clipping norm, weight decay and schedule are the main model's alone)."""
  if MAIN_GROUP in groups:
    raise ValueError(f"optimizer group name {MAIN_GROUP!r} is reserved for the main parameters")
  if not groups:
    return tx

  def labels(params):
    def label(path, _):
      names = _names(path)
      claimed = [g for g, spec in groups.items() if spec.match(names)]
      if len(claimed) > 1:
        raise ValueError(f"parameter {'/'.join(names)} is claimed by groups {claimed}")
      return claimed[0] if claimed else MAIN_GROUP

    return jax.tree_util.tree_map_with_path(label, params)

  transforms = {
    name: optax.adam(g.learning_rate, b1=g.b1, b2=g.b2, eps=g.eps) for name, g in groups.items()
  }
  return optax.multi_transform({MAIN_GROUP: tx, **transforms}, labels)
