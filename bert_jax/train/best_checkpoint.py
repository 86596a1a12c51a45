"""Which checkpoint of a fine-tuning workdir to use: its best on dev, or its latest.

Fine-tuning keeps, besides ``<workdir>/checkpoints/`` (the latest, for resuming), the checkpoint
that scored best on dev in ``<workdir>/best/`` (itself a workdir: ``checkpoints/``,
``model_config.json``, ``head.json``, tokenizer). Export, evaluation and feature extraction take
the best one by default.
"""

from __future__ import annotations

import os

from bert_jax.train.trainer import BEST_DIR

CHOICES = ("best", "latest")


def has_checkpoint(workdir: str) -> bool:
  """``workdir/checkpoints`` holds at least one step."""
  ckpt = os.path.join(workdir, "checkpoints")
  return os.path.isdir(ckpt) and any(n.isdigit() for n in os.listdir(ckpt))


def checkpoint_dir(workdir: str, which: str = "best") -> str:
  """``<workdir>/best`` where ``which`` is "best" and it holds a checkpoint, else ``workdir``
  (its latest checkpoint; also any path that is not a fine-tuning workdir, such as a Hugging
  Face directory)."""
  if which not in CHOICES:
    raise ValueError(f"checkpoint {which!r} is not one of {CHOICES}")
  best = os.path.join(workdir, BEST_DIR)
  if which == "best" and has_checkpoint(best):
    return best
  return workdir
