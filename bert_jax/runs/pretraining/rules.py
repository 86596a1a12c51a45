"""What pre-training's run config must hold beyond every run's (``bert_jax.train.run_config``).

  PRETRAINING_RULES        masking, predictions per row, phase 2's keys, steps and warmup
  resume_fixed_keys(config)    the keys a resume may not change (the input position's layout)

Light: the launcher's pre-flight and ``bert_jax.compile`` read these before anything is built.
"""

from __future__ import annotations

from bert_jax.train.run_config import GENERIC_RULES, finite


def _phase2_batches(config) -> list[tuple[str, str]]:
  """Phase 2's batch (and its accumulation key) where the run has a phase 2."""
  if "phase2" in config and config.phase2.get("fraction", 0) > 0:
    return [("phase2.train_batch_size", "phase2.grad_accum_steps")]
  return []


PRETRAINING_RULES = (
  GENERIC_RULES.extended(
    ("masked_lm_prob", lambda v: finite(v) and 0 < v < 1, "in (0, 1)"),
    ("max_predictions_per_seq", lambda v: v > 0, "positive"),
    after="eval_every_steps",
  )
  .extended(
    ("phase2.fraction", lambda v: finite(v) and 0 <= v < 1, "in [0, 1)"),
    ("phase2.train_batch_size", lambda v: v > 0, "positive"),
    ("phase2.grad_accum_steps", lambda v: v >= 1, ">= 1"),
    ("phase2.num_warmup_steps", lambda v: v >= 0, ">= 0"),
    ("phase2.learning_rate", lambda v: finite(v) and v != 0, "> 0 (or < 0: continue phase 1's)"),
    after="attention_kernel",
  )
  .extended(
    ("num_warmup_steps", lambda v: v >= 0, ">= 0"),
    ("num_train_steps", lambda v: v >= 1, ">= 1"),
    batches=_phase2_batches,
  )
)


def resume_fixed_keys(config) -> tuple[str, ...]:
  """The config keys a resume may not change (the checkpoint's input position is a position in
  rows packed, or not, with these): whether rows are packed, and each packed phase's
  sequences per row."""
  keys = ("packing.enabled",)
  if config.packing.enabled:
    keys += ("packing.max_sequences_per_row",)
    if config.phase2.fraction > 0:
      keys += ("phase2.max_sequences_per_row",)
  return keys
