"""Compatibility only: moved to ``bert_jax.formats`` (``bert_jax.formats.pretrained``). Delete
once no caller imports ``bert_jax.checkpoint.pretrained``."""

from bert_jax.formats.pretrained import CheckpointError, Pretrained, detect, load_pretrained

__all__ = ["CheckpointError", "Pretrained", "detect", "load_pretrained"]
