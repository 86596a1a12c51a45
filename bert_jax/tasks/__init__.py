"""Tasks, a subpackage per family; each builds the trainer's ``Job`` from a run config.

- ``base.py``: the ``Task`` contract every fine-tuning task implements.
- ``registry.py``: config ``task`` names -> Task classes (imported when asked for).
- ``jobs.py``: ``build_job(config)``, any run config's Job (fine-tuning or pre-training).
- ``pretraining/``: MLM + NSP and its ablations, the curriculum, packing, its data.
- ``finetuning/``: what every fine-tuning task shares: the run (train, evaluate, predict),
  batches (length buckets, packing), best-checkpoint selection, metrics.
- ``glue/``, ``squad/``, ``ner/``, ``swag/``: the paper's fine-tuning tasks (data, features,
  model, loss, metrics, outputs).
- ``privacy/``: the private-attribute defences (a mix-in classification tasks opt into) and
  the probe.
- ``inference/``: one bucketed, sharded inference path (``InferenceBatches``) and what runs on
  it besides evaluation: feature extraction, next-token prediction.
"""

from __future__ import annotations

from bert_jax.tasks.base import SplitData, Task
from bert_jax.tasks.registry import GLUE_TASKS, TASKS, create_task, get_task_class

__all__ = ["GLUE_TASKS", "TASKS", "SplitData", "Task", "create_task", "get_task_class"]
