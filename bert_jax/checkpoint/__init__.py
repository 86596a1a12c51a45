"""Checkpoints: Hugging Face and google-research/bert import/export, and the Orbax manager.

``load_pretrained(path)`` reads a bert_jax workdir, a Hugging Face directory or a TensorFlow
checkpoint; ``save_hf(directory, params, config, tokenizer, head=...)`` writes a Hugging Face
directory. The Orbax manager lives in ``bert_jax.checkpoint.manager`` (import it directly).
"""

from bert_jax.checkpoint.hf import TASKS, CheckpointError, save_hf
from bert_jax.checkpoint.pretrained import Pretrained, detect, load_pretrained

__all__ = ["TASKS", "CheckpointError", "Pretrained", "detect", "load_pretrained", "save_hf"]
