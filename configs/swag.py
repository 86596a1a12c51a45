"""SWAG fine-tuning config: 4-way multiple choice (paper section 4.4: lr 2e-5, batch 16, 3 epochs).

  python -m bert_jax.finetune --config configs/swag.py --workdir /tmp/swag \
      --config.train_file=../shared/data/swag/sample.csv \
      --config.dev_file=../shared/data/swag/sample.jsonl --config.init_checkpoint=PATH
"""

from __future__ import annotations

import ml_collections

from configs.glue import finetune_base


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  del arg
  config = finetune_base("swag")
  config.train_file = ""  # SWAG train.csv (or .jsonl)
  config.dev_file = ""  # val.csv
  config.test_file = ""  # test.csv (no labels)
  config.train_batch_size = 16
  config.eval_batch_size = 16
  config.learning_rate = 2e-5
  config.num_train_epochs = 3.0
  config.lock()
  return config
