"""Collectives read from a compiled program's HLO text: kind, count, bytes, and the mesh axes
they run over.

  stats = collectives(compiled.as_text(), mesh)
  [{"kind": "all-gather", "axes": "fsdp", "count": 48, "bytes": ..., "moved_bytes": ...,
    "network": "ici"}, ...]

Each collective is counted once per execution: an op inside a ``while`` body (gradient
accumulation's scan) counts once per trip: the loop's ``known_trip_count`` where the compiler
writes one, else the bound its condition compares the counter with (``i < N``, the form a
``lax.scan`` takes; the TPU compiler drops the count from the optimised module); copies of one op that the TPU compiler
spreads over async start/done computations share a ``channel_id`` and count once. ``bytes`` is
the op's result per chip (for reduce-scatter, its input); ``moved_bytes`` what one chip sends
over the network for it in a ring algorithm (all-gather and all-to-all (n-1)/n of the full
array, reduce-scatter (n-1)/n of its input, all-reduce twice that, collective-permute the
array). The axes come from the replica groups (explicit ``{{0,1},...}``, iota ``[2,2]<=[4]``
or the ``mesh[...]`` form), matched against the groups each combination of mesh axes makes;
``network`` is "dcn" when a group spans TPU slices. The TPU compiler writes a reduce-scatter as
a fusion calling an ``all-reduce-scatter`` computation (an all-reduce, then each chip's slice of
the sum): such an all-reduce is counted as the reduce-scatter it is.

Multi-slice TPU programs: libtpu compiles one slice's program, so its replica groups name the
devices of one slice (``{{0,1,2,3}}`` for a 4-chip slice of an 8-chip mesh): such groups are
matched against the mesh axes within a slice, and run over ICI. The part of a collective that
crosses slices is not an XLA collective there but a host ``send`` (with its ``recv``) carrying
``_xla_megascale_transfer_type`` (``ALL_REDUCE``, ``ALL_GATHER``, ...) and
``_xla_megascale_target="{1,2}x{0:3}"`` (the slices taking part, then the chips of each): each
such send is counted as a collective of that kind over the slices (``network`` "dcn"; ``axes``
the mesh axes along which the slice changes), its bytes the send's array (an all-gather: that
times the slices, its result), moved as in a ring over the slices.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from typing import Any

import numpy as np

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

_DTYPE_BYTES = {
  "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
  "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_SHAPE = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_COMP_START = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*->.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OP = re.compile(r"\s(" + "|".join(KINDS) + r")(-start)?\(")
_CALLEE = re.compile(r"(?:calls|to_apply|body|condition|computations?)=\{?([^}]*?)\}?(?:,\s|$)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CONDITION = re.compile(r"condition=%?([\w.\-]+)")
_CONSTANT = re.compile(r"^\s*%?([\w.\-]+)\s*=\s*s(?:32|64)\[\][^=]*?\sconstant\((\d+)\)")
_MEGASCALE_TYPE = re.compile(r'_xla_megascale_transfer_type="(\w+)"')
_MEGASCALE_TARGET = re.compile(r'_xla_megascale_target="\{([^}]*)\}')
_RENDEZVOUS = re.compile(r'_xla_host_transfer_rendezvous="([^"]*)"')
_SEND = re.compile(r"\ssend\(")
_COMPARE_LT = re.compile(r"^\s*ROOT\s.*\scompare\(([^)]*)\),\s*direction=LT\b")


def shape_bytes(type_text: str) -> float:
  """Bytes of an HLO type (a shape or a tuple of shapes)."""
  total = 0.0
  for dtype, dims in _SHAPE.findall(type_text):
    size = _DTYPE_BYTES.get(dtype, 1 if dtype.startswith("f8") else 0)
    total += size * math.prod(int(d) for d in dims.split(",") if d)
  return total


def _tuple_elements(type_text: str) -> list[str]:
  """The top-level elements of an HLO tuple type ``(a, (b, c), ...)``; ``[type_text]`` when it
  is not a tuple."""
  text = type_text.strip()
  if not text.startswith("("):
    return [text]
  elements, depth, begin = [], 0, 1
  for i, ch in enumerate(text):
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
      if depth == 0:
        elements.append(text[begin:i])
        break
    elif ch == "," and depth == 1:
      elements.append(text[begin:i])
      begin = i + 1
  return [e for e in elements if e.strip()]


def _result_bytes(kind: str, start: bool, type_text: str) -> float:
  """Bytes of a collective's result. A combined collective (one op over several arrays) has a
  tuple of results, all of which count. An async all-gather / collective-permute start is typed
  ``(operand(s), result(s), ...)``: its second element is the result; an all-reduce start is
  typed as its result(s)."""
  if start and kind in ("all-gather", "collective-permute", "all-to-all"):
    elements = _tuple_elements(type_text)
    if len(elements) >= 2:
      return shape_bytes(elements[1])
  return shape_bytes(type_text)


def _split_computations(hlo: str) -> tuple[dict[str, list[str]], str]:
  comps: dict[str, list[str]] = {}
  entry, current = "", None
  for line in hlo.splitlines():
    m = _COMP_START.match(line)
    if m and not line.startswith(" "):
      current = m.group(2)
      comps[current] = []
      if m.group(1):
        entry = current
    elif line.startswith("}"):
      current = None
    elif current is not None:
      comps[current].append(line)
  return comps, entry


def _trip_count(line: str, comps: dict[str, list[str]]) -> int:
  """Trips of the ``while`` on ``line``: its known_trip_count, else N where its condition's
  root is ``counter < N`` with N a constant (a scan's counter starts at 0), else 1."""
  trip = _TRIP.search(line)
  if trip:
    return int(trip.group(1))
  cond = _CONDITION.search(line)
  body = comps.get(cond.group(1), []) if cond else []
  constants = dict(m.groups() for m in map(_CONSTANT.match, body) if m)
  for root in filter(None, map(_COMPARE_LT.match, body)):
    operands = [o.strip().lstrip("%") for o in root.group(1).split(",")]
    if len(operands) == 2 and operands[1] in constants:
      return int(constants[operands[1]])
  return 1


def _multiplicities(comps: dict[str, list[str]], entry: str) -> dict[str, int]:
  """How many times each computation runs per execution of the entry computation."""
  edges: dict[str, list[tuple[str, int]]] = defaultdict(list)
  for name, lines in comps.items():
    for line in lines:
      factor = _trip_count(line, comps) if " while(" in line else 1
      for group in _CALLEE.findall(line):
        for callee in re.findall(r"%?([\w.\-]+)", group):
          if callee in comps and callee != name:
            edges[name].append((callee, factor))
  mult: dict[str, int] = {}
  stack = [(entry, 1)]
  while stack:
    name, m = stack.pop()
    if mult.get(name, 0) >= m:
      continue
    mult[name] = m
    stack.extend((callee, m * f) for callee, f in edges[name])
  return mult


def _replica_groups(attrs: str, num_devices: int) -> list[tuple[int, ...]] | None:
  """Device groups of a collective from its attributes; None when not stated/parseable."""
  m = re.search(r"replica_groups=\{(\{[\d,\s{}]*\})\}", attrs)
  if m:
    return [
      tuple(int(x) for x in g.split(",") if x.strip())
      for g in re.findall(r"\{([^{}]*)\}", m.group(1))
    ]
  m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs)
  if m:
    ids = _iota(m.group(2), m.group(3))
    shape = [int(x) for x in m.group(1).split(",")]
    return [tuple(r) for r in ids.reshape(shape[0], -1).tolist()]
  m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))?\s*\{([^}]*)\}", attrs)  # fmt: skip
  if m:
    axes = re.findall(r"'([\w]+)'=(\d+)", m.group(1))
    names = [a for a, _ in axes]
    sizes = [int(s) for _, s in axes]
    ids = _iota(m.group(2), m.group(3)) if m.group(2) else np.arange(math.prod(sizes))
    ids = ids.reshape(sizes)
    over = [names.index(a) for a in re.findall(r"'([\w]+)'", m.group(4)) if a in names]
    rest = [i for i in range(len(sizes)) if i not in over]
    ids = ids.transpose(rest + over).reshape(-1, math.prod(sizes[i] for i in over) if over else 1)
    return [tuple(r) for r in ids.tolist()]
  if "replica_groups={}" in attrs or "replica_groups" not in attrs:
    return [tuple(range(num_devices))]
  return None


