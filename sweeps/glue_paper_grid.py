r"""The paper's fine-tuning grid (Devlin et al. 2019, appendix A.3), times seeds.

learning rate 5e-5 / 4e-5 / 3e-5 / 2e-5 x batch size 16 / 32 x epochs 2 / 3 / 4 x ``arg`` seeds
(default 5): 24 configurations, 120 runs. The best configuration on dev is the one to report.

  python -m launch sweep --job=finetune --config=configs/glue.py:rte --workdir=/tmp/rte_grid \
      --sweep=sweeps/glue_paper_grid.py:5 --parallel=2 -- \
      --config.init_checkpoint=/path/to/pretrained
"""

from launch import sweep


def get_sweep(arg: str = ""):
  seeds = int(arg) if arg else 5
  return sweep.product(
    sweep.axis("learning_rate", [5e-5, 4e-5, 3e-5, 2e-5]),
    sweep.axis("train_batch_size", [16, 32]),
    sweep.axis("num_train_epochs", [2, 3, 4]),
    sweep.axis("seed", range(seeds)),
  )
