"""The pre-training step as a run builds it, on synthetic batches, for the benchmarks that time it
on a device (profile.calibration, profile.step_trace); and one model's step on its own state
(``PretrainingStepper``, for speed.pretrain and speed.packing).

  config = synthetic_config("base", [128], [256], "bfloat16")
  run = assemble_run(config, workdir)            # the run's job, jitted steps and initial state
  batches = global_batches(run, phase=0)
  times, first, state = time_steps(run.asm.train_steps[0], run.state, batches, 10, 3)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from benchmarks.common.timing import Timer
from bert_jax import parallel
from bert_jax.runs.jobs import build_job
from bert_jax.train import trainer
from bert_jax.train.state import init_train_state
from bert_jax.train.train_step import jit_train_step, make_train_step
from configs import pretrain


def synthetic_config(size: str, seqs: list[int], batches: list[int], dtype: str):
  """The preset's pre-training config on synthetic batches: phase 1 at seqs[0] x batches[0],
  phase 2 (when given) at seqs[1] x batches[1]."""
  config = pretrain.get_config(size)
  config.synthetic_data = True
  config.num_train_steps = 1000
  config.max_seq_length = seqs[0]
  config.train_batch_size = batches[0]
  config.max_predictions_per_seq = 20 if seqs[0] <= 128 else 80
  config.dtype = dtype
  config.phase2.fraction = 0.1 if len(seqs) > 1 else 0.0
  if len(seqs) > 1:
    config.phase2.max_seq_length = seqs[1]
    config.phase2.train_batch_size = batches[1]
  return config


@dataclasses.dataclass
class Run:
  job: Any
  asm: trainer.Assembled
  state: Any
  mesh: jax.sharding.Mesh
  rules: Any


def assemble_run(config, workdir: str, devices=None) -> Run:
  """The run's job (with its synthetic input), its jitted steps and a fresh state, over a mesh
  of ``devices`` (default: jax's)."""
  mesh = parallel.create_mesh(config.mesh, devices=devices)
  rules = parallel.normalize_rules(config.logical_axis_rules)
  job = build_job(config, workdir, mesh)
  asm = trainer.assemble(job, config, mesh, rules)
  return Run(job, asm, asm.init_state(), mesh, rules)


def global_batches(run: Run, phase: int, n: int = 2) -> list[dict]:
  it = run.job.program.phases[phase].make_input()
  return [parallel.make_global_batch(next(it), run.mesh, run.rules) for _ in range(n)]


def time_steps(step, state, batches, steps: int, repeats: int):
  """Seconds per step of ``repeats`` timings of ``steps`` steps each, after one warm-up step
  (which compiles ``step`` if it is a jitted function), the warm-up's seconds and the state."""

  def call(i):
    nonlocal state
    state, metrics = step(state, batches[i % len(batches)])
    return state, metrics

  timing = Timer(warmup=1, repeats=repeats, calls=steps).time(call)
  return timing.times, timing.first, state


def peak_bytes(device) -> float | None:
  """The allocator's high-water mark on ``device`` since the process started (GPUs, TPUs;
  None where jax keeps no such statistics, e.g. on the CPU)."""
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  return float(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


class PretrainingStepper:
  """A model's donated train step on its own fresh state (seed 0, learning rate schedule none):
  ``stepper(batch) -> loss``; ``stepper.hlo(batch)``: the compiled step's HLO text."""

  def __init__(self, model, loss_fn, tx, mesh, rules, seq_len: int, predictions: int):
    ids = np.zeros((1, seq_len), np.int32)
    preds = np.zeros((1, predictions), np.int32)
    self.mesh, self.rules = mesh, rules
    self.state = init_train_state(
      lambda rng: model.init(rng, ids, ids, ids, preds)["params"], tx, mesh, rules, seed=0
    )
    self.step = jit_train_step(
      make_train_step(loss_fn, tx, None, 1, mesh),
      jax.tree_util.tree_map(lambda x: x.sharding, self.state),
      mesh,
      rules,
    )

  def __call__(self, batch):
    self.state, metrics = self.step(self.state, batch)
    return metrics["loss"]

  def hlo(self, batch) -> str:
    with parallel.mesh_context(self.mesh, self.rules):
      return self.step.jitted.lower(self.state, batch).compile().as_text()
