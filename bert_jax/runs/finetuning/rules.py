"""What a fine-tuning run config must hold beyond every run's (``bert_jax.train.run_config``).

  FINETUNING_RULES    epochs and warmup proportion; num_train_steps 0 and num_warmup_steps -1
                      are its documented sentinels (from the epochs, from the proportion)

Light: the launcher's pre-flight and ``bert_jax.compile`` read these before anything is built.
"""

from __future__ import annotations

from bert_jax.train.run_config import GENERIC_RULES, finite

FINETUNING_RULES = GENERIC_RULES.extended(
  ("num_train_epochs", lambda v: finite(v) and v > 0, "a positive number"),
  ("warmup_proportion", lambda v: finite(v) and 0 <= v <= 1, "in [0, 1]"),
  after="grad_accum_steps",
).extended(
  ("num_warmup_steps", lambda v: v >= -1, ">= -1"),
  ("num_train_steps", lambda v: v >= 0, ">= 0"),
)
