"""Feature-based NER (paper section 5.4): frozen BERT features -> trained 2-layer BiLSTM tagger.

  python -m bert_jax.finetune --config configs/ner_feature_based.py:concat_last_four \
      --workdir /tmp/fb --config.train_file=../shared/data/conll2003/train.txt \
      --config.dev_file=../shared/data/conll2003/dev.txt --config.init_checkpoint=PATH

The argument is the feature: layer (with --config.feature_layer=-1 last, -2 second-to-last,
0 embeddings), sum_last_four, concat_last_four (the paper's best), sum_all, scalar_mix (ELMo's
learned softmax-weighted mix of all num_hidden_layers + 1 hidden states, embeddings included,
times a learned scale; metrics.json's "param_report" gives the learned weights).
"""

from __future__ import annotations

import ml_collections

from configs.glue import finetune_base
from configs.ner import ner_fields


def get_config(feature_mode: str = "concat_last_four") -> ml_collections.ConfigDict:
  config = ner_fields(finetune_base("ner_feature_based"))
  config.feature_mode = feature_mode
  config.feature_layer = -1
  config.lstm_hidden_size = 768  # per direction, as the paper
  config.lstm_num_layers = 2
  config.learning_rate = 1e-3  # only the BiLSTM and classifier train
  config.lock()
  return config
