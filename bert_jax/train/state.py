"""The train state (params, optimizer state, step, rng), sharded from the start.

  abstract, shardings = abstract_train_state(init_params, tx, mesh, rules, seed)
  state = init_train_state(init_params, tx, mesh, rules, seed)     # or restore into `abstract`

``init_params(rng)`` returns the model's *boxed* params (``model.init(...)["params"]``, with the
nn.Partitioned logical names). The state itself holds plain arrays; its shardings are derived
once, abstractly (``jax.eval_shape``), from those names and the logical axis rules, and the
state is created directly in place by ``jax.jit(..., out_shardings=shardings)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.parallel.sharding import Rules, logical_shardings


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimizer steps taken
  params: Any
  opt_state: Any
  rng: jax.Array  # raw uint32[2] key; the step's dropout key is fold_in(rng, step)


def _boxed_state_fn(
  init_params: Callable[[jax.Array], Any], tx: optax.GradientTransformation
) -> Callable[[jax.Array], TrainState]:
  def make(rng: jax.Array) -> TrainState:
    init_rng, train_rng = jax.random.split(rng)
    params = init_params(init_rng)
    return TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=train_rng
    )

  return make


def abstract_train_state(init_params, tx, mesh, rules: Rules, seed: int):
  """(unboxed ShapeDtypeStructs carrying their shardings, the NamedSharding tree)."""
  boxed = jax.eval_shape(_boxed_state_fn(init_params, tx), jax.random.PRNGKey(seed))
  shardings = logical_shardings(boxed, mesh, rules)
  abstract = jax.tree_util.tree_map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nn.meta.unbox(boxed), shardings
  )
  return abstract, shardings


def init_train_state(
  init_params, tx, mesh, rules: Rules, seed: int, shardings: Any = None
) -> TrainState:
  """A freshly initialised state, each array created directly with its sharding.

  The seed's key is an argument of the jitted program, not a constant in it, so one compiled
  program (and one entry of the persistent compilation cache) serves every seed.
  """
  if shardings is None:
    _, shardings = abstract_train_state(init_params, tx, mesh, rules, seed)
  make = _boxed_state_fn(init_params, tx)
  # Not under mesh_context: out_shardings places every array anyway, and a flax layer that
  # initialises its kernel flat (nn.DenseGeneral) would get the N-d logical constraint there.
  return jax.jit(lambda rng: nn.meta.unbox(make(rng)), out_shardings=shardings)(
    jax.random.PRNGKey(seed)
  )


def place_like(tree: Any, like: Any) -> Any:
  """Host arrays (numpy, the same on every process) -> global arrays sharded like ``like``."""

  def put(x, ref):
    x = np.asarray(x, dtype=ref.dtype)
    return jax.make_array_from_callback(x.shape, ref.sharding, lambda idx: x[idx])

  return jax.tree_util.tree_map(put, tree, like)


def state_with_params(
  state: TrainState, params: Any, tx: optax.GradientTransformation, shardings: Any
) -> TrainState:
  """``state`` with new (host) params placed like the old ones and a fresh optimizer state."""
  params = place_like(params, state.params)
  opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params)
  return state.replace(params=params, opt_state=opt_state)
