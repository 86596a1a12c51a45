"""Compatibility only: ``export`` moved to ``bert_jax.formats`` (it takes the resolved checkpoint
directory; ``bert_jax.tasks.best_checkpoint.checkpoint_dir`` resolves a fine-tuning workdir's
best/latest). Delete once no caller imports ``bert_jax.checkpoint.exporter``."""

from bert_jax import formats
from bert_jax.formats import FORMATS
from bert_jax.tasks.best_checkpoint import checkpoint_dir


def export(path, fmt, output, task=None, overwrite=False, checkpoint="best"):
  """The former signature: ``path`` is resolved to its best (or latest) checkpoint first."""
  return formats.export(checkpoint_dir(path, checkpoint), fmt, output, task, overwrite)


__all__ = ["FORMATS", "checkpoint_dir", "export"]
