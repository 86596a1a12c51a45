"""The device mesh: axes ``data``, ``fsdp``, ``tensor`` with sizes from ``config.mesh``.

  mesh = create_mesh(config.mesh)            # sizes {data: -1, fsdp: 2, tensor: 1} on 8 devices
  mesh.shape -> {'data': 4, 'fsdp': 2, 'tensor': 1}

One size may be -1 (the rest of the devices). Devices from several TPU slices (a multi-slice
topology, ``bert_jax.parallel.topology``) get ``data`` (then ``fsdp``) split across the slices. Sizes whose product is not the device count, or a
mesh larger than the devices there are, raise ValueError naming the ``mesh`` config keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils

from bert_jax.parallel.topology import num_slices_of

MESH_AXES = ("data", "fsdp", "tensor")


def resolve_mesh_shape(sizes: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
  """Sizes in MESH_AXES order with a single -1 filled in; ValueError when they do not fit."""
  unknown = set(sizes) - set(MESH_AXES)
  if unknown:
    raise ValueError(f"config.mesh: unknown mesh axes {sorted(unknown)}; use {MESH_AXES}")
  shape = [int(sizes.get(a, 1)) for a in MESH_AXES]
  described = ", ".join(f"mesh.{a}={s}" for a, s in zip(MESH_AXES, shape))
  if any(s == 0 or s < -1 for s in shape):
    raise ValueError(f"config.mesh: sizes must be positive or -1, got {described}")
  if shape.count(-1) > 1:
    raise ValueError(f"config.mesh: at most one axis may be -1, got {described}")
  known = math.prod(s for s in shape if s != -1)
  if known > num_devices:
    raise ValueError(
      f"config.mesh: the mesh ({described}) needs {known} devices but only "
      f"{num_devices} are available"
    )
  if -1 in shape:
    if num_devices % known:
      raise ValueError(f"config.mesh: {num_devices} devices do not divide into {described}")
    shape[shape.index(-1)] = num_devices // known
  elif known != num_devices:
    raise ValueError(
      f"config.mesh: the mesh ({described}) has {known} devices but "
      f"{num_devices} are available; set one axis to -1 to use them all"
    )
  return tuple(shape)


def create_mesh(
  sizes: Mapping[str, int], devices: Sequence[jax.Device] | None = None
) -> jax.sharding.Mesh:
  """A Mesh over ``devices`` (default: all, across processes) with axes data, fsdp, tensor.

  Devices are laid out with mesh_utils so that the innermost axes (tensor, then fsdp) get the
  fastest interconnect; across hosts, data is the outer (slowest) axis.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(dict(sizes), len(devices))
  slices = num_slices_of(devices)
  if slices > 1:  # TPU slices joined by the data-center network (e.g. a compile-only topology)
    ici, dcn = split_across(shape, slices)
    if ici is None:
      raise ValueError(
        f"config.mesh: {dict(zip(MESH_AXES, shape))} cannot be split across {slices} slices: "
        "data x fsdp must be a multiple of the number of slices"
      )
    arr = mesh_utils.create_hybrid_device_mesh(
      ici, dcn, devices, process_is_granule=False, allow_split_physical_axes=True
    )
    return jax.sharding.Mesh(arr, MESH_AXES)
  if jax.process_count() > 1 and devices[0].platform != "cpu":
    ici, dcn = split_across(shape, jax.process_count())
    if ici is not None and math.prod(ici) == jax.local_device_count():
      arr = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
      return jax.sharding.Mesh(arr, MESH_AXES)
  try:
    arr = mesh_utils.create_device_mesh(shape, devices)
  except (ValueError, NotImplementedError, AssertionError):
    arr = np.asarray(devices).reshape(shape)
  return jax.sharding.Mesh(arr, MESH_AXES)


def split_across(shape: Sequence[int], groups: int):
  """(within-group sizes, across-group sizes) with the data axis (then fsdp, then tensor) split
  across ``groups`` (hosts or slices); (None, None) when the sizes do not allow it."""
  dcn = [1] * len(shape)
  ici = list(shape)
  for i in range(len(shape)):
    g = math.gcd(groups, ici[i])
    dcn[i], ici[i], groups = g, ici[i] // g, groups // g
  return (ici, dcn) if groups == 1 else (None, None)


def data_parallel_size(mesh: jax.sharding.Mesh) -> int:
  """How many ways a batch is split (data x fsdp)."""
  return mesh.shape["data"] * mesh.shape["fsdp"]
