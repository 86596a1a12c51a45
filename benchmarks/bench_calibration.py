r"""The step-time estimator (bert_jax/plan/report.py) against step times measured on this host.

  python -m benchmarks.bench_calibration                           # tiny..base, seq 128 and 512
  python -m benchmarks.bench_calibration --sizes=tiny,mini --steps=5
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
      python -m benchmarks.bench_calibration --devices=8 --sizes=tiny,mini   # a CPU mesh
  python -m benchmarks.bench_calibration --published       # TPU / GPU: against published runs

``bert_jax.compile`` estimates a TPU or GPU step from what the compiler reports (FLOPs, bytes
accessed, the collectives in the HLO) and a chip's data-sheet peak and bandwidths; nothing here
can check that against a TPU. What can be checked is the same estimator on the one machine we
have: the pre-training job (synthetic batches) is compiled and reported by
``bert_jax.plan.compile_for_topology``, what ``bert_jax.compile`` runs, for this host's CPU
devices instead of a TPU's (XLA:CPU compiles it), against a "chip" whose numbers are measured
here instead of read from a data sheet:

  peak      = a 2048 x 2048 float32 matmul's FLOP/s (the same probe as bench_pretrain);
  bandwidth = a jitted elementwise pass over 256 MiB (bytes read + written per second), used
              for "HBM" and, on an N-device CPU mesh, for the collectives too (they are copies
              in the host's memory).

With ``--devices=N`` (N fake devices sharing the host's cores) each device gets 1/N of the
host's peak and bandwidth. Then that compiled step runs on the state a run initialises
(``trainer.assemble(...).init_state()``) and the run's synthetic input:
the median of ``--repeats`` timings of ``--steps`` steps is compared with the estimate (ratio
measured / estimated; 1.0 = the roofline bound is met, > 1 = slower than the bound). The
constants are not tuned to the ratios: the estimator is the one ``bert_jax.compile`` uses.

``--published``: the TPU and GPU estimates against published step times of BERT-large
pre-training with fixed (padded) shapes (``PUBLISHED``: MLPerf Training v0.7 logs, NVIDIA's
DeepLearningExamples tables). Each is compiled by ``bert_jax.plan.compile_for_topology`` with the
published run's hardware, global (micro-)batch, length, precision and optimizer (LAMB); the
ratio published / estimated says how far real runs are from the roofline bound. Needs libtpu
(``.[tpu]``) and the CUDA compile plugin (``.[gpu-aot]``); each BERT-large compile takes
minutes here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import time

import jax
from absl import app, flags

from benchmarks.host_peak import measure_bandwidth, measure_peak_flops
from bert_jax import parallel
from bert_jax.parallel.topology import ChipSpec, Topology, parse_topology
from bert_jax.plan.compiler import compile_for_topology
from bert_jax.tasks import build_job
from bert_jax.train import trainer
from configs import pretrain

_SIZES = flags.DEFINE_list("sizes", ["tiny", "mini", "small", "base"], "pretrain presets")
_SEQ_LENS = flags.DEFINE_list("seq_lens", ["128", "512"], "sequence lengths (phase 1 / 2)")
_TOKENS = flags.DEFINE_integer(
  "tokens_per_step", 4096, "global batch = tokens_per_step / seq (bench_pretrain's 4,096)"
)
_DEVICES = flags.DEFINE_integer("devices", 1, "CPU devices in the mesh (data parallel)")
_STEPS = flags.DEFINE_integer("steps", 3, "timed steps per repeat")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timings per configuration (median)")
_OUT = flags.DEFINE_string("out", "", "also write the rows as JSON here")
_PUBLISHED = flags.DEFINE_bool("published", False, "compare with PUBLISHED (TPU / GPU) instead")


@dataclasses.dataclass(frozen=True)
class Published:
  """One published measurement: BERT-large, fixed shapes; ``step_seconds`` for ``batch``."""

  topology: str
  seq: int
  batch: int  # global sequences per (micro-)step
  predictions: int
  step_seconds: float
  precision: str
  source: str


# Per step of `batch` sequences, from the cited logs / tables (derivation in the source string).
PUBLISHED = (
  Published(
    "v4:2x2x2", 512, 256, 76, 455.66 / 1953, "bf16",
    "MLPerf Training v0.7, Google, tpu-v4-16-TF (research), result_0.txt: blocks of 1,953 "
    "steps in 455.66 s (mlcommons/training_results_v0.7)",
  ),
  Published(
    "a100-80gb:8", 128, 8 * 256, 20, 8 * 256 / 4591, "fp16 (mixed)",
    "NVIDIA DeepLearningExamples PyTorch/LanguageModeling/BERT README, pre-training phase 1, "
    "8x A100 80GB, batch 256 per GPU (x 32 accumulated), 4,591 sequences/s",
  ),
  Published(
    "a100-80gb:8", 128, 8 * 128, 20, 8 * 128 / 2505, "tf32",
    "same table, TF32, batch 128 per GPU (x 64 accumulated), 2,505 sequences/s",
  ),
  Published(
    "a100-40gb:8", 512, 8 * 16, 80, 8 * 16 / 572.112, "fp16 (mixed)",
    "NVIDIA DeepLearningExamples TensorFlow/LanguageModeling/BERT README, phase 2, "
    "8x A100 40GB, batch 16 per GPU (x 256 accumulated), 572.112 sequences/s",
  ),
)  # fmt: skip


class _ThisHost(Topology):
  @property
  def num_hosts(self) -> int:
    return 1  # every device is in this process (Topology's table knows TPU hosts only)


def host_topology(devices: int, peak: float, bandwidth: float) -> Topology:
  """This host as a "topology" of ``devices`` CPU devices sharing its measured peak/bandwidth."""
  chip = ChipSpec(
    "cpu",
    jax.devices()[0].device_kind,
    hbm_bytes=24 * 1024**3,
    peak_flops=peak / devices,
    hbm_bandwidth=bandwidth / devices,
    ici_bandwidth=bandwidth / devices,
    dcn_bandwidth=bandwidth / devices,
    megacore=False,
    notes="measured here: f32 matmul peak and elementwise bandwidth, shared by the devices",
    platform="cpu",
  )
  return _ThisHost(f"cpu:{devices}", chip, (devices,))


def _config(size: str, seqs: list[int], batches: list[int]):
  """The preset's pre-training config on synthetic batches: phase 1 at seqs[0] x batches[0],
  phase 2 (when given) at seqs[1] x batches[1]."""
  config = pretrain.get_config(size)
  config.synthetic_data = True
  config.num_train_steps = 1000
  config.max_seq_length = seqs[0]
  config.train_batch_size = batches[0]
  config.max_predictions_per_seq = 20 if seqs[0] <= 128 else 80
  config.phase2.fraction = 0.1 if len(seqs) > 1 else 0.0
  if len(seqs) > 1:
    config.phase2.max_seq_length = seqs[1]
    config.phase2.train_batch_size = batches[1]
  return config


def _time(compiled, state, batches, steps: int, repeats: int):
  state, _ = compiled(state, batches[0])  # warm-up
  jax.block_until_ready(state)
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    for i in range(steps):
      state, metrics = compiled(state, batches[i % len(batches)])
    jax.block_until_ready((state, metrics))
    times.append((time.perf_counter() - t) / steps)
  return statistics.median(times), state


def calibrate(size: str, seqs: list[int], topo: Topology, devices) -> list[dict]:
  config = _config(size, seqs, [_TOKENS.value // s for s in seqs])
  mesh = parallel.create_mesh(config.mesh, devices=devices)
  rules = parallel.normalize_rules(config.logical_axis_rules)
  rows = []
  # the report of each phase's step: the compile bert_jax.compile makes, here for the CPU devices
  reports = compile_for_topology(config, topo, with_eval=False, devices=devices)["reports"]
  with tempfile.TemporaryDirectory() as workdir:
    job = build_job(config, workdir, mesh)  # the same job with its (synthetic) input
    state = trainer.assemble(job, config, mesh, rules).init_state()
    for phase, rep in zip(job.phases, reports, strict=True):
      it = phase.make_input()
      batches = [parallel.make_global_batch(next(it), mesh, rules) for _ in range(2)]
      with parallel.mesh_context(mesh, rules):
        measured, state = _time(rep.compiled, state, batches, _STEPS.value, _REPEATS.value)
      e = rep.estimate
      rows.append(
        dict(
          size=size,
          seq=phase.seq_len,
          batch=phase.global_batch_size,
          devices=topo.num_devices,
          compiler_gflop_per_device=rep.flops / 1e9,
          model_gflop=e["model_flops"] / 1e9,
          gbytes_accessed_per_device=rep.bytes_accessed / 1e9,
          compute_ms=e["compute_seconds"] * 1e3,
          hbm_ms=e["hbm_seconds"] * 1e3,
          network_ms=(e["ici_seconds"] + e["dcn_seconds"]) * 1e3,
          estimate_ms=e["step_seconds"] * 1e3,
          serial_ms=e["serial_seconds"] * 1e3,
          bound=e["bound"],
          measured_ms=measured * 1e3,
          ratio=measured / e["step_seconds"],
          estimated_mfu=e["mfu"],
          measured_mfu=e["model_flops"] / (measured * topo.num_devices * topo.chip.peak_flops),
        )
      )
      print(_format_row(rows[-1]), flush=True)
  return rows


_HEADER = (
  "| preset | seq | batch | devices | compiler GFLOP / dev | model GFLOP | GB accessed / dev "
  "| compute ms | memory ms | network ms | estimate ms (bound) | measured ms | measured / "
  "estimate | MFU est. / measured |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _format_row(r: dict) -> str:
  return (
    f"| {r['size']} | {r['seq']} | {r['batch']} | {r['devices']} "
    f"| {r['compiler_gflop_per_device']:,.1f} | {r['model_gflop']:,.1f} "
    f"| {r['gbytes_accessed_per_device']:,.2f} | {r['compute_ms']:,.1f} | {r['hbm_ms']:,.1f} "
    f"| {r['network_ms']:,.1f} | {r['estimate_ms']:,.1f} ({r['bound']}) | {r['measured_ms']:,.1f} "
    f"| {r['ratio']:.2f} | {r['estimated_mfu']:.0%} / {r['measured_mfu']:.0%} |"
  )


def published_config(p: Published):
  config = _config("large", [p.seq], [p.batch])
  config.max_predictions_per_seq = p.predictions
  config.dtype = "float32" if p.precision == "tf32" else "bfloat16"
  config.optimizer.name = "lamb"
  return config


def compare_published() -> list[dict]:
  print(
    "| topology | seq | batch | precision | estimate ms (bound) | MFU est. | fits | published ms "
    "| published / estimate | compile s |\n|---|---|---|---|---|---|---|---|---|---|",
    flush=True,
  )
  rows = []
  for p in PUBLISHED:
    result = compile_for_topology(published_config(p), parse_topology(p.topology), with_eval=False)
    rep = result["reports"][0]
    e = rep.estimate
    est = e.get("step_seconds", float("nan"))
    rows.append(
      dict(
        dataclasses.asdict(p),
        fits=rep.fits,
        estimate_ms=est * 1e3,
        compute_ms=e.get("compute_seconds", float("nan")) * 1e3,
        hbm_ms=e.get("hbm_seconds", float("nan")) * 1e3,
        network_ms=(e.get("ici_seconds", 0.0) + e.get("dcn_seconds", 0.0)) * 1e3,
        bound=e.get("bound", "-"),
        estimated_mfu=e.get("mfu", float("nan")),
        ratio=p.step_seconds / est,
        compile_seconds=rep.compile_seconds,
        memory=rep.memory,
      )
    )
    r = rows[-1]
    print(
      f"| {p.topology} | {p.seq} | {p.batch} | {p.precision} | {r['estimate_ms']:,.1f} "
      f"({r['bound']}) | {r['estimated_mfu']:.0%} | {'yes' if rep.fits else 'NO'} "
      f"| {p.step_seconds * 1e3:,.1f} | {r['ratio']:.2f} | {rep.compile_seconds:.0f} |",
      flush=True,
    )
  return rows


def main(argv):
  del argv
  # The CUDA plugin checks for a CUDA runtime when JAX first starts its backends, and is not
  # registered without one; compiling for a GPU needs none (bert_jax/parallel/gpu_topology.py).
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  if _PUBLISHED.value:
    rows = compare_published()
    if _OUT.value:
      with open(_OUT.value, "w") as f:
        json.dump(dict(rows=rows), f, indent=1)
    return
  n = _DEVICES.value
  devices = jax.devices()[:n]
  if len(devices) < n:
    raise app.UsageError(
      f"--devices={n} but JAX has {len(devices)}: set "
      f"XLA_FLAGS=--xla_force_host_platform_device_count={n}"
    )
  peak, bandwidth = measure_peak_flops(), measure_bandwidth()
  topo = host_topology(n, peak, bandwidth)
  print(
    f"{jax.devices()[0].device_kind}, {n} device(s): peak (f32 matmul) {peak / 1e9:.1f} GFLOP/s, "
    f"bandwidth {bandwidth / 1e9:.1f} GB/s (host); per device {topo.chip.peak_flops / 1e9:.1f} "
    f"GFLOP/s, {topo.chip.hbm_bandwidth / 1e9:.1f} GB/s"
  )
  print(_HEADER, flush=True)
  rows = []
  for size in _SIZES.value:
    rows += calibrate(size, [int(s) for s in _SEQ_LENS.value], topo, devices)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(dict(peak_flops=peak, bandwidth=bandwidth, rows=rows), f, indent=1)


if __name__ == "__main__":
  app.run(main)
