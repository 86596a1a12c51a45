"""Run state: the Orbax checkpoints of a bert_jax run and where its parameters come from.

``CheckpointManager`` / ``restore_or_initialize`` / ``InitReport`` / ``merge_pretrained_params``
/ ``load_params`` (``manager.py``); ``write_json`` / ``read_json`` and the atomic writers
(``files.py``). Interchange formats (Hugging Face, TF, SavedModel, params-only, export) live in
``bert_jax.formats``, which imports this package (never the reverse). Compatibility modules
``pretrained.py`` / ``exporter.py`` re-export the moved names until their last callers switch.
"""

from bert_jax.checkpoint.files import (
  atomic_write,
  ensure_replaceable,
  read_json,
  replace_dir,
  write_json,
)
from bert_jax.checkpoint.manager import (
  CheckpointManager,
  CheckpointSaveError,
  InitReport,
  load_params,
  merge_pretrained_params,
  restore_or_initialize,
)

__all__ = [
  "CheckpointManager",
  "CheckpointSaveError",
  "InitReport",
  "atomic_write",
  "ensure_replaceable",
  "load_params",
  "merge_pretrained_params",
  "read_json",
  "replace_dir",
  "restore_or_initialize",
  "write_json",
]
