"""Interchange formats: Hugging Face, google-research/bert TensorFlow, SavedModel, params-only.

``load_pretrained(path)`` reads a bert_jax workdir, a parameters-only export, a Hugging Face
directory or a TensorFlow checkpoint (``detect`` says which); ``save_hf(directory, params,
config, tokenizer, head=...)`` writes a Hugging Face directory; ``export(checkpoint_dir, fmt,
output)`` writes any of ``FORMATS``. The run state (Orbax checkpoints of a run) is
``bert_jax.checkpoint``.
"""

from bert_jax.formats.exporter import FORMATS, export
from bert_jax.formats.heads import TASKS, CheckpointError
from bert_jax.formats.hf import save_hf
from bert_jax.formats.pretrained import Pretrained, detect, load_pretrained

__all__ = [
  "FORMATS",
  "TASKS",
  "CheckpointError",
  "Pretrained",
  "detect",
  "export",
  "load_pretrained",
  "save_hf",
]
