"""Writing an export directory whole or not at all, with the model files every export carries.

with staged_dir(out_dir, overwrite, prefix=".saved_model_") as tmp:
  ...write into tmp...
  write_model_files(tmp, config, head, tokenizer)
# out_dir now holds exactly what was written; on any error it is left as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from bert_jax.model.config import BertConfig


@contextlib.contextmanager
def staged_dir(out_dir: str, overwrite: bool, prefix: str) -> Iterator[str]:
  """Yields a temporary directory beside ``out_dir`` that replaces it when the block succeeds.

  A non-empty ``out_dir`` is an error unless ``overwrite``; checked before anything is written.
  """
  if os.path.exists(out_dir) and os.listdir(out_dir) and not overwrite:
    raise FileExistsError(f"{out_dir} exists and is not empty (pass overwrite=True)")
  parent = os.path.dirname(os.path.abspath(out_dir))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
  try:
    yield tmp
    if os.path.exists(out_dir):
      shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def write_model_files(
  directory: str, config: BertConfig, head: Mapping[str, Any], tokenizer=None
) -> None:
  """``model_config.json``, ``head.json`` and the tokenizer's files (when there is one)."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "model_config.json"), "w") as f:
    json.dump(config.to_dict(), f, indent=2, sort_keys=True)
  with open(os.path.join(directory, "head.json"), "w") as f:
    json.dump(dict(head), f, indent=2)
  if tokenizer is not None:
    tokenizer.save(directory)
