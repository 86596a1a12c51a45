"""Tasks: what a model learns and how it is scored. A subpackage per family.

- ``base.py``: the ``Task`` contract every fine-tuning task implements (data, head, loss,
  metrics, outputs); ``registry.py``: config ``task`` names -> Task classes.
- ``glue/``, ``squad/``, ``ner/``, ``swag/``: the paper's fine-tuning tasks (data, features,
  head, loss, metrics, outputs); ``metrics.py``: the metrics they share.
- ``pretraining/``: the pre-training objective (MLM + NSP and its ablations): its data
  (records, dynamic masking, packing) and loss.
- ``privacy/``: private attributes and the defences (a mix-in a classification task opts into).

How a task is run (its Job, its config rules) lives in ``bert_jax/runs/``; what runs a trained
encoder besides fine-tuning (features, next-token prediction, the privacy probe) in
``bert_jax/tools/``. Both import tasks; nothing here imports them.
"""

from __future__ import annotations

from bert_jax.tasks.base import SplitData, Task
from bert_jax.tasks.registry import GLUE_TASKS, TASKS, create_task, get_task_class

__all__ = ["GLUE_TASKS", "TASKS", "SplitData", "Task", "create_task", "get_task_class"]
