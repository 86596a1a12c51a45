"""Compile a run config's real train and eval steps for a TPU topology, without a TPU.

  result = compile_for_topology(config, parse_topology("v5e:16x16"))
  result["fits"], result["steps"][0]["memory"]["total_bytes"], ...

The job is the run's own (``build_job(config, abstract=True)``: model, loss, optimizer, phases),
assembled by the trainer's own code (abstract state by ``jax.eval_shape``, shardings from the
logical-axis rules, the jitted donated step) over a mesh of the topology's abstract devices, and
lowered and compiled by the XLA TPU compiler. Nothing is initialised, read or written.
"""

from __future__ import annotations

import math
import time
from typing import Any

import jax

from bert_jax import parallel
from bert_jax.parallel.topology import Topology, topology_devices
from bert_jax.plan.report import StepReport, sharded_bytes, step_report
from bert_jax.tasks import build_job
from bert_jax.train import trainer


def _check_batches(job, mesh) -> None:
  dp = parallel.data_parallel_size(mesh)
  for phase in job.phases:
    batch, accum = phase.global_batch_size, phase.grad_accum_steps
    if accum < 1 or batch % accum or (batch // accum) % dp:
      raise ValueError(
        f"phase {phase.name}: global batch {batch} / grad_accum_steps {accum} is not a multiple "
        f"of the data-parallel size {dp} (mesh data={mesh.shape['data']} x "
        f"fsdp={mesh.shape['fsdp']})"
      )


def compile_for_topology(
  config,
  topo: Topology,
  *,
  phases: list[int] | None = None,
  with_eval: bool = True,
  devices: list | None = None,
) -> dict[str, Any]:
  """Compiles the train step of each phase in ``phases`` (default: all) and the eval step; a
  JSON-safe dict (see ``bert_jax.plan.report``). ValueError for a config that cannot be laid out
  on the topology (mesh sizes, batch divisibility)."""
  devices = topology_devices(topo) if devices is None else devices
  try:
    mesh = parallel.create_mesh(config.mesh, devices=devices)
  except ValueError as e:
    raise ValueError(f"{topo.describe()}: {e}") from None
  rules = parallel.normalize_rules(config.logical_axis_rules)
  start = time.perf_counter()
  job = build_job(config, abstract=True)
  _check_batches(job, mesh)
  asm = trainer.assemble(job, config, mesh, rules)
  params_bytes = sharded_bytes(asm.abstract_state.params)
  opt_bytes = sharded_bytes(asm.abstract_state.opt_state)
  common = dict(
    params_bytes=params_bytes, opt_state_bytes=opt_bytes, compute_dtype=str(config.dtype)
  )
  reports: list[StepReport] = []
  for i in range(len(job.phases)) if phases is None else phases:
    phase = job.phases[i]
    reports.append(
      step_report(
        f"train {phase.name}",
        trainer.lower_train_step(asm, i),
        topo,
        mesh,
        model_flops=phase.flops_per_example * phase.global_batch_size,
        tokens=phase.global_batch_size * phase.seq_len,
        loop_trips=phase.grad_accum_steps,
        **common,
      )
    )
  lowered_eval = trainer.lower_eval_step(asm) if with_eval else None
  if lowered_eval is not None:
    last = job.phases[-1]
    batch = next(iter(job.eval_batch_spec.values())).shape[0]
    reports.append(
      step_report(
        "eval",
        lowered_eval,
        topo,
        mesh,
        model_flops=last.flops_per_example / 3 * batch,
        tokens=batch * last.seq_len,
        **common,
      )
    )
  num_params = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(asm.abstract_state.params))
  return dict(
    topology=topo.to_dict(),
    mesh=dict(mesh.shape),
    num_params=int(num_params),
    phases=[
      dict(
        name=p.name,
        global_batch_size=p.global_batch_size,
        grad_accum_steps=p.grad_accum_steps,
        seq_len=p.seq_len,
        flops_per_example=p.flops_per_example,
      )
      for p in job.phases
    ],
    steps=[r.to_dict() for r in reports],
    fits=all(r.fits for r in reports),
    seconds=time.perf_counter() - start,
    reports=reports,
  )
