"""NVIDIA GPU clusters to compile for without a GPU, and the GPU specs a step-time estimate uses.

  topo = parse_gpu_topology("h100:8")       # one host of 8 H100 SXM (NVLink / NVSwitch)
  topo = parse_gpu_topology("h100:2x8")     # 2 hosts x 8 GPUs, hosts joined by InfiniBand
  devices = gpu_topology_devices(topo)      # abstract CUDA devices (compile only)

``bert_jax.parallel.topology.parse_topology`` / ``topology_devices`` dispatch here for these
names, so ``python -m bert_jax.compile --topology h100:2x8`` works like a TPU topology.

Names: ``<gpu>:<gpus per host>`` or ``<gpu>:<hosts>x<gpus per host>`` with ``<gpu>`` one of
``GPUS`` (``a100-40gb``, ``a100-80gb``, ``h100``, ``h200``; the SXM parts of NVIDIA's HGX / DGX
8-GPU hosts) and 1, 2, 4 or 8 GPUs per host.

How: the CUDA PJRT plugin (``jax-cuda12-plugin``, ``pip install 'bert-jax[gpu-aot]'``) creates
a compile-only topology from a text ``GpuTargetConfigProto`` (what XLA would read from a real
GPU: compute capability, SM count, shared memory, L2, clock, memory size) and a
``<partitions>x<hosts per partition>x<GPUs per host>`` shape; XLA:GPU then compiles for it on
the CPU (its PTX compiler is linked into the plugin: no CUDA driver, toolkit or ptxas is
needed). No autotuning runs (there is no GPU to time kernels on), so kernel choices may differ
from a run's; memory, collectives and FLOPs are those of the program XLA would run.

Hosts: each host is its own NVLink domain (one XLA partition per host), so a device's
``process_index`` is its host. Collectives whose groups span hosts run over InfiniBand
(reported as "dcn", the network between NVLink domains), the others over NVLink ("ici").
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from typing import Any

from jax.experimental import topologies

from bert_jax.parallel.topology_base import ChipSpec, GiB, Topology, TopologyError

_GB = 1e9
GPUS_PER_HOST = (1, 2, 4, 8)
# JAX's GPU allocator takes this fraction of the GPU's memory unless XLA_PYTHON_CLIENT_MEM_FRACTION
# says otherwise (jax.readthedocs.io, "GPU memory allocation").
DEFAULT_MEM_FRACTION = 0.75


@dataclasses.dataclass(frozen=True)
class GpuDevice:
  """What XLA:GPU reads from a device to compile for it (GpuTargetConfigProto's device info)."""

  compute_capability: tuple[int, int]
  sm_count: int
  fp32_cores_per_sm: int
  shared_memory_per_sm: int  # bytes
  shared_memory_per_block_optin: int  # bytes
  l2_cache_bytes: int
  boost_clock_ghz: float


@dataclasses.dataclass(frozen=True)
class GpuSpec:
  chip: ChipSpec
  device: GpuDevice


# Sources (read 2026-11; "GB" of memory taken as GiB, as the TPU table does: nvidia-smi shows
# 40960 / 81920 MiB on A100s and 81559 MiB on an H100 80GB):
#   A100: NVIDIA A100 Tensor Core GPU datasheet (SXM4): BF16 312 TFLOP/s dense, TF32 156 (XLA
#     runs float32 matmuls as TF32 by default: peak_flops_f32 = half the bf16 figure, as on
#     H100 / H200's datasheets, TF32 989.5 TFLOP/s sparse = 494.7 dense); 40 GB HBM2 at
#     1,555 GB/s, 80 GB HBM2e at 2,039 GB/s; NVLink 600 GB/s (bidirectional, 12 links).
#     NVIDIA Ampere GA100 whitepaper: 108 SMs, 64 FP32 cores per SM, 40 MB L2, 1,410 MHz boost.
#     DGX A100 datasheet: 8 single-port 200 Gb/s HDR InfiniBand adapters for 8 GPUs.
#   H100: NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOP/s with sparsity (989.5
#     dense); 80 GB HBM3 at 3.35 TB/s; NVLink 900 GB/s (bidirectional, 18 links). NVIDIA Hopper
#     whitepaper (H100 SXM5): 132 SMs, 128 FP32 cores per SM, 50 MB L2; 1,980 MHz max boost.
#     DGX H100 datasheet: 8 single-port 400 Gb/s ConnectX-7 (InfiniBand NDR) for 8 GPUs.
#   H200: NVIDIA H200 Tensor Core GPU datasheet (SXM): the same GH100 compute as H100 SXM
#     (BF16 1,979 TFLOP/s sparse, 989.5 dense), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s.
#     DGX H200 datasheet: 8 x 400 Gb/s ConnectX-7 for 8 GPUs.
#   Shared memory: CUDA C++ Programming Guide, "Technical Specifications per Compute
#     Capability": 164 KB per SM and 163 KB per block (opt-in) on 8.0, 228 KB / 227 KB on 9.0.
# Derived: "ici" = NVLink all-reduce bandwidth per GPU = half the bidirectional NVLink figure
# (the rate a ring collective moves one GPU's data, as for TPU ICI); "dcn" = one InfiniBand
# adapter per GPU (200 Gb/s = 25 GB/s, 400 Gb/s = 50 GB/s).
_AMPERE = dict(compute_capability=(8, 0), sm_count=108, fp32_cores_per_sm=64)
_AMPERE_SMEM = dict(shared_memory_per_sm=164 * 1024, shared_memory_per_block_optin=163 * 1024)
_HOPPER = dict(compute_capability=(9, 0), sm_count=132, fp32_cores_per_sm=128)
_HOPPER_SMEM = dict(shared_memory_per_sm=228 * 1024, shared_memory_per_block_optin=227 * 1024)
_A100 = GpuDevice(**_AMPERE, **_AMPERE_SMEM, l2_cache_bytes=40 * 2**20, boost_clock_ghz=1.41)
_GH100 = GpuDevice(**_HOPPER, **_HOPPER_SMEM, l2_cache_bytes=50 * 2**20, boost_clock_ghz=1.98)
_NOTE = "ici = NVLink within a host, dcn = InfiniBand between hosts (one adapter per GPU)"


def _chip(name, kind, hbm_gib, flops, hbm_bw, nvlink_bidir, ib_gbit) -> ChipSpec:
  return ChipSpec(
    name, kind, hbm_gib * GiB, flops, hbm_bw, nvlink_bidir / 2, ib_gbit * 1e9 / 8, False, _NOTE,
    "gpu", peak_flops_f32=flops / 2,
  )  # fmt: skip


GPUS: dict[str, GpuSpec] = {
  "a100-40gb": GpuSpec(
    _chip("a100-40gb", "NVIDIA A100-SXM4-40GB", 40, 312e12, 1555 * _GB, 600 * _GB, 200), _A100
  ),
  "a100-80gb": GpuSpec(
    _chip("a100-80gb", "NVIDIA A100-SXM4-80GB", 80, 312e12, 2039 * _GB, 600 * _GB, 200), _A100
  ),
  "h100": GpuSpec(
    _chip("h100", "NVIDIA H100 80GB HBM3", 80, 1979e12 / 2, 3350 * _GB, 900 * _GB, 400), _GH100
  ),
  "h200": GpuSpec(
    _chip("h200", "NVIDIA H200", 141, 1979e12 / 2, 4800 * _GB, 900 * _GB, 400), _GH100
  ),
}
_ALIASES = {"h100-sxm": "h100", "h100-80gb": "h100", "h200-sxm": "h200"}


def is_gpu_name(name: str) -> bool:
  """Whether ``name`` is for this parser (TPU names start with "v")."""
  text = name.strip().lower()
  return text[:1].isalpha() and not text.startswith("v")


def known_gpu_topologies() -> str:
  return (
    f"<gpu>:<gpus per host> or <gpu>:<hosts>x<gpus per host>, <gpu> one of "
    f"{', '.join(GPUS)}, gpus per host {'/'.join(map(str, GPUS_PER_HOST))} (e.g. h100:8, "
    "h100:2x8, a100-80gb:4x8)"
  )


def parse_gpu_topology(name: str, num_slices: int = 1) -> Topology:
  """``"h100:8"`` / ``"h100:2x8"`` -> Topology with shape (hosts, GPUs per host); ValueError
  (one line, listing the known GPUs and the form) for anything else."""
  text = name.strip().lower()
  m = re.fullmatch(r"([\w-]+):(?:(\d+)x)?(\d+)", text)
  gpu = _ALIASES.get(m.group(1), m.group(1)) if m else ""
  if not m or gpu not in GPUS:
    raise ValueError(f"unknown GPU topology {name!r}; known: {known_gpu_topologies()}")
  hosts, per_host = int(m.group(2) or 1), int(m.group(3))
  if per_host not in GPUS_PER_HOST or hosts < 1:
    raise ValueError(
      f"GPU topology {name!r}: {per_host} GPUs per host x {hosts} hosts; known: "
      f"{known_gpu_topologies()}"
    )
  if num_slices != 1:
    raise ValueError(
      f"--num_slices is for TPU slices; for GPU hosts name them in --topology, e.g. "
      f"{gpu}:{num_slices}x{per_host}"
    )
  canonical = f"{gpu}:{hosts}x{per_host}" if hosts > 1 else f"{gpu}:{per_host}"
  return Topology(canonical, GPUS[gpu].chip, (hosts, per_host))


def target_config(spec: GpuSpec) -> str:
  """The text GpuTargetConfigProto XLA:GPU compiles for (stream_executor's field names)."""
  d, chip = spec.device, spec.chip
  major, minor = d.compute_capability
  info = {
    "threads_per_block_limit": 1024,  # CUDA programming guide, compute capability 8.0 and 9.0
    "threads_per_warp": 32,
    "shared_memory_per_block": 48 * 1024,  # without opt-in
    "shared_memory_per_core": d.shared_memory_per_sm,
    "threads_per_core_limit": 2048,
    "core_count": d.sm_count,
    "fpus_per_core": d.fp32_cores_per_sm,
    "block_dim_limit_x": 2**31 - 1,
    "block_dim_limit_y": 65535,
    "block_dim_limit_z": 65535,
    "memory_bandwidth": int(chip.hbm_bandwidth),
    "l2_cache_size": d.l2_cache_bytes,
    "clock_rate_ghz": d.boost_clock_ghz,
    "device_memory_size": chip.hbm_bytes,
    "shared_memory_per_block_optin": d.shared_memory_per_block_optin,
    "registers_per_core_limit": 65536,
    "registers_per_block_limit": 65536,
  }
  body = "\n".join(f"  {k}: {v}" for k, v in info.items())
  # cuDNN / CUDA versions: those jax-cuda12-plugin's "with-cuda" extra requires at least.
  return (
    f"gpu_device_info {{\n{body}\n  cuda_compute_capability {{ major: {major} minor: {minor} }}\n}}\n"
    'platform_name: "CUDA"\n'
    "dnn_version_info { major: 9 minor: 8 }\n"
    "runtime_version { major: 12 minor: 8 }\n"
    f'device_description_str: "{chip.device_kind}"\n'
  )


def cuda_plugin_installed() -> bool:
  """Whether jax-cuda12-plugin (the CUDA PJRT plugin) is importable; nothing is loaded."""
  try:
    return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  except ModuleNotFoundError:  # no jax_plugins namespace at all
    return False


def gpu_topology_devices(topo: Topology) -> list[Any]:
  """The abstract (compile-only) CUDA devices of ``topo``; TopologyError when the CUDA PJRT
  plugin is missing or refuses."""
  spec = GPUS[topo.chip.generation]
  hosts, per_host = topo.shape
  if not cuda_plugin_installed():
    raise TopologyError(
      f"cannot create GPU topology {topo.name}: jax-cuda12-plugin is not installed (compiling "
      "for NVIDIA GPUs without one needs the CUDA PJRT plugin: pip install 'bert-jax[gpu-aot]')"
    )
  # The plugin registers itself only if a CUDA runtime passes its version check when JAX first
  # starts its backends; compiling needs no runtime. (Too late if this process already started
  # them without it: the error below then says so.)
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  try:
    desc = topologies.get_topology_desc(
      platform="cuda", target_config=target_config(spec), topology=f"{hosts}x1x{per_host}"
    )
  except Exception as e:  # plugin too old / refusing: one line, with the fix
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    fix = "needs jax-cuda12-plugin matching jax: pip install 'bert-jax[gpu-aot]'"
    if "not implemented for cuda" in first:  # installed, but not registered at backend start
      fix = (
        "the CUDA plugin was not registered when JAX started its backends in this process: "
        "set JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 (or JAX_PLATFORMS=cpu) before JAX starts"
      )
    raise TopologyError(f"cannot create GPU topology {topo.name}: {first} ({fix})") from e
  devices = sorted(desc.devices, key=lambda d: d.id)
  if len(devices) != topo.num_devices:
    raise TopologyError(
      f"the CUDA plugin gave {len(devices)} devices for {topo.describe()}; expected "
      f"{topo.num_devices}"
    )
  return devices


def compile_kwargs() -> dict[str, Any]:
  """Options for ``Lowered.compile`` on a GPU topology. XLA:GPU's Triton GEMM emitter, without
  autotuning (no GPU), fails on some of BERT's dots ("Couldn't find output tile sizes"), so
  dots go to cuBLAS, as autotuning falls back to when Triton has no config."""
  return dict(compiler_options={"xla_gpu_enable_triton_gemm": False})


def available_bytes(chip: ChipSpec) -> float:
  """What a JAX process may allocate on the GPU: its memory x XLA_PYTHON_CLIENT_MEM_FRACTION
  (0.75 unless set, read from this environment as a run would read it)."""
  text = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "")
  try:
    fraction = float(text) if text else DEFAULT_MEM_FRACTION
  except ValueError:
    raise ValueError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={text!r} is not a number") from None
  return chip.hbm_bytes * fraction
