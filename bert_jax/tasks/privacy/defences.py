"""Defences of a classifier's representation against an attacker of its private attributes.

From Coavoux, Narayan and Cohen (2018, "Privacy-preserving Neural Representations of Text",
section 4); r(x) is the representation the classifier reads (the pooler's tanh output), z the
example's K binary private attributes (``bert_jax.tasks.privacy.attributes``), and every term is
a mean over the batch. ``config.defence`` (configs/glue.py) chooses:

``multidetasking``     a duplicate adversary A (one hidden layer of ``adversary_hidden_size`` ReLU
                       units, K sigmoid outputs; params["adversary"]) is trained alongside the
                       classifier on its own loss  -sum_k log P_A(z_k | r(x))  with r(x) held
                       fixed, and the encoder and classifier on
                       -alpha log P(y | x) - beta sum_k log P_A(not z_k | r(x))  with A held
                       fixed: the encoder learns to make the adversary predict the flipped
                       labels (not gradient reversal). Each gradient reaches only its own side
                       (``jax.lax.stop_gradient`` on r(x) in the first term, on A's parameters in
                       the second). The adversary has its own optimizer (Adam at
                       ``adversary_learning_rate``, no clipping, no weight decay).
``gradient_reversal``  not from the seed (Ganin and Lempitsky 2015's idea, for comparison): as
                       multidetasking but the encoder's term is  +beta sum_k log P_A(z_k | r(x)),
                       i.e. it maximises the adversary's loss instead of targeting flipped labels.
``declustering``       no adversary: the term  lambda (l(z, z') - 0.5) ||r(x) - r(x')||^2  for a
                       pair (x, x'), l the normalised Hamming distance between the attribute
                       vectors, x' another training example (the next row of the shuffled batch,
                       so a uniform draw from the training set). Sign convention: the seed's text
                       extraction garbles the signs; its stated intent is to penalise examples
                       with similar private attributes lying in the same region of space, so the
                       loss must fall as same-attribute pairs (l < 0.5) move apart and as
                       different-attribute pairs (l > 0.5) move together: (l - 0.5) times the
                       squared distance does that (its gradient pushes the first apart and pulls
                       the second together). r(x) is tanh-bounded, so the push is bounded too.

The main loss is multiplied by ``alpha`` for every defence; ``beta`` weighs the encoder's
adversarial term, ``declustering_lambda`` the declustering term.

A task opts into the defences with the ``PrivacyDefended`` mix-in
(``bert_jax.tasks.privacy.defended``), which applies these terms in its hooks.

A split whose rows lack one of the attributes (no positive: a slice of a file ordered by
attribute, e.g. CoLA's first ``max_train_examples`` rows) gives the adversary nothing to learn of
it; ``private_attributes.matrix`` logs a warning naming the attribute and the split, and
``private_attributes.check_support`` is the error form of that check.
"""

from __future__ import annotations

from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

DEFENCES = ("", "multidetasking", "gradient_reversal", "declustering")
ADVERSARIAL = ("multidetasking", "gradient_reversal")
ADVERSARY = "adversary"  # the adversary's top-level params key


class Adversary(nn.Module):
  """The seed's attacker: one hidden layer of ReLU units, one logit per private attribute."""

  num_attributes: int
  hidden_size: int = 64

  @nn.compact
  def __call__(self, r_BxD: jax.Array) -> jax.Array:
    init = nn.initializers.lecun_normal()
    h = nn.Dense(
      self.hidden_size,
      kernel_init=nn.with_logical_partitioning(init, ("embed", None)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)),
      name="hidden",
    )(r_BxD.astype(jnp.float32))
    return nn.Dense(
      self.num_attributes,
      kernel_init=nn.with_logical_partitioning(init, (None, None)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)),
      name="output",
    )(nn.relu(h))


def check_defence(cfg: Mapping, has_private_attributes: bool) -> None:
  """Errors naming the key for an unknown defence or one asked without private attributes."""
  name = cfg["name"]
  if name not in DEFENCES:
    raise ValueError(f"config.defence.name {name!r} is not one of {DEFENCES}")
  if name and not has_private_attributes:
    raise ValueError(
      f"config.defence.name={name!r} defends private attributes, but the task has none: set "
      "config.private_attributes (one of cola_source, stsb_genre, conll_per)"
    )
  if name in ADVERSARIAL and cfg["adversary_learning_rate"] <= 0:
    raise ValueError("config.defence.adversary_learning_rate must be > 0")


def adversary_outputs(
  adversary: Adversary, params: Mapping, r_BxD: jax.Array
) -> dict[str, jax.Array]:
  """The adversary's logits twice: ``adversary_logits`` for its own loss (r(x) held fixed) and
  ``encoder_adversary_logits`` for the encoder's term (the adversary's parameters held fixed)."""
  own = adversary.apply({"params": params[ADVERSARY]}, jax.lax.stop_gradient(r_BxD))
  frozen = jax.lax.stop_gradient(params[ADVERSARY])
  return {
    "adversary_logits": own,
    "encoder_adversary_logits": adversary.apply({"params": frozen}, r_BxD),
  }


def _bce_sum(logits_BxK: jax.Array, targets_BxK: jax.Array) -> jax.Array:
  """Mean over rows of the summed binary cross-entropy (-sum_k log P(target_k))."""
  return jnp.mean(jnp.sum(optax.sigmoid_binary_cross_entropy(logits_BxK, targets_BxK), -1))


def defence_terms(
  cfg: Mapping, outputs: Mapping[str, jax.Array], z_BxK: jax.Array
) -> dict[str, jax.Array]:
  """The defence's loss terms (unweighted): ``adversary`` (the adversary's own loss), ``encoder``
  (the encoder's adversarial term) or ``declustering``."""
  name = cfg["name"]
  z = z_BxK.astype(jnp.float32)
  if name in ADVERSARIAL:
    terms = {"adversary": _bce_sum(outputs["adversary_logits"], z)}
    enc_logits = outputs["encoder_adversary_logits"]
    if name == "multidetasking":
      terms["encoder"] = _bce_sum(enc_logits, 1.0 - z)
    else:
      terms["encoder"] = -_bce_sum(enc_logits, z)
    return terms
  if name == "declustering":
    r = outputs["pooled_output"].astype(jnp.float32)
    r_other, z_other = jnp.roll(r, 1, axis=0), jnp.roll(z, 1, axis=0)
    hamming_B = jnp.mean(jnp.abs(z - z_other), -1)
    dist2_B = jnp.sum(jnp.square(r - r_other), -1)
    return {"declustering": jnp.mean((hamming_B - 0.5) * dist2_B)}
  return {}


def defended_loss(
  cfg: Mapping, main_loss: jax.Array, outputs: Mapping[str, jax.Array], z_BxK: jax.Array
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """alpha * main + the defence's weighted terms, and the terms as metrics."""
  terms = defence_terms(cfg, outputs, z_BxK)
  total = cfg["alpha"] * main_loss
  if "adversary" in terms:
    total = total + terms["adversary"] + cfg["beta"] * terms["encoder"]
    z = z_BxK.astype(jnp.float32)
    pred = (outputs["adversary_logits"] > 0).astype(jnp.float32)
    terms["adversary_accuracy"] = jnp.mean(pred == z)
  if "declustering" in terms:
    total = total + cfg["declustering_lambda"] * terms["declustering"]
  return total, {f"defence_{k}": v for k, v in terms.items()}


def is_adversary(path: tuple[str, ...]) -> bool:
  """Whether a parameter path belongs to the adversary (its own optimizer group)."""
  return bool(path) and path[0] == ADVERSARY
