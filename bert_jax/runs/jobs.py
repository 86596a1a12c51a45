"""The trainer's ``Job`` of any run config: fine-tuning when it names a ``task``, else
pre-training."""

from __future__ import annotations

from typing import Any

from bert_jax.runs.finetuning.runner import build_finetune_job
from bert_jax.runs.pretraining.runner import build_pretraining_job


def build_job(config: Any, workdir: str | None = None, mesh: Any = None, *, abstract: bool = False):
  """The ``bert_jax.train.job.Job`` of ``config``. ``abstract=True`` (or no workdir): shapes
  only, for compiling the run's steps without its data (``python -m bert_jax.compile``);
  nothing is read or written."""
  if abstract:
    workdir = None
  if "task" in config:
    return build_finetune_job(config, workdir, mesh)
  return build_pretraining_job(config, workdir, mesh)
