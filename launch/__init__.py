"""Launching bert_jax jobs: local multi-process, Cloud TPU VMs, SLURM, Kubernetes, and sweeps.

Command line: ``python -m launch run|sweep|results`` (see docs/launch.md). Library:
``launch.job.Job``, ``launch.launch.launch``, ``launch.targets.make_target``, ``launch.sweep``
and ``launch.results``. Nothing in bert_jax imports this package.
"""
