"""The one trainer and its machinery, knowing no task: ``trainer`` (assemble and run any
task's ``job.Job``), ``loop``, ``train_step``, ``state``, ``optimizers`` (schedules,
per-parameter groups), ``eval_history``, ``run_config`` (range checks), metrics and FLOPs.
Tasks, pre-training included, live in ``bert_jax.tasks``."""
