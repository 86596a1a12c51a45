"""ELMo's scalar mix: a learned, softmax-normalised weighting of a model's layers.

Peters et al. (2018), "Deep contextualized word representations", eq. 1: for token k and the
L + 1 representations of a biLM (layer 0 the token embeddings, then every layer),

    ELMo_k^task = gamma^task * sum_{j=0}^{L} s_j^task * h_{k,j}

with ``s^task = softmax(w^task)`` the normalised layer weights and ``gamma^task`` a scalar
that lets the task scale the whole vector; both are learned with the downstream model while
the biLM stays frozen. Here the "layers" are whatever sequence of equally shaped arrays the
caller passes; for BERT, ``BertEncoder(..., output_hidden_states=True)["hidden_states"]``:
the embedding output (index 0) then each of the ``num_hidden_layers`` layers.

``ScalarMix`` is the Flax module (params ``weights``, shape (K,), zeros: the uniform mix, and
``gamma``, a scalar, 1.0; both float32 whatever the compute dtype); ``mix`` applies weights
that are already normalised (e.g. read off a trained mix, for feature extraction);
``summary`` reads a trained mix's params: the normalised weights, gamma and the weights'
"centre of gravity" over layer indices, ``sum_j j * s_j`` (Tenney et al. 2019, "BERT
Rediscovers the Classical NLP Pipeline": where along the depth the task draws from).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def mix(hidden_states: Sequence[jax.Array], weights, gamma=1.0) -> jax.Array:
  """``gamma * sum_k weights[k] * hidden_states[k]`` in float32; ``weights`` are used as
  given (already normalised: no softmax here), one per hidden state."""
  if len(hidden_states) == 0:
    raise ValueError("scalar mix: no hidden states to mix")
  weights_K = jnp.asarray(weights, jnp.float32)
  if weights_K.shape != (len(hidden_states),):
    raise ValueError(
      f"scalar mix: {weights_K.shape[0] if weights_K.ndim == 1 else weights_K.shape} "
      f"weights for {len(hidden_states)} hidden states (need one per hidden state)"
    )
  shapes = {tuple(h.shape) for h in hidden_states}
  if len(shapes) != 1:
    raise ValueError(f"scalar mix: the hidden states differ in shape: {sorted(shapes)}")
  total = sum(weights_K[k] * jnp.asarray(h, jnp.float32) for k, h in enumerate(hidden_states))
  return jnp.asarray(gamma, jnp.float32) * total


class ScalarMix(nn.Module):
  """ELMo's learned layer mix (see the module docstring): ``gamma * sum_k softmax(w)_k h_k``.

  Params: ``weights`` (K,) initialised to zeros (the uniform mix), ``gamma`` () initialised to
  1.0, K = ``len(hidden_states)`` at init; float32. The output is float32.
  """

  @nn.compact
  def __call__(self, hidden_states: Sequence[jax.Array]) -> jax.Array:
    k = len(hidden_states)
    weights_K = self.param("weights", nn.initializers.zeros_init(), (k,), jnp.float32)
    gamma = self.param("gamma", nn.initializers.ones_init(), (), jnp.float32)
    return mix(hidden_states, jax.nn.softmax(weights_K), gamma)


def summary(mix_params: Mapping[str, Any]) -> dict[str, Any]:
  """A trained ``ScalarMix``'s params -> ``{"weights": softmax-normalised weights (floats,
  index 0 first), "gamma": float, "centre_of_gravity": sum_k k * s_k}`` (plain floats: JSON)."""
  mix_params = nn.unbox(dict(mix_params))  # logically partitioned boxes, if any
  missing = [k for k in ("weights", "gamma") if k not in mix_params]
  if missing:
    raise ValueError(f"scalar mix params lack {missing}; got keys {sorted(mix_params)}")
  w_K = np.asarray(mix_params["weights"], np.float64)
  s_K = np.exp(w_K - w_K.max())
  s_K /= s_K.sum()
  return {
    "weights": [float(s) for s in s_K],
    "gamma": float(np.asarray(mix_params["gamma"])),
    "centre_of_gravity": float(np.dot(np.arange(len(s_K)), s_K)),
  }
