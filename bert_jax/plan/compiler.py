"""Compile a run config's real train and eval steps for a TPU topology, without a TPU.

  result = compile_for_topology(config, parse_topology("v5e:16x16"))
  result["fits"], result["steps"][0]["memory"]["total_bytes"], ...

The job is the run's own (``build_job(config, abstract=True)``: model, loss, optimizer, phases),
assembled by the trainer's own code (abstract state by ``jax.eval_shape``, shardings from the
logical-axis rules, the jitted donated step) over a mesh of the topology's abstract devices, and
lowered and compiled by the XLA TPU compiler. Nothing is initialised, read or written.

The attention kernel is the run's (``config.attention_kernel`` resolved for the topology's chips,
``bert_jax.plan.attention.kernel_for``): the job is built over the topology's mesh, so its model
uses the kernel a run there would; each step's report names it, and a fused kernel the compiler
cannot see into (a custom call) has its FLOPs added to the estimate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import jax

from bert_jax import parallel
from bert_jax.parallel.topology import Topology, topology_devices
from bert_jax.plan import attention
from bert_jax.plan.report import StepReport, sharded_bytes, step_report
from bert_jax.runs.jobs import build_job
from bert_jax.runs.rules import check_run_config
from bert_jax.train import trainer


def check_config(config, topo: Topology, devices: list | None = None):
  """The checks a run makes of ``config`` before it starts, for a run on ``topo``, without
  compiling anything: the numbers' ranges and the batch layout on the mesh the config's sizes
  make of the topology's chips (``check_run_config``, the checks ``pretrain`` / ``finetune``
  make: the same one-line ValueError), the attention kernel (``attention.kernel_for``: e.g. a
  fused kernel with attention dropout), and the task builder's own checks (the abstract job:
  objective, mask rates, task name). ``bert_jax.compile``, its planner and the launcher's
  pre-flight call this before any compile. Returns the abstract job (built over the topology's
  mesh where the kernel is a fused one: ``devices``, default the topology's)."""
  kernel = _check(config, topo)
  mesh = None if kernel == "reference" else topology_mesh(config, topo, devices)
  return build_job(config, abstract=True, mesh=mesh)


def _check(config, topo: Topology) -> str:
  """``check_config``'s checks but the task builder's; the resolved attention kernel."""
  check_run_config(config)
  try:
    shape = parallel.resolve_mesh_shape(dict(config.mesh), topo.num_devices)
  except ValueError as e:
    raise ValueError(f"{topo.describe()}: {e}") from None
  check_run_config(config, dict(zip(parallel.MESH_AXES, shape)), processes=_processes(topo))
  return attention.kernel_for(config, topo)


def topology_mesh(config, topo: Topology, devices: list | None = None):
  """The run's mesh (``config.mesh``) over the topology's abstract devices (``devices``, default
  ``topology_devices(topo)``); ValueError naming the topology when the sizes do not fit."""
  devices = topology_devices(topo) if devices is None else devices
  try:
    return parallel.create_mesh(config.mesh, devices=devices)
  except ValueError as e:
    raise ValueError(f"{topo.describe()}: {e}") from None


def _processes(topo: Topology) -> int:
  """The processes a run on ``topo`` has: one per host."""
  return max(1, int(topo.num_hosts))


def compile_for_topology(
  config,
  topo: Topology,
  *,
  phases: list[int] | None = None,
  with_eval: bool = True,
  devices: list | None = None,
  on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
  """Compiles the train step of each phase in ``phases`` (default: all) and the eval step; a
  JSON-safe dict (see ``bert_jax.plan.report``). ValueError for a config a run would refuse
  (``check_config``'s checks) or that cannot be laid out on the topology (mesh sizes).
  ``on_step`` is told each step before it compiles ("train seq128 (1 of 3)")."""
  start = time.perf_counter()
  kernel = _check(config, topo)
  mesh = topology_mesh(config, topo, devices)
  job = build_job(config, abstract=True, mesh=mesh)  # the task's checks; a run's model there
  rules = parallel.normalize_rules(config.logical_axis_rules)
  asm = trainer.assemble(job, config, mesh, rules)
  params_bytes = sharded_bytes(asm.abstract_state.params)
  opt_bytes = sharded_bytes(asm.abstract_state.opt_state)
  dims = attention.attention_dims(asm.abstract_state.params)
  common = dict(
    params_bytes=params_bytes, opt_state_bytes=opt_bytes, compute_dtype=str(config.dtype),
    attention_kernel=kernel,
  )  # fmt: skip
  reports: list[StepReport] = []
  indices = list(range(len(job.program.phases)) if phases is None else phases)
  total = len(indices) + bool(with_eval)
  for n, i in enumerate(indices, 1):
    phase = job.program.phases[i]
    if on_step:
      on_step(f"train {phase.name} ({n} of {total})")
    reports.append(
      step_report(
        f"train {phase.name}",
        trainer.lower_train_step(asm, i),
        topo,
        mesh,
        model_flops=phase.flops_per_example * phase.global_batch_size,
        tokens=phase.global_batch_size * phase.seq_len,
        loop_trips=phase.grad_accum_steps,
        global_batch=phase.global_batch_size,
        fused_attention_flops=_fused_flops(kernel, dims, phase.batch_spec, True, config),
        **common,
      )
    )
  if with_eval and on_step:
    on_step(f"eval ({total} of {total})")
  lowered_eval = trainer.lower_eval_step(asm) if with_eval else None
  if lowered_eval is not None:
    last = job.program.phases[-1]
    batch = next(iter(job.program.eval_batch_spec.values())).shape[0]
    reports.append(
      step_report(
        "eval",
        lowered_eval,
        topo,
        mesh,
        model_flops=last.flops_per_example / 3 * batch,
        tokens=batch * last.seq_len,
        global_batch=batch,
        fused_attention_flops=_fused_flops(
          kernel, dims, job.program.eval_batch_spec, False, config
        ),
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
      for p in job.program.phases
    ],
    attention_kernel=kernel,
    steps=[r.to_dict() for r in reports],
    fits=all(r.fits for r in reports),
    seconds=time.perf_counter() - start,
    reports=reports,
  )


def _fused_flops(kernel: str, dims, spec, train: bool, config) -> float:
  """A fused kernel's FLOPs over one step of ``spec`` (its ``input_ids``: rows [x sequences per
  row] x length), all chips; 0 for the reference path."""
  if not attention.is_fused(kernel) or spec is None or "input_ids" not in spec:
    return 0.0
  shape = spec["input_ids"].shape
  return attention.fused_attention_flops(
    dims,
    batch=math.prod(shape[:-1]),
    seq_len=int(shape[-1]),
    train=train,
    remat=bool(config.get("remat", False)),
  )
