"""SQuAD v1.1 / v2.0 fine-tuning configs (google-research/bert run_squad.py names).

  python -m bert_jax.finetune --config configs/squad.py:v1 --workdir /tmp/squad \
      --config.train_file=../shared/data/squad/sample-v1.1.json \
      --config.predict_file=../shared/data/squad/sample-v1.1.json --config.init_checkpoint=PATH

Defaults: lr 3e-5 and 2 epochs, as in google-research/bert's README commands for run_squad.py;
batch 32 (v1) / 48 (v2) as in the paper. The paper's recipes (sections 4.2, 4.3) differ in the
learning rate and, for v1.1, the epochs: v1.1 lr 5e-5, batch 32, 3 epochs; v2.0 lr 5e-5,
batch 48, 2 epochs. For them add ``--config.learning_rate=5e-5`` (and, for v1,
``--config.num_train_epochs=3``).
"""

from __future__ import annotations

import ml_collections

from configs.glue import finetune_base


def get_config(version: str = "v1") -> ml_collections.ConfigDict:
  if version not in ("v1", "v2"):
    raise ValueError(f"SQuAD version must be 'v1' or 'v2', got {version!r}")
  config = finetune_base(f"squad_{version}")
  config.train_file = ""  # official nested JSON, e.g. train-v1.1.json
  config.predict_file = ""  # dev JSON: split "dev"
  config.max_seq_length = 384
  config.doc_stride = 128
  config.max_query_length = 64
  config.n_best_size = 20
  config.max_answer_length = 30
  config.null_score_diff_threshold = 0.0  # v2 only; the best one on dev is reported too
  # Windows are packed to max_seq_length (doc_stride), so most batches would not shrink; off.
  # When set, the cut keeps every start/end position inside (see bert_jax/tasks/squad/task.py).
  config.length_buckets = ""
  config.learning_rate = 3e-5  # google-research/bert's README; the paper: 5e-5
  config.num_train_epochs = 2.0  # google-research/bert's README; the paper: 3 (v1.1), 2 (v2.0)
  config.train_batch_size = 32 if version == "v1" else 48  # the paper's
  config.eval_batch_size = 8
  config.lock()
  return config
