"""Training machinery shared by every entry point: optimizers and schedules, the train state,
the generic train step, the loop (see ``bert_jax.train.loop`` for how a task plugs in),
metrics/FLOPs, and pre-training itself (``bert_jax.train.pretraining.run_pretraining``)."""
