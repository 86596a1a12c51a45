"""TPU topologies to compile for without the hardware, and the chip specs a step-time estimate uses
(NVIDIA GPU hosts: bert_jax/parallel/gpu_topology.py, dispatched to from here; the records both
use, ChipSpec and Topology: bert_jax/parallel/topology_base.py).

  topo = parse_topology("v5e:16x16")             # or "v5e-256", "v4:4x4x8", "v4-256", "v5p:4x4x4"
  topo = parse_topology("v4:4x4x4", num_slices=2)   # two slices joined by the data-center network
  devices = topology_devices(topo)               # abstract TPU devices (compile only)
  topo.chip.hbm_bytes, topo.chip.peak_flops, ...

Names: ``<generation>:<chip grid>`` as ``jax.experimental.topologies`` and libtpu spell them
(``v4:2x2x1``, ``v5e:16x16``; v5p's libtpu name is ``v5:...``, ``v5p:...`` is accepted too), or
the Cloud accelerator type (``v4-128``: TensorCores for v4/v5p, chips for v5e/v6e). v4 and v5p
are compiled as "megacore" (the two TensorCores of a chip are one device), which is how jobs
run on them; one device = one chip on every generation here.

Abstract devices need ``libtpu`` (``pip install 'jax[tpu]'``) but no TPU: the XLA TPU compiler
runs on any host. ``topology_devices`` sets ``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` in this process
before libtpu starts: with libtpu installed every JAX process on the host takes libtpu's
lockfile while probing for TPUs, and a compile-only client must not be refused for that.

Multi-slice (``num_slices > 1``): the devices carry a slice index; ``create_mesh`` splits the
``data`` axis (then ``fsdp``) across slices, so the collectives over that part of the mesh run
over the data-center network (DCN) instead of the chips' interconnect (ICI).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from jax.experimental import topologies

from bert_jax.parallel import gpu_topology
from bert_jax.parallel.topology_base import ChipSpec, GiB, Topology, TopologyError

_GB = 1e9

# Sources: Google Cloud TPU system-architecture pages, cloud.google.com/tpu/docs/<v4|v5e|v5p|v6e>
# (the tables "key specifications"), read 2026-11. Derived numbers say how they are derived.
CHIPS: dict[str, ChipSpec] = {
  # docs/v4: 275 TFLOP/s bf16, HBM2 32 GiB at 1200 GB/s; all-reduce bandwidth per Pod 1.1 PB/s
  # over 4096 chips -> 269 GB/s per chip. No per-chip DCN figure is published for v4: assumed
  # v5e's 25 Gbit/s per chip (marked in every report that uses it).
  "v4": ChipSpec(
    "v4",
    "TPU v4",
    32 * GiB,
    275e12,
    1200 * _GB,
    1.1e15 / 4096,
    25e9 / 8,
    True,
    "DCN bandwidth assumed (no published per-chip figure)",
  ),  # fmt: skip
  # docs/v5e: 197 TFLOP/s bf16, HBM2 16 GB (16 GiB: XLA reports 15.75 GiB usable) at 819 GB/s;
  # bidirectional ICI 400 GB/s per chip (all-reduce per Pod 51.2 TB/s / 256 = 200 GB/s);
  # per-host NIC 2 x 100 Gbit/s for 8 chips per host (DCN per Pod 6.4 Tbit/s / 256) = 25 Gbit/s.
  "v5e": ChipSpec("v5e", "TPU v5 lite", 16 * GiB, 197e12, 819 * _GB, 200 * _GB, 25e9 / 8, False),
  # docs/v5p-training: 459 TFLOP/s bf16, HBM2e 95 GiB at 2765 GB/s; bidirectional ICI 1200 GB/s
  # per chip (-> 600 GB/s all-reduce); DCN 50 Gbit/s per chip.
  "v5p": ChipSpec("v5p", "TPU v5", 95 * GiB, 459e12, 2765 * _GB, 600 * _GB, 50e9 / 8, True),
  # docs/v6e: 918 TFLOP/s bf16, HBM 32 GB at 1638 GB/s (taken as 32 GiB, like v5e's 16);
  # bidirectional ICI 800 GB/s per chip (all-reduce per Pod 102.4 TB/s / 256 = 400 GB/s).
  # No per-chip DCN figure found: assumed v5e's 25 Gbit/s.
  "v6e": ChipSpec(
    "v6e",
    "TPU v6 lite",
    32 * GiB,
    918e12,
    1638 * _GB,
    400 * _GB,
    25e9 / 8,
    False,
    "DCN bandwidth assumed (no published per-chip figure)",
  ),  # fmt: skip
}

# The slice shapes offered (Cloud docs' tables of supported topologies; v5e/v6e single slices
# are 2D up to 16x16, v4/v5p 3D).
_ALIASES = {"v4": "v4", "v5e": "v5e", "v5litepod": "v5e", "v5p": "v5p", "v5": "v5p", "v6e": "v6e"}
_SHAPES_2D = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")
_SHAPES_3D = (
  "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16",
  "16x16x16",
)  # fmt: skip
KNOWN_SHAPES: dict[str, tuple[str, ...]] = {
  "v4": _SHAPES_3D,
  "v5e": _SHAPES_2D,
  "v5p": _SHAPES_3D,
  "v6e": _SHAPES_2D,
}


def _unknown(name: str) -> ValueError:
  listing = "; ".join(f"{g}: {' '.join(s)}" for g, s in KNOWN_SHAPES.items())
  return ValueError(
    f"unknown TPU topology {name!r}; known: {listing} (or an accelerator type like v4-128, "
    "v5litepod-256, v5p-128, v6e-64; or NVIDIA GPUs like h100:8, h100:2x8)"
  )


def _from_accelerator_type(gen: str, count: int, name: str) -> tuple[int, ...]:
  if CHIPS[gen].megacore and count % 2:
    raise _unknown(name)  # a megacore chip has two cores: an odd core count is no slice
  chips = count // 2 if CHIPS[gen].megacore else count
  for s in KNOWN_SHAPES[gen]:
    dims = tuple(int(d) for d in s.split("x"))
    if math.prod(dims) == chips:
      return dims
  raise _unknown(name)


def parse_topology(name: str, num_slices: int = 1) -> Topology:
  """``"v5e:16x16"`` / ``"v5e-256"`` / ``"v4:4x4x8"`` / ``"v4-256"`` -> Topology; GPU names
  (``"h100:8"``, ``"h100:2x8"``) as ``gpu_topology.parse_gpu_topology``; ValueError (one line,
  listing the known ones) for anything else."""
  if gpu_topology.is_gpu_name(name):
    return gpu_topology.parse_gpu_topology(name, num_slices)
  if num_slices < 1:
    raise ValueError(f"num_slices must be >= 1, got {num_slices}")
  text = name.strip().lower()
  m = re.fullmatch(r"(v\w+?):(\d+(?:x\d+)+)", text) or re.fullmatch(r"(v\w+?)-(\d+)", text)
  if not m or m.group(1) not in _ALIASES:
    raise _unknown(name)
  gen = _ALIASES[m.group(1)]
  if ":" in text:
    shape_text = m.group(2)
    if shape_text not in KNOWN_SHAPES[gen]:
      raise _unknown(name)
    shape = tuple(int(d) for d in shape_text.split("x"))
  else:
    shape = _from_accelerator_type(gen, int(m.group(2)), name)
  return Topology(f"{gen}:{'x'.join(map(str, shape))}", CHIPS[gen], shape, int(num_slices))


def topology_devices(topo: Topology) -> list[Any]:
  """The abstract (compile-only) devices of ``topo``; TopologyError when libtpu (for a GPU
  topology: the CUDA PJRT plugin) is missing."""
  if topo.is_gpu:
    return gpu_topology.gpu_topology_devices(topo)
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  # Not a TPU VM: no metadata server to ask for the host's TPU type and workers (libtpu would
  # print errors about both). Only the first libtpu start in a process reads these.
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", topo.accelerator_type)
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  try:
    desc = topologies.get_topology_desc(
      topology_name=topo.libtpu_name,
      platform="tpu",
      chip_config_name="megacore" if topo.chip.megacore else "default",
      chips_per_host_bounds=(2, 2, 1),
      num_slices=topo.num_slices,
    )
  except Exception as e:  # libtpu missing or refusing: one line, with the fix
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise TopologyError(
      f"cannot create TPU topology {topo.name}: {first} (compiling for TPU needs libtpu: "
      "pip install 'bert-jax[tpu]')"
    ) from e
  devices = list(desc.devices)
  if len(devices) != topo.num_devices:
    raise TopologyError(
      f"libtpu gave {len(devices)} devices for {topo.describe()}; expected {topo.num_devices}"
    )
  return devices


def num_slices_of(devices) -> int:
  """How many slices ``devices`` span (1 for devices without a slice index)."""
  return len({getattr(d, "slice_index", 0) for d in devices})
