r"""The privacy probe's config (``python -m bert_jax.probe``; docs/probe.md).

  python -m bert_jax.probe --config configs/probe.py:cola_source --workdir /tmp/probe_cola \
      --config.data_dir=../shared/data/glue --config.init_checkpoint=/tmp/cola_finetuned
  python -m launch sweep --job=bert_jax.probe --config=configs/probe.py:stsb_genre \
      --workdir=/tmp/probe_sweep --sweep=MY_SWEEP.py -- --config.data_dir=../shared/data/glue \
      --config.init_checkpoint=PATH     # e.g. MY_SWEEP varies representation, layer and seed

The argument is an attribute preset, ``cola_source`` (task cola), ``stsb_genre`` (task stsb) or
``conll_per`` (task mrpc, ``private_attributes_file`` to set), or a GLUE task name (then set
``private_attributes``). The GLUE keys (``configs/glue.py``: ``task``, data, ``max_seq_length``,
``eval_batch_size``, ``seed``, ...) read the data; ``init_checkpoint`` is the frozen encoder. The
probe's own keys are below; ``learning_rate``, ``num_train_epochs``, ``train_batch_size``,
``warmup_proportion`` and the dropout rates are those of the direct baseline (the encoder
fine-tuned on the private attributes); the other training keys of the GLUE base are unused.
"""

from __future__ import annotations

import ml_collections

from configs import glue

PRESETS = {"cola_source": "cola", "stsb_genre": "stsb", "conll_per": "mrpc"}


def get_config(arg: str = "cola_source") -> ml_collections.ConfigDict:
  if arg in PRESETS:
    task, kind = PRESETS[arg], arg
  else:
    task, kind = arg, ""
  config = glue.get_config(task)  # validates the task name
  config.unlock()
  # The GLUE task's private attributes (configs/glue.py, bert_jax/tasks/privacy/attributes.py).
  config.private_attributes = kind
  if kind == "stsb_genre":
    config.num_private_attributes = 3  # STS-B has three genres
  # The frozen encoder: init_checkpoint (GLUE key) is a bert_jax workdir, a Hugging Face directory
  # or a TF checkpoint; of a fine-tuning workdir, "best" takes best/ (else the latest), "latest"
  # the latest checkpoint.
  config.which_checkpoint = "best"
  # r(x): "pooled" (the pooler's tanh output: what the classifier reads and the defences protect),
  # "cls" ([CLS] at `layer`), "mean" (masked mean over the tokens at `layer`) or "scalar_mix"
  # (ELMo's learned mix over embeddings + every layer, trained with the attacker, then pooled by
  # scalar_mix_pooling: "mean" or "cls").
  config.representation = "pooled"
  config.layer = -1  # for cls / mean: 0 = embeddings, 1..L the layers, -1 = the last
  config.scalar_mix_pooling = "mean"
  # The attacker (seed section 4.2): one hidden layer of 64 ReLU units, K sigmoid outputs, Adam
  # with Dynet's default learning rate, 16 epochs, the dev-worst-privacy epoch kept.
  config.attacker_hidden_size = 64
  config.attacker_learning_rate = 1e-3
  config.attacker_epochs = 16
  config.attacker_batch_size = 32
  # The seeded fraction of the task's train split held out as the attacker's dev set.
  config.dev_fraction = 0.1
  # True: only examples with at least one private attribute (train, dev and test), as the seed
  # does for its entity-presence attributes to avoid a very unbalanced data set.
  config.require_attribute = False
  # The direct baseline: encoder + attacker fine-tuned on z (the seed's trained upper bound).
  config.direct_baseline = True
  config.num_train_epochs = 3.0
  config.lock()
  return config
