"""``PrivacyDefended``: a classification task fine-tuned with a defence of its private attributes.

A mix-in a classification ``Task`` opts into by inheritance, listed before the task's class so
that its hooks run first and reach the plain task through ``super()``::

  class GlueTask(PrivacyDefended, GlueClassification): ...

It reads ``config.defence`` (``name``, ``alpha``, ``beta``, ``declustering_lambda``,
``adversary_hidden_size``, ``adversary_learning_rate``; configs/glue.py) and
``config.num_private_attributes``, and holds everything a defence changes
(``bert_jax.tasks.privacy.defences`` has the terms, the paper and the sign conventions):

``init_variables``      the adversary's parameters under params["adversary"] (adversarial
                        defences), initialised from ``fold_in(rng, 1)``
``apply``               the model on params without the adversary, plus the adversary's logits
``optimizer_groups``    the adversary's own optimizer (``adversary_learning_rate``)
``loss``                alpha * the task's loss + the defence's terms; metrics gain
                        ``main_loss`` and ``defence_*``
``target_spec``         the int32 [B, K] ``private`` array the loss reads
``load_split``          the training split must hold every attribute (``check_support``)
``packing_unsupported`` a defence is not packed (the adversary reads one pooled output per row)

With ``config.defence.name`` empty every hook is the plain task's. The task supplies
``private_attributes`` (a ``PrivateAttributes``, or None), the int32 [N, K] ``private`` array in
its labelled splits' ``SplitData.arrays``, ``pooled_output`` (r(x)) among ``apply``'s outputs,
and ``describe_split(split)``, how errors name a split (e.g. "CoLA train").
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.tasks.base import SplitData
from bert_jax.tasks.privacy import attributes as PA
from bert_jax.tasks.privacy import defences as D
from bert_jax.train.optimizers import OptimizerGroup


class PrivacyDefended:
  """Mix-in: ``config.defence`` applied to a classification task (see the module docstring)."""

  def __init__(self, config, tokenizer):
    super().__init__(config, tokenizer)
    D.check_defence(config.defence, bool(config.private_attributes))
    self.defence: str = config.defence.name
    self.adversary: D.Adversary | None = None
    if self.defence in D.ADVERSARIAL:
      self.adversary = D.Adversary(
        int(config.num_private_attributes), int(config.defence.adversary_hidden_size)
      )

  def packing_unsupported(self) -> str:
    if self.defence:
      return (
        f"config.defence.name={self.defence!r} cannot be packed (use config.packing.enabled=False)"
      )
    return super().packing_unsupported()

  def init_variables(self, model, rng, batch_size: int):
    variables = super().init_variables(model, rng, batch_size)
    if self.adversary is None:
      return variables
    hidden = model.config.hidden_size
    adversary = self.adversary.init(jax.random.fold_in(rng, 1), jnp.zeros((1, hidden)))
    return {**variables, "params": {**variables["params"], D.ADVERSARY: adversary["params"]}}

  def apply(self, model, params, batch, deterministic, rng=None):
    if self.adversary is None:
      return super().apply(model, params, batch, deterministic, rng)
    main = {k: v for k, v in params.items() if k != D.ADVERSARY}
    outputs = super().apply(model, main, batch, deterministic, rng)
    return {**outputs, **D.adversary_outputs(self.adversary, params, outputs["pooled_output"])}

  def optimizer_groups(self) -> dict[str, OptimizerGroup]:
    groups = super().optimizer_groups()
    if self.adversary is None:
      return groups
    lr = float(self.config.defence.adversary_learning_rate)
    return {**groups, D.ADVERSARY: OptimizerGroup(D.is_adversary, lr)}

  def load_split(self, split: str) -> SplitData:
    data = super().load_split(split)
    if self.defence and split == self.train_split and "private" in data.arrays:
      # The adversary (or the clustering) would learn nothing of an attribute with no row.
      PA.check_support(
        data.arrays["private"],
        self.private_attributes.names,
        self.describe_split(split),
        "use rows that have it (config.train_sample_seed >= 0 samples the train file "
        "uniformly) or fewer attributes (config.num_private_attributes)",
      )
    return data

  def target_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    spec = super().target_spec(batch_size)
    if self.defence:
      k = int(self.config.num_private_attributes)  # what PA.fit returns, so no data is read
      spec["private"] = jax.ShapeDtypeStruct((batch_size, k), np.int32)
    return spec

  def loss(self, outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]):
    loss, metrics = super().loss(outputs, batch)
    if not self.defence:
      return loss, metrics
    total, terms = D.defended_loss(self.config.defence, loss, outputs, batch["private"])
    return total, {**metrics, "main_loss": loss, **terms}
