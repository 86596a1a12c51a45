r"""A 4-run smoke sweep (2 learning rates x 2 seeds) for trying the sweep machinery quickly.

  python -m launch sweep --job=finetune --config=configs/glue.py:rte --workdir=/tmp/rte_smoke \
      --sweep=sweeps/glue_smoke.py --parallel=2 -- \
      --config.data_dir=../shared/data/glue --config.vocab_file=PATH/vocab.txt \
      --config.max_train_examples=64 --config.max_eval_examples=64 --config.max_seq_length=64 \
      --config.num_train_epochs=1 --config.train_batch_size=16 --config.predict_test=false
"""

from launch import sweep


def get_sweep(arg: str = ""):
  del arg  # unused
  return sweep.product(sweep.axis("learning_rate", [1e-3, 1e-4]), sweep.axis("seed", [0, 1]))
