"""Original google-research/bert TensorFlow checkpoints -> Hugging Face-named tensors.

A google-research/bert directory holds ``bert_config.json``, ``bert_model.ckpt.{index,data-*}``
and ``vocab.txt``. Variables are read with ``tf.train.load_checkpoint`` and renamed onto the
Hugging Face names of ``hf.py`` (TF dense kernels are ``[in, out]``: they are transposed to
PyTorch's ``[out, in]``), so both imports share one validation. Optimizer slots (``adam_m``,
``adam_v``) and ``global_step`` are skipped; any other unknown variable is an error.
Fine-tuned checkpoints of the original scripts import too: ``run_classifier.py``'s
``output_weights``/``output_bias`` as a sequence classifier and ``run_squad.py``'s
``cls/squad/output_*`` as a question-answering head.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np

from bert_jax.formats.heads import CheckpointError, listing

SKIPPED = re.compile(
  r"(^global_step$|/adam_[mv]$|^_CHECKPOINTABLE_OBJECT_GRAPH$|"
  r"^beta[12]_power$|/(Adam|Adam_1|Momentum)$)"
)
_RENAMES = [
  # (TF pattern, HF replacement); applied in order, first match wins.
  (
    r"^bert/embeddings/(word|position|token_type)_embeddings$",
    r"bert.embeddings.\1_embeddings.weight",
  ),
  (r"^bert/embeddings/LayerNorm/(gamma|beta)$", r"bert.embeddings.LayerNorm.\1"),
  (r"^bert/encoder/layer_(\d+)/(.*)$", r"bert.encoder.layer.\1.\2"),
  (r"^bert/pooler/dense/(.*)$", r"bert.pooler.dense.\1"),
  (r"^cls/predictions/transform/(.*)$", r"cls.predictions.transform.\1"),
  (r"^cls/predictions/output_bias$", r"cls.predictions.bias"),
  (r"^cls/seq_relationship/output_weights$", r"cls.seq_relationship.weight"),
  (r"^cls/seq_relationship/output_bias$", r"cls.seq_relationship.bias"),
  (r"^cls/squad/output_weights$", r"qa_outputs.weight"),
  (r"^cls/squad/output_bias$", r"qa_outputs.bias"),
  (r"^output_weights$", r"classifier.weight"),
  (r"^output_bias$", r"classifier.bias"),
]


def find_checkpoint(path: pathlib.Path) -> str | None:
  """The checkpoint prefix of a directory or prefix path, or None if there is none."""
  if path.is_dir():
    try:
      import tensorflow as tf  # noqa: PLC0415 (heavy; optional here: no TF, no TF checkpoint)
    except ImportError:
      return None
    latest = tf.train.latest_checkpoint(str(path))
    if latest:
      return latest
    indexes = sorted(path.glob("*.ckpt*.index")) or sorted(path.glob("*.index"))
    return str(indexes[-1])[: -len(".index")] if indexes else None
  if pathlib.Path(str(path) + ".index").is_file():
    return str(path)
  if str(path).endswith(".index") and path.is_file():
    return str(path)[: -len(".index")]
  return None


def tf_to_hf_name(name: str) -> str | None:
  for pattern, repl in _RENAMES:
    if re.match(pattern, name):
      new = re.sub(pattern, repl, name).replace("/", ".")
      new = new.replace(".kernel", ".weight")
      return re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", new))
  return None


def read_tf_checkpoint(prefix: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """All model variables of a TF checkpoint as Hugging Face-named, PyTorch-laid-out tensors.

  Returns ``(tensors, original)``; ``original[hf_name]`` is the variable's name in the checkpoint.
  """
  import tensorflow as tf  # noqa: PLC0415 (heavy; only to read a TF checkpoint)

  try:
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
  except (tf.errors.OpError, ValueError) as e:
    raise CheckpointError(
      f"{prefix}: not a readable TensorFlow checkpoint: {str(e).splitlines()[0]}"
    ) from e
  tensors, original, unknown = {}, {}, []
  for name in sorted(shapes):
    if SKIPPED.search(name):
      continue
    hf_name = tf_to_hf_name(name)
    if hf_name is None:
      unknown.append(name)
      continue
    try:
      x = np.asarray(reader.get_tensor(name))
    except tf.errors.OpError as e:
      raise CheckpointError(
        f"{prefix}: cannot read variable '{name}' (truncated data file?): {str(e).splitlines()[0]}"
      ) from e
    # TF dense kernels are [in, out]; output_weights of the heads are already [out, in].
    if name.endswith("/kernel"):
      x = x.T
    tensors[hf_name], original[hf_name] = x, name
  if unknown:
    raise CheckpointError(
      f"{prefix}: unknown variable(s) for a google-research/bert checkpoint: {listing(unknown)}"
    )
  return tensors, original
