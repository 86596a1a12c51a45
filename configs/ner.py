"""NER fine-tuning config (CoNLL-format files; paper section 5.3), scored as conlleval.

  python -m bert_jax.finetune --config configs/ner.py --workdir /tmp/conll \
      --config.train_file=../shared/data/conll2003/train.txt \
      --config.dev_file=../shared/data/conll2003/dev.txt --config.init_checkpoint=PATH
  # A file without a dev split: hold out 10% of its sentences (seeded) as dev.
  python -m bert_jax.finetune --config configs/ner.py --workdir /tmp/sci \
      --config.train_file=../shared/data/ner_sci/bert_paper.bio --config.dev_fraction=0.1 \
      --config.skip_malformed_lines=True      # the file has one line without a tag

``--config.packing.enabled=True`` packs several rows into one (configs/glue.py:finetune_base, where the
key and ``max_sequences_per_row`` are defined for every fine-tuning config): the same loss over
the same labelled pieces and the same dev metrics, for fewer padded positions.
"""

from __future__ import annotations

import ml_collections

from configs.glue import finetune_base


def ner_fields(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  config.train_file = ""
  config.dev_file = ""
  config.test_file = ""
  config.dev_fraction = 0.0  # > 0 with no dev_file: hold out this share of train sentences
  config.split_seed = 0  # seed of that split
  config.labels = ""  # comma-separated tag set; "" = the tags of train_file
  config.skip_malformed_lines = False  # True: drop (and count) lines without a valid tag
  config.learning_rate = 5e-5
  config.train_batch_size = 32
  config.num_train_epochs = 3.0
  return config


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  del arg
  config = ner_fields(finetune_base("ner"))
  config.lock()
  return config