def _iota(dims: str, perm: str | None) -> np.ndarray:
  shape = [int(x) for x in dims.split(",")]
  ids = np.arange(math.prod(shape)).reshape(shape)
  if perm:
    ids = ids.transpose([int(x) for x in perm.split(",")])
  return ids.reshape(-1)


def _axis_partitions(mesh) -> dict[frozenset, str]:
  """{partition of flat device positions: "axis" or "axis+axis"} for every set of mesh axes."""
  names = list(mesh.axis_names)
  pos = np.arange(mesh.devices.size).reshape(mesh.devices.shape)
  out: dict[frozenset, str] = {}
  for r in range(1, len(names) + 1):
    for combo in itertools.combinations(range(len(names)), r):
      rest = [i for i in range(len(names)) if i not in combo]
      groups = pos.transpose(rest + list(combo)).reshape(-1, math.prod(pos.shape[i] for i in combo))
      key = frozenset(frozenset(g) for g in groups.tolist())
      label = "+".join(names[i] for i in combo if pos.shape[i] > 1) or "-"
      out.setdefault(key, label)
  return out


def _slice_positions(slice_of: list[int]) -> list[int]:
  """Flat mesh positions of the first slice's devices: what the device ids of a one-slice
  program's replica groups stand for (its chips in mesh order; every slice's program is the
  same)."""
  return [i for i, s in enumerate(slice_of) if s == slice_of[0]]


