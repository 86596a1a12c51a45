r"""The step-time estimator (bert_jax/plan/report.py) against step times measured on this host.

  python -m benchmarks.profile.calibration                           # tiny..base, seq 128 and 512
  python -m benchmarks.profile.calibration --sizes=tiny,mini --steps=5
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
      python -m benchmarks.profile.calibration --devices=8 --sizes=tiny,mini   # a CPU mesh
  python -m benchmarks.profile.calibration --published       # TPU / GPU: against published runs
  python -m benchmarks.profile.calibration --topology=h200:1 --sizes=base --dtype=bfloat16 \
      --tokens_per_step=32768                # on a GPU host: measured against the estimate

``bert_jax.compile`` estimates a TPU or GPU step from what the compiler reports (FLOPs, bytes
accessed, the collectives in the HLO) and a chip's data-sheet peak and bandwidths; nothing here
can check that against a TPU. What can be checked is the same estimator on the one machine we
have: the pre-training job (synthetic batches) is compiled and reported by
``bert_jax.plan.compile_for_topology``, what ``bert_jax.compile`` runs, for this host's CPU
devices instead of a TPU's (XLA:CPU compiles it), against a "chip" whose numbers are measured
here instead of read from a data sheet:

  peak      = a 2048 x 2048 float32 matmul's FLOP/s (the same probe as benchmarks.speed.pretrain);
  bandwidth = a jitted elementwise pass over 256 MiB (bytes read + written per second), used
              for "HBM" and, on an N-device CPU mesh, for the collectives too (they are copies
              in the host's memory).

With ``--devices=N`` (N fake devices sharing the host's cores) each device gets 1/N of the
host's peak and bandwidth. Then that compiled step runs on the state a run initialises
(``trainer.assemble(...).init_state()``) and the run's synthetic input:
the median of ``--repeats`` timings of ``--steps`` steps is compared with the estimate (ratio
measured / estimated; 1.0 = the roofline bound is met, > 1 = slower than the bound). The
constants are not tuned to the ratios: the estimator is the one ``bert_jax.compile`` uses.

``--topology=h200:1`` (any TPU or GPU topology name): on a host whose jax sees that topology's
accelerators (a GPU host with one H200 here), the estimate of ``bert_jax.compile`` for it,
compiled on those devices, against the run's own step measured there (median of ``--repeats``
timings of ``--steps`` steps) and the allocator's peak against the predicted memory; the
chip's matmul rate and copy bandwidth are measured there too. Each preset's phases are one
process's rows (run one preset per process for a per-preset memory peak). On a host without
them, the same command prints the estimates alone (compiled without the hardware), e.g. to
compare the deviceless compile with the on-device one. ``benchmarks/profile/step_trace.py`` records
where such a step's device time goes.

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

import jax
import jax.numpy as jnp

from benchmarks.common import flags
from benchmarks.common.pretrain_step import (
  assemble_run,
  global_batches,
  peak_bytes,
  synthetic_config,
  time_steps,
)
from benchmarks.profile.host_peak import measure_bandwidth, measure_peak_flops
from bert_jax import parallel
from bert_jax.parallel.topology import ChipSpec, Topology, parse_topology
from bert_jax.plan.compiler import compile_for_topology
from bert_jax.runs.jobs import build_job


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


def _estimate_row(args, size, phase, rep, topo) -> dict:
  e = rep.estimate
  row = dict(
    size=size,
    seq=phase.seq_len,
    batch=phase.global_batch_size,
    devices=topo.num_devices,
    dtype=args.dtype,
    fits=rep.fits,
    predicted_gib=rep.memory.get("total_bytes", float("nan")) / 2**30,
    compile_seconds=rep.compile_seconds,
  )
  if not e:  # refused for memory: nothing to estimate
    return row
  return dict(
    row,
    compiler_gflop_per_device=rep.flops / 1e9,
    model_gflop=e["model_flops"] / 1e9,
    gbytes_accessed_per_device=rep.bytes_accessed / 1e9,
    compute_ms=e["compute_seconds"] * 1e3,
    hbm_ms=e["hbm_seconds"] * 1e3,
    network_ms=(e["ici_seconds"] + e["dcn_seconds"]) * 1e3,
    estimate_ms=e["step_seconds"] * 1e3,
    serial_ms=e["serial_seconds"] * 1e3,
    bound=e["bound"],
    estimated_mfu=e["mfu"],
  )


def calibrate(args, size: str, seqs: list[int], topo: Topology, devices, measure: bool = True):
  """One row per phase: the estimate of the step ``bert_jax.compile`` compiles for ``topo`` (on
  ``devices``; None: the topology's abstract devices, compile only) and, with ``measure``, the
  step measured on ``devices``. On a GPU two steps are timed: the run's own (jitted as a run
  jits it, XLA:GPU free to pick its Triton GEMMs) and the estimator's compile of it (cuBLAS
  dots, ``gpu_topology.compile_kwargs``); elsewhere the two are one compile."""
  config = synthetic_config(size, seqs, [args.tokens_per_step // s for s in seqs], args.dtype)
  rows = []
  reports = compile_for_topology(config, topo, with_eval=False, devices=devices)["reports"]
  if not measure:
    job = build_job(config, abstract=True)
    for phase, rep in zip(job.program.phases, reports, strict=True):
      rows.append(_estimate_row(args, size, phase, rep, topo))
      print(_format_row(rows[-1]), flush=True)
    return rows
  with tempfile.TemporaryDirectory() as workdir:
    run = assemble_run(config, workdir, devices)  # the same job with its (synthetic) input
    state = run.state
    for i, (phase, rep) in enumerate(zip(run.job.program.phases, reports, strict=True)):
      row = _estimate_row(args, size, phase, rep, topo)
      rows.append(row)
      if not rep.fits:
        print(_format_row(row), flush=True)
        continue
      batches = global_batches(run, i)
      # elsewhere the run's compile is the estimator's (rep.compiled): one compile, timed once
      step = run.asm.train_steps[i] if topo.is_gpu else rep.compiled
      with parallel.mesh_context(run.mesh, run.rules):
        times, first, state = time_steps(step, state, batches, args.steps, args.repeats)
        if topo.is_gpu:
          row["run_compile_seconds"] = first
          theirs, _, state = time_steps(rep.compiled, state, batches, args.steps, args.repeats)
          row["estimator_compile_ms"] = statistics.median(theirs) * 1e3
      measured, peak = statistics.median(times), peak_bytes(devices[0])
      row.update(
        measured_ms=measured * 1e3,
        ratio=measured / rep.estimate["step_seconds"],
        measured_mfu=rep.estimate["model_flops"]
        / (measured * topo.num_devices * rep.estimate["peak_flops"]),
        peak_gib=None if peak is None else peak / 2**30,
      )
      print(_format_row(row), flush=True)
  return rows


_HEADER = (
  "| preset | seq | batch | devices | dtype | compiler GFLOP / dev | model GFLOP "
  "| GB accessed / dev | compute ms | memory ms | network ms | estimate ms (bound) | measured ms "
  "| measured / estimate | MFU est. / measured | GiB predicted / peak |\n"
  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _format_row(r: dict) -> str:
  def num(key, fmt=",.1f"):
    return "-" if r.get(key) is None else format(r[key], fmt)

  if "estimate_ms" not in r:
    return f"| {r['size']} | {r['seq']} | {r['batch']} | {r['devices']} | {r['dtype']} | refused: does not fit |"
  mfu = f"{r['estimated_mfu']:.0%} / " + (
    "-" if "measured_mfu" not in r else f"{r['measured_mfu']:.0%}"
  )
  return (
    f"| {r['size']} | {r['seq']} | {r['batch']} | {r['devices']} | {r['dtype']} "
    f"| {num('compiler_gflop_per_device')} | {num('model_gflop')} "
    f"| {num('gbytes_accessed_per_device', ',.2f')} | {num('compute_ms')} | {num('hbm_ms')} "
    f"| {num('network_ms')} | {num('estimate_ms')} ({r['bound']}) | {num('measured_ms')} "
    f"| {num('ratio', '.2f')} | {mfu} | {num('predicted_gib', '.2f')} / {num('peak_gib', '.2f')} |"
  )


def published_config(p: Published):
  dtype = "float32" if p.precision == "tf32" else "bfloat16"
  config = synthetic_config("large", [p.seq], [p.batch], dtype)
  config.max_predictions_per_seq = p.predictions
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


def _write(args, rows: list[dict], **extra) -> None:
  if args.out:  # after every preset: a run cut short keeps what it measured
    with open(args.out, "w") as f:
      json.dump(dict(extra, jax_version=jax.__version__, rows=rows), f, indent=1)


def _accelerators(args, name: str):
  """The topology ``name``, the devices of it jax sees here (None: none, estimates only) and
  what to record about them."""
  topo = parse_topology(name)
  here = [d for d in jax.devices() if d.platform == topo.chip.platform]
  if here and len(here) != topo.num_devices:
    raise SystemExit(f"--topology={name} has {topo.num_devices} devices, jax sees {len(here)}")
  if here and topo.is_gpu and here[0].device_kind != topo.chip.device_kind:
    raise SystemExit(
      f"--topology={name} is {topo.chip.device_kind} but jax's GPUs are {here[0].device_kind}: "
      "name their topology (bert_jax/parallel/gpu_topology.py lists the known GPUs)"
    )
  extra = dict(topology=topo.name, chip=topo.chip.device_kind, measured_on=None)
  if not here:
    print(f"{topo.describe()}: no such device here, estimates only (compiled without it)")
    return topo, None, extra
  dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
  peak, bandwidth = measure_peak_flops(8192, dtype), measure_bandwidth(4096)
  sheet = topo.chip.matmul_peak(args.dtype)
  extra.update(measured_on=here[0].device_kind, peak_flops=peak, bandwidth=bandwidth)
  print(
    f"{here[0].device_kind} x {len(here)}: 8192^2 {args.dtype} matmul {peak / 1e12:.0f} "
    f"TFLOP/s (data sheet {sheet / 1e12:.0f}), copy {bandwidth / 1e9:,.0f} GB/s (data sheet "
    f"{topo.chip.hbm_bandwidth / 1e9:,.0f}); jax {jax.__version__}"
  )
  return topo, here, extra


def _this_host(n: int):
  """This host's first ``n`` CPU devices as a topology of measured peak and bandwidth."""
  devices = jax.devices()[:n]
  if len(devices) < n:
    raise SystemExit(
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
  return topo, devices, dict(peak_flops=peak, bandwidth=bandwidth)


def _parser():
  p = flags.parser(__doc__)
  flags.add_list(p, "sizes", ["tiny", "mini", "small", "base"], "pretrain presets")
  flags.add_list(p, "seq_lens", ["128", "512"], "sequence lengths (phase 1 / 2)")
  p.add_argument(
    "--tokens_per_step",
    type=int,
    default=4096,
    help="global batch = tokens_per_step / seq (benchmarks.speed.pretrain's 4,096)",
  )
  p.add_argument("--devices", type=int, default=1, help="CPU devices in the mesh (data parallel)")
  p.add_argument("--steps", type=int, default=3, help="timed steps per repeat")
  p.add_argument("--repeats", type=int, default=3, help="timings per configuration (median)")
  p.add_argument(
    "--dtype", default="float32", choices=["float32", "bfloat16"], help="the config's dtype"
  )
  p.add_argument(
    "--topology",
    default="",
    help="a TPU / GPU topology (e.g. h100:1): on a host whose jax sees that many accelerators "
    "of it, measure the run's step there against the estimate; elsewhere, the estimate alone",
  )
  p.add_argument("--out", default="", help="also write the rows as JSON here")
  flags.add_bool(p, "published", False, "compare with PUBLISHED (TPU / GPU) instead")
  return p


def main(argv=None):
  args = _parser().parse_args(argv)
  # The CUDA plugin checks for a CUDA runtime when JAX first starts its backends, and is not
  # registered without one; compiling for a GPU needs none (bert_jax/parallel/gpu_topology.py).
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  if args.published:
    _write(args, compare_published())
    return
  if args.topology:
    topo, devices, extra = _accelerators(args, args.topology)
  else:
    topo, devices, extra = _this_host(args.devices)
  print(_HEADER, flush=True)
  rows = []
  for size in args.sizes:
    seqs = [int(s) for s in args.seq_lens]
    rows += calibrate(args, size, seqs, topo, devices, measure=devices is not None)
    _write(args, rows, **extra)


if __name__ == "__main__":
  main()
