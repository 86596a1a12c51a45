"""A parameters-only Orbax checkpoint: the weights, without optimizer state, step or input state.

For fine-tuning or serving elsewhere (another codebase, another mesh): the layout is

  <out>/params/            an Orbax StandardCheckpointer checkpoint of the params pytree
                           (encoder under "bert", head params beside it), float32 numpy
  <out>/model_config.json  BertConfig.to_dict()
  <out>/head.json          {"task", "num_labels", "labels"}
  <out>/vocab.txt | sentencepiece.model, tokenizer_config.json   (when there is a tokenizer)

Anyone with Orbax restores the weights with
``orbax.checkpoint.StandardCheckpointer().restore("<out>/params")`` (pass an abstract pytree
with shardings to place them on a mesh); :func:`restore_params_only` returns everything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from bert_jax.checkpoint import read_json, replace_dir
from bert_jax.formats.heads import HEAD_FILE, MODEL_CONFIG_FILE, write_model_files
from bert_jax.model.config import BertConfig
from bert_jax.tokenize import load_tokenizer

PARAMS_DIR = "params"


def export_params_only(
  out_dir: str,
  params: Mapping[str, Any],
  config: BertConfig,
  head: Mapping[str, Any],
  tokenizer=None,
  overwrite: bool = False,
) -> str:
  """Writes the layout above to ``out_dir``, whole or not at all (``replace_dir``: a non-empty
  ``out_dir`` is refused unless ``overwrite``, and then replaced as a whole)."""
  params = jax.tree_util.tree_map(np.asarray, dict(params))
  with replace_dir(out_dir, overwrite) as tmp:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(os.path.join(tmp, PARAMS_DIR), params)
    checkpointer.wait_until_finished()
    checkpointer.close()
    write_model_files(tmp, config, head, tokenizer)
  return out_dir


def restore_params_only(out_dir: str) -> tuple[dict[str, Any], BertConfig, dict[str, Any], Any]:
  """(params as numpy, BertConfig, head dict, tokenizer or None) from an export above."""
  config_path = os.path.join(out_dir, MODEL_CONFIG_FILE)
  if not os.path.isfile(config_path) or not os.path.isdir(os.path.join(out_dir, PARAMS_DIR)):
    raise FileNotFoundError(
      f"{out_dir} is not a parameters-only export (expected model_config.json and {PARAMS_DIR}/)"
    )
  config = BertConfig.from_dict(read_json(config_path), source=config_path)
  head = read_json(os.path.join(out_dir, HEAD_FILE))
  checkpointer = ocp.StandardCheckpointer()
  params = checkpointer.restore(os.path.join(os.path.abspath(out_dir), PARAMS_DIR))
  checkpointer.close()
  tokenizer = None
  if any(os.path.exists(os.path.join(out_dir, n)) for n in ("vocab.txt", "sentencepiece.model")):
    tokenizer = load_tokenizer(out_dir)
  return jax.tree_util.tree_map(np.asarray, params), config, head, tokenizer