def _varying_axes(mesh, groups: list[tuple[int, ...]], positions: list[int]) -> str:
  """The mesh axes along which the devices of ``groups`` (indices into ``positions``, flat mesh
  positions) differ: "fsdp", "data+fsdp"; "?" when an index is out of range."""
  shape = mesh.devices.shape
  varying: set[int] = set()
  for g in groups:
    if any(i >= len(positions) for i in g):
      return "?"
    coords = np.array(np.unravel_index([positions[i] for i in g], shape))
    varying.update(i for i in range(len(shape)) if len(set(coords[i].tolist())) > 1)
  return "+".join(mesh.axis_names[i] for i in sorted(varying)) or "-"


def _slice_axes(mesh, slice_of: list[int]) -> str:
  """The mesh axes along which the slice changes ("data", "data+fsdp"): those of a cross-slice
  transfer."""
  slices = np.array(slice_of).reshape(mesh.devices.shape)
  axes = [
    name
    for i, name in enumerate(mesh.axis_names)
    if slices.shape[i] > 1 and (np.diff(slices, axis=i) != 0).any()
  ]
  return "+".join(axes) or "-"


def _target_slices(attrs: str, default: int) -> int:
  """How many slices a megascale transfer spans: the entries of its target's first set (``{1,2}``;
  a range ``a:b`` counts b - a + 1)."""
  m = _MEGASCALE_TARGET.search(attrs)
  if not m:
    return default
  count = 0
  for part in filter(None, (p.strip() for p in m.group(1).split(","))):
    if ":" in part:
      a, b = part.split(":", 1)
      count += int(b) - int(a) + 1 if a.isdigit() and b.isdigit() else 1
    else:
      count += 1
  return count or default


def _megascale(kind_name: str, type_text: str, size: int) -> tuple[str, float, float]:
  """(kind, bytes, moved bytes) of a cross-slice transfer whose send carries ``type_text``
  (its array first) over ``size`` slices."""
  kind = kind_name.lower().replace("_", "-")
  nbytes = shape_bytes(_tuple_elements(type_text)[0])
  frac = (size - 1) / size if size > 1 else 0.0
  if kind == "all-gather":
    return kind, nbytes * size, nbytes * (size - 1)  # sends its piece; its result: all pieces
  if kind == "all-reduce":
    return kind, nbytes, 2 * nbytes * frac
  return kind, nbytes, nbytes * frac


