"""A generic, pure train step parametrised by the task's loss, and its jitted, donated form.

  def loss_fn(params, batch, rng, deterministic) -> (scalar loss, {name: scalar metric}):
    ...
  step = make_train_step(loss_fn, tx, schedule, grad_accum_steps=2)
  train_step = jit_train_step(step, state_shardings, mesh, rules)
  state, metrics = train_step(state, batch)          # the input state is donated

The dropout key of step s is ``fold_in(state.rng, s)`` (and ``fold_in(., i)`` for micro-batch
i), so a resumed run draws exactly the keys an uninterrupted one would. With
``grad_accum_steps=k`` the global batch is split into k micro-batches (row i*k+j goes to
micro-batch j, so each micro-batch keeps the batch's sharding); their gradients are averaged by
a ``lax.scan`` and one optimizer update is made. Metrics are averaged over micro-batches and
gain ``loss``, ``grad_norm`` (before clipping), ``update_norm`` (of the change applied, new
minus old parameters; the loop stops when it is not finite: the new params are not) and
``learning_rate``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax.parallel.sharding import Rules, mesh_context
from bert_jax.train.state import TrainState

LossFn = Callable[
  [Any, Mapping[str, jax.Array], jax.Array, bool], tuple[jax.Array, dict[str, jax.Array]]
]


def _split_micro_batches(
  batch: Mapping[str, jax.Array], k: int, mesh: jax.sharding.Mesh | None
) -> dict[str, jax.Array]:
  def split(x):
    if x.shape[0] % k:
      raise ValueError(f"batch size {x.shape[0]} is not divisible by grad_accum_steps {k}")
    x = x.reshape((x.shape[0] // k, k) + x.shape[1:]).swapaxes(0, 1)
    if mesh is None:
      return x
    spec = nn.logical_to_mesh_axes((None, "batch") + (None,) * (x.ndim - 2))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

  return {key: split(x) for key, x in batch.items()}


def make_train_step(
  loss_fn: LossFn,
  tx: optax.GradientTransformation,
  learning_rate_fn: Callable[[jax.Array], jax.Array] | None = None,
  grad_accum_steps: int = 1,
  mesh: jax.sharding.Mesh | None = None,
):
  """The pure ``train_step(state, batch) -> (state, metrics)``.

  ``mesh`` (with the logical rules current while tracing) keeps micro-batches sharded along
  ``batch``; without it XLA chooses.
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state: TrainState, batch: Mapping[str, jax.Array]):
    rng = jax.random.fold_in(state.rng, state.step)
    if grad_accum_steps <= 1:
      (loss, metrics), grads = grad_fn(state.params, batch, rng, False)
    else:
      micro = _split_micro_batches(batch, grad_accum_steps, mesh)

      def body(grad_sum, xs):
        i, micro_batch = xs
        (loss, metrics), grads = grad_fn(
          state.params, micro_batch, jax.random.fold_in(rng, i), False
        )
        return jax.tree_util.tree_map(jnp.add, grad_sum, grads), (loss, metrics)

      zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
      grad_sum, (losses, metrics) = jax.lax.scan(body, zeros, (jnp.arange(grad_accum_steps), micro))
      grads = jax.tree_util.tree_map(lambda g: g / grad_accum_steps, grad_sum)
      loss = jnp.mean(losses)
      metrics = jax.tree_util.tree_map(jnp.mean, metrics)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    # The update's norm as applied (new minus old parameters): the norm of `updates` itself made
    # XLA:CPU recompute or keep the whole update beside the optimizer's fused pass (2.5x the
    # optimizer's time at BERT-tiny), where this difference fuses with the new parameters.
    applied = jax.tree_util.tree_map(jnp.subtract, params, state.params)
    metrics = dict(
      metrics, loss=loss, grad_norm=optax.global_norm(grads), update_norm=optax.global_norm(applied)
    )
    if learning_rate_fn is not None:
      metrics["learning_rate"] = learning_rate_fn(state.step)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics

  return train_step


def jit_train_step(train_step, state_shardings: Any, mesh: jax.sharding.Mesh, rules: Rules):
  """One ``jax.jit`` with the state donated and kept in its shardings; runs under the mesh."""
  replicated = NamedSharding(mesh, PartitionSpec())
  jitted = jax.jit(train_step, out_shardings=(state_shardings, replicated), donate_argnums=0)

  def run(state, batch):
    with mesh_context(mesh, rules):
      return jitted(state, batch)

  run.jitted = jitted
  return run


def jit_eval_step(
  eval_fn: Callable[[Any, Mapping[str, jax.Array]], dict[str, jax.Array]],
  mesh: jax.sharding.Mesh,
  rules: Rules,
):
  """``eval_fn(params, batch) -> {name: sum}`` jitted, outputs replicated, under the mesh."""
  replicated = NamedSharding(mesh, PartitionSpec())
  jitted = jax.jit(eval_fn, out_shardings=replicated)

  def run(params, batch):
    with mesh_context(mesh, rules):
      return jitted(params, batch)

  run.jitted = jitted
  return run
