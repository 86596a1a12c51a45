"""Run state: the Orbax checkpoints of a bert_jax run and where its parameters come from.

``CheckpointManager`` / ``restore_or_initialize`` / ``InitReport`` / ``merge_pretrained_params``
/ ``load_params`` (``manager.py``); ``write_json`` / ``read_json`` and the atomic writers
(``files.py``). Interchange formats (Hugging Face, TF, SavedModel, params-only, export) live in
``bert_jax.formats``; the names re-exported below from there are kept only until every caller
imports them from ``bert_jax.formats``.
"""

from bert_jax.checkpoint.files import read_json, write_json
from bert_jax.checkpoint.hf import TASKS, CheckpointError, save_hf  # compatibility, see above
from bert_jax.checkpoint.manager import (
  CheckpointManager,
  InitReport,
  load_params,
  merge_pretrained_params,
  restore_or_initialize,
)
from bert_jax.checkpoint.pretrained import Pretrained, detect, load_pretrained  # compatibility

__all__ = [
  "CheckpointManager",
  "InitReport",
  "load_params",
  "merge_pretrained_params",
  "read_json",
  "restore_or_initialize",
  "write_json",
  "TASKS",
  "CheckpointError",
  "Pretrained",
  "detect",
  "load_pretrained",
  "save_hf",
]