def collectives(hlo: str, mesh, domains: list[int] | None = None) -> list[dict[str, Any]]:
  """Aggregated collectives of a compiled module (see the module docstring), largest first.
  ``domains``: each device's fast-network domain, in ``mesh.devices.flat`` order (default: its
  TPU slice; for GPUs its host); a group spanning domains goes over the "dcn" network."""
  comps, entry = _split_computations(hlo)
  mult = _multiplicities(comps, entry)
  n = mesh.devices.size
  partitions = _axis_partitions(mesh)
  slice_of = domains or [getattr(d, "slice_index", 0) for d in mesh.devices.flat]
  num_slices = len(set(slice_of))
  first = _slice_positions(slice_of)
  in_slice = num_slices > 1 and not domains  # libtpu: one slice's program, its own device ids
  seen: dict[Any, dict] = {}
  for name, lines in comps.items():
    times = mult.get(name, 0)
    if not times:
      continue
    fused_reduce_scatter = name.startswith("all-reduce-scatter")
    for line in lines:
      m = _INSTR.match(line)
      if m and in_slice and _SEND.search(line):
        transfer = _MEGASCALE_TYPE.search(line)
        if transfer:
          send = _SEND.search(line)
          size = _target_slices(line, num_slices)
          kind, nbytes, moved = _megascale(
            transfer.group(1), line[line.index("=") + 1 : send.start() + 1], size
          )
          rendezvous = _RENDEZVOUS.search(line)
          key = ("megascale", rendezvous.group(1) if rendezvous else (name, m.group(1)))
          prev = seen.get(key)
          if prev is None or prev["times"] < times:
            seen[key] = dict(
              kind=kind, axes=_slice_axes(mesh, slice_of), times=times, bytes=nbytes,
              moved=moved, dcn=True, size=size,
            )  # fmt: skip
        continue
      op = _OP.search(line) if m else None
      if not op:
        continue
      kind, start = op.group(1), op.group(2)
      type_text = line[line.index("=") + 1 : op.start() + 1]
      nbytes = _result_bytes(kind, bool(start), type_text)
      attrs = line[op.end() :]
      channel = re.search(r"channel_id=(\d+)", attrs)
      key = (kind, channel.group(1)) if channel else (kind, name, m.group(1))
      groups = _replica_groups(attrs, len(first) if in_slice else n)  # in_slice: its own ids
      size = len(groups[0]) if groups else n
      local = bool(in_slice and groups) and all(max(g, default=0) < len(first) for g in groups)
      if fused_reduce_scatter and kind == "all-reduce":
        kind, nbytes = "reduce-scatter", nbytes / size  # the result: this chip's slice
      if kind == "collective-permute":
        pairs = re.findall(r"\{(\d+),(\d+)\}", attrs.split("source_target_pairs=")[-1][:2000])
        axes = "permute"
        dcn = not local and any(
          slice_of[int(a)] != slice_of[int(b)] for a, b in pairs if int(a) < n and int(b) < n
        )
        moved = nbytes
      else:
        if local:  # a one-slice program's groups: ids within the slice, over its ICI
          axes = _varying_axes(mesh, groups, first)
          dcn = False
        else:
          axes = partitions.get(frozenset(frozenset(g) for g in groups), "?") if groups else "?"
          dcn = bool(groups) and any(len({slice_of[i] for i in g if i < n}) > 1 for g in groups)
        frac = (size - 1) / size if size > 1 else 0.0
        moved = {
          "all-gather": nbytes * frac,
          "reduce-scatter": nbytes * (size - 1),
          "all-reduce": 2 * nbytes * frac,
          "all-to-all": nbytes * frac,
        }[kind]
        if kind == "reduce-scatter":
          nbytes *= size  # report the input, the array being reduced
      prev = seen.get(key)
      if prev is None or prev["times"] < times:
        seen[key] = dict(
          kind=kind, axes=axes, times=times, bytes=nbytes, moved=moved, dcn=dcn, size=size
        )
  agg: dict[tuple, dict] = {}
  for c in seen.values():
    k = (c["kind"], c["axes"], "dcn" if c["dcn"] else "ici")
    a = agg.setdefault(
      k, dict(kind=k[0], axes=k[1], network=k[2], count=0, bytes=0.0, moved_bytes=0.0)
    )
    a["count"] += c["times"]
    a["bytes"] += c["bytes"] * c["times"]
    a["moved_bytes"] += c["moved"] * c["times"]
  return sorted(agg.values(), key=lambda a: -a["moved_bytes"])


_CUBLAS = re.compile(r'custom_call_target="__cublas\$(?:lt\$matmul|gemm)"')
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*([a-z]\w*\[[\d,]*\])")


def cublas_flops(text: str) -> float:
  """FLOPs of the cuBLAS GEMM calls of a compiled GPU module (HloCostAnalysis counts none for a
  custom call): 2 x result elements x contracted size, per execution of their computation."""
  comps, entry = _split_computations(text)
  times = _multiplicities(comps, entry)
  shapes = {m.group(1): m.group(2) for ls in comps.values() for m in map(_DEF.match, ls) if m}
  total = 0.0
  for name, lines in comps.items():
    for line in filter(_CUBLAS.search, lines):
      lhs = re.search(r"custom-call\(%?([\w.\-]+)", line)
      contracting = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', line)
      result = _SHAPE.search(line.split("=", 1)[1])  # (result, workspace): the first
      if not (lhs and contracting and result and lhs.group(1) in shapes):
        continue
      dims = [int(d) for d in _SHAPE.search(shapes[lhs.group(1)]).group(2).split(",") if d]
      k = math.prod(dims[int(i.strip('" '))] for i in contracting.group(1).split(",") if i)
      n = math.prod(int(d) for d in result.group(2).split(",") if d)
      total += 2.0 * n * k * times.get(name, 0)
  return total
