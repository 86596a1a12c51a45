"""What every topology shares: the chip record, the Topology record, and the TPU host layout
its methods read. bert_jax/parallel/topology.py (TPU slices, and the entry points) and
bert_jax/parallel/gpu_topology.py (NVIDIA GPU hosts) both build on this module, and topology.py
dispatches to gpu_topology.py: the imports run one way, with no cycle.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

GiB = 1024**3


class TopologyError(RuntimeError):
  """The compiler (libtpu; for GPU hosts the CUDA PJRT plugin) cannot provide the topology's
  devices."""


@dataclasses.dataclass(frozen=True)
class ChipSpec:
  """One chip. Bandwidths in bytes/s. ``ici_bandwidth`` is the all-reduce bandwidth per chip (the
  pod's all-reduce bandwidth over its chips, i.e. half the bidirectional ICI bandwidth per chip):
  the rate at which a ring collective moves one chip's data through the interconnect."""

  generation: str
  device_kind: str
  hbm_bytes: int
  peak_flops: float  # dense bf16
  hbm_bandwidth: float
  ici_bandwidth: float
  dcn_bandwidth: float  # per chip
  megacore: bool
  notes: str = ""
  platform: str = "tpu"  # or "gpu" (bert_jax/parallel/gpu_topology.py)
  # dense float32 matmuls at XLA's default precision; 0 = peak_flops (TPUs run them as bf16
  # passes; NVIDIA GPUs since Ampere as TF32, at half the bf16 rate)
  peak_flops_f32: float = 0.0

  def matmul_peak(self, compute_dtype: str) -> float:
    """The peak a step computing in ``compute_dtype`` ("float32", "bfloat16", ...) can reach."""
    if compute_dtype == "float32" and self.peak_flops_f32:
      return self.peak_flops_f32
    return self.peak_flops


# libtpu's generation prefix for each chip.
LIBTPU_PREFIX = {"v4": "v4", "v5e": "v5e", "v5p": "v5", "v6e": "v6e"}
# Chips per host VM (Cloud TPU docs' machine types): 4 on every multi-host slice (v4, v5p:
# 4 chips per VM; v5e, v6e: the 4-chip machine type), and one host for a single-host slice of
# up to SINGLE_HOST_CHIPS chips (v5e / v6e offer an 8-chip VM).
CHIPS_PER_HOST = 4
SINGLE_HOST_CHIPS = {"v4": 4, "v5e": 8, "v5p": 4, "v6e": 8}


@dataclasses.dataclass(frozen=True)
class Topology:
  """A named TPU slice (times ``num_slices``), or GPU hosts: shape (hosts, GPUs per host)."""

  name: str  # canonical, e.g. "v5e:16x16"
  chip: ChipSpec
  shape: tuple[int, ...]
  num_slices: int = 1

  @property
  def chips_per_slice(self) -> int:
    return math.prod(self.shape)

  @property
  def num_devices(self) -> int:
    return self.chips_per_slice * self.num_slices

  @property
  def num_hosts(self) -> int:
    """Host VMs (each runs one JAX process and its input pipeline): see CHIPS_PER_HOST."""
    if self.is_gpu:
      return self.shape[0] * self.num_slices
    chips = self.chips_per_slice
    per_slice = 1 if chips <= SINGLE_HOST_CHIPS[self.chip.generation] else chips // CHIPS_PER_HOST
    return per_slice * self.num_slices

  @property
  def libtpu_name(self) -> str:
    return f"{LIBTPU_PREFIX[self.chip.generation]}:{'x'.join(map(str, self.shape))}"

  @property
  def is_gpu(self) -> bool:
    return self.chip.platform == "gpu"

  @property
  def accelerator_type(self) -> str:
    """The Cloud name of one slice (v4/v5p count TensorCores, v5e/v6e chips); a GPU's name."""
    if self.is_gpu:
      return self.name
    n = self.chips_per_slice * (2 if self.chip.megacore else 1)
    prefix = "v5litepod" if self.chip.generation == "v5e" else self.chip.generation
    return f"{prefix}-{n}"

  def describe(self) -> str:
    if self.is_gpu:
      hosts = f", {self.shape[0]} hosts x {self.shape[1]}" if self.shape[0] > 1 else ""
      return f"{self.name} ({self.num_devices} GPUs{hosts}, {self.chip.device_kind})"
    slices = f" x {self.num_slices} slices" if self.num_slices > 1 else ""
    return f"{self.name}{slices} ({self.num_devices} chips, {self.chip.device_kind})"

  def to_dict(self) -> dict[str, Any]:
    out = {
      "name": self.name,
      "accelerator_type": self.accelerator_type,
      "num_slices": self.num_slices,
      "num_chips": self.num_devices,
      "num_hosts": self.num_hosts,
      "chip": dataclasses.asdict(self.chip),
    }
    if self.is_gpu:
      out.update(hosts=self.shape[0], gpus_per_host=self.shape[1])
    return out
