"""Compile a run for a TPU topology without a TPU, report it per chip, plan the mesh layout.

  compiler.compile_for_topology(config, topo)  -> memory, FLOPs, collectives, est. step time
  planner.make_plan(config, topo)               -> every layout tried, fastest that fits first

Entry point: ``python -m bert_jax.compile`` (docs/compile.md).
"""
