"""Whether this host has an accelerator, read from the devices the kernel shows, without
starting JAX (which would probe and report every platform it has a plugin for).

A TPU shows as ``/dev/accel*`` or ``/dev/vfio`` (or Google's PCI vendor with a TPU device id);
an NVIDIA GPU as ``/dev/nvidia0`` / ``/dev/nvidiactl``, an AMD GPU as ``/dev/kfd``, a GPU under
WSL as ``/dev/dxg``. ``TPU_ACCELERATOR_TYPE`` (set on TPU VMs) counts as a TPU.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping

TPU_DEVICE_GLOBS = ("dev/accel*", "dev/vfio")
TPU_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = ("0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076")
GPU_DEVICE_FILES = ("dev/nvidia0", "dev/nvidiactl", "dev/dxg", "dev/kfd")


def accelerator_on_host(environ: Mapping[str, str], root: str = "/") -> str | None:
  """'tpu' or 'gpu' where this host shows one, else None."""
  if environ.get("TPU_ACCELERATOR_TYPE"):
    return "tpu"
  if any(glob.glob(os.path.join(root, pattern)) for pattern in TPU_DEVICE_GLOBS):
    return "tpu"
  if any(os.path.exists(os.path.join(root, path)) for path in GPU_DEVICE_FILES):
    return "gpu"
  for vendor in glob.glob(os.path.join(root, "sys/bus/pci/devices/*/vendor")):
    try:
      with open(vendor) as f:
        if f.read().strip() != TPU_PCI_VENDOR:
          continue
      with open(os.path.join(os.path.dirname(vendor), "device")) as f:
        if f.read().strip() in TPU_PCI_DEVICES:
          return "tpu"
    except OSError:
      continue
  return None
