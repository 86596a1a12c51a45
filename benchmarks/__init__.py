"""Benchmarks of bert_jax, by purpose: ``speed`` (throughput of steps, heads, input pipelines,
tokenizers), ``quality`` (accuracy against the papers and the peers), ``profile`` (where time and
memory go; the planner and its estimator), ``device`` (runs on an accelerator), ``reliability``
(kills and resumes). ``common`` holds what they share. Run one as
``python -m benchmarks.<group>.<name>`` from the repository's root."""
