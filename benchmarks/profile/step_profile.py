"""Where a training step's time goes, per op: XLA:CPU's thunks for a jitted JAX step, PyTorch's
profiler for an eager one, both grouped into the same few kinds of work.

  jax_profile(run, batches, steps, compiled_text, top=10)  -> Profile   (needs the XLA flag below)
  torch_profile(run, batches, steps, top=10)               -> Profile
  print(format_profiles({"bert_jax": p1, "torch_masked": p2}, steps))

XLA:CPU emits one profiler event per executed thunk (the compiled HLO's top-level instruction:
a fusion, a copy, a custom call) when the process starts with
``XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true``; ``jax.profiler`` records them and
``jax.profiler.ProfileData`` reads them back. Each instruction is put in a kind by what its fused computation
contains (a dot: matmul, with whatever elementwise work is fused into it; random bits, known by
its source ops since XLA:CPU expands the generator into integer arithmetic; a gather / scatter;
a reduce; copies; else elementwise) and named by the source ops in its metadata.
PyTorch's ``torch.profiler`` gives each aten op's self time, grouped by its name into the same
kinds. Times are summed over the profiled steps and over threads (XLA runs independent thunks
concurrently on its two client threads, so kinds can add up to more than wall time).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import re
import tempfile
import time

import jax

TRACEME_FLAG = "--xla_cpu_enable_xprof_traceme=true"
KINDS = ("matmul", "reduce", "elementwise", "random bits", "gather / scatter", "copy", "other")
_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*?\b([a-z][\w\-]*)\(")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]+)"')


@dataclasses.dataclass
class Profile:
  wall_seconds: float  # per step
  by_kind: dict[str, float]  # seconds per step
  top: list[tuple[str, str, float]]  # (op, kind, seconds per step): longest, then non-matmul
  by_source: list[tuple[str, float]]  # non-matmul time by source op (layers merged), longest first


def _computations(hlo_text: str) -> dict[str, list[str]]:
  comps, name = {}, None
  for line in hlo_text.splitlines():
    m = re.match(r"^(?:ENTRY )?%([\w.\-]+) ", line)
    if m and line.rstrip().endswith("{"):
      name = m.group(1)
      comps[name] = []
    elif name is not None and line.strip() != "}":
      comps[name].append(line)
  return comps


def classify_instructions(hlo_text: str) -> dict[str, tuple[str, str]]:
  """Instruction name -> (kind, source ops) for every instruction of a compiled module."""
  comps = _computations(hlo_text)

  def opcodes(comp: str, depth: int = 0) -> tuple[set[str], list[str]]:
    ops, names = set(), []
    for line in comps.get(comp, []):
      m = _INSTR.match(line)
      if m:
        ops.add(m.group(2))
      n = _OP_NAME.search(line)
      if n:
        names.append(n.group(1))
      c = _CALLS.search(line)
      if c and depth < 3:
        sub_ops, sub_names = opcodes(c.group(1), depth + 1)
        ops |= sub_ops
        names += sub_names
    return ops, names

  out = {}
  for lines in comps.values():
    for line in lines:
      m = _INSTR.match(line)
      if not m:
        continue
      name, opcode = m.groups()
      ops, names = {opcode}, []
      n = _OP_NAME.search(line)
      if n:
        names.append(n.group(1))
      c = _CALLS.search(line)
      if c:
        sub_ops, sub_names = opcodes(c.group(1))
        ops |= sub_ops
        names += sub_names
      out[name] = (_kind(ops, names), _short(names))
  return out


def _kind(ops: set[str], names: list[str]) -> str:
  if ops & {"dot", "convolution"}:
    return "matmul"
  # XLA:CPU expands the random-bit generator into integer arithmetic: known by its source ops
  if ops & {"rng-bit-generator", "rng"} or any(
    w in n for n in names for w in ("random_bits", "threefry", "rng_bit")
  ):
    return "random bits"
  if ops & {"gather", "scatter", "dynamic-slice", "dynamic-update-slice"}:
    return "gather / scatter"
  if ops & {"reduce", "reduce-window"}:
    return "reduce"
  if ops <= {"copy", "transpose", "bitcast", "parameter", "tuple", "get-tuple-element"}:
    return "copy"
  if ops & {"custom-call", "while", "conditional", "call"}:
    return "other"
  return "elementwise"


def _short(names: list[str]) -> str:
  """The most specific source ops of an instruction, without the jit(...)/ prefixes."""
  seen = []
  for n in names:
    tail = "/".join(p for p in n.split("/") if not p.startswith(("jit(", "jvp(", "transpose(")))
    tail = re.sub(r"\[.*?\]", "", tail)[-70:]
    if tail and tail not in seen:
      seen.append(tail)
  return "; ".join(seen[:2])


def jax_profile(run, batches, steps: int, compiled_text: str, top: int = 10) -> Profile:
  kinds = classify_instructions(compiled_text)
  jax.block_until_ready(run(batches[0]))  # compiled and warm
  with tempfile.TemporaryDirectory() as logdir:
    jax.profiler.start_trace(logdir)
    t = time.perf_counter()
    for i in range(steps):
      out = run(batches[i % len(batches)])
    jax.block_until_ready(out)
    wall = (time.perf_counter() - t) / steps
    jax.profiler.stop_trace()
    (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    data = jax.profiler.ProfileData.from_file(path)
  per_op: collections.Counter = collections.Counter()
  for plane in data.planes:
    for line in plane.lines:
      for ev in line.events:
        stats = dict(ev.stats)
        if "hlo_op" in stats:
          per_op[stats["hlo_op"]] += ev.duration_ns / 1e9 / steps
  rows = {op: (s, *kinds.get(op, ("other", ""))) for op, s in per_op.items()}
  return _summarise(wall, rows, top)


_TORCH_KINDS = (
  ("matmul", ("mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "scaled_dot_product", "flash")),
  ("random bits", ("bernoulli", "dropout", "rand", "uniform")),
  ("gather / scatter", ("gather", "scatter", "index", "embedding", "take")),
  ("reduce", ("softmax", "layer_norm", "sum", "mean", "norm", "max", "nll", "cross_entropy")),
  ("copy", ("copy", "clone", "contiguous", "to", "transpose", "permute", "view", "cat")),
)


def torch_profile(run, batches, steps: int, top: int = 10) -> Profile:
  import torch  # optional (not a bert_jax dependency), and heavy

  run(batches[0])  # warm
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    t = time.perf_counter()
    for i in range(steps):
      run(batches[i % len(batches)])
    wall = (time.perf_counter() - t) / steps
  rows = {}
  for e in prof.key_averages():
    if not e.key.startswith("aten::") or e.self_cpu_time_total <= 0:
      continue
    op = e.key[len("aten::") :]
    kind = next((k for k, keys in _TORCH_KINDS if any(w in op for w in keys)), "elementwise")
    if op.startswith("_foreach"):
      kind = "elementwise"  # the optimizer's fused updates
    rows[op] = (e.self_cpu_time_total / 1e6 / steps, kind, "")
  return _summarise(wall, rows, top)


def _summarise(wall: float, rows: dict[str, tuple[float, str, str]], top: int) -> Profile:
  by_kind = dict.fromkeys(KINDS, 0.0)
  for seconds, kind, _ in rows.values():
    by_kind[kind] += seconds
  ranked = sorted(((op, kind, s) for op, (s, kind, _) in rows.items()), key=lambda r: -r[2])
  # the longest ops, and the longest that are not matmuls (where a step's overhead hides)
  longest = ranked[:top] + [r for r in ranked if r[1] != "matmul"][:top]
  named = [(f"{op} [{rows[op][2]}]" if rows[op][2] else op, k, s) for op, k, s in longest]
  sources: collections.Counter = collections.Counter()
  for op, (seconds, kind, source) in rows.items():
    if kind != "matmul":
      first = (source or op).split("; ")[0]
      sources[re.sub(r"layer_\d+", "layer_N", re.sub(r"[._]\d+$", "", first))] += seconds
  return Profile(wall, by_kind, list(dict.fromkeys(named)), sources.most_common(max(15, top)))


def format_profiles(profiles: dict[str, Profile]) -> str:
  names = list(profiles)
  lines = [
    "| kind (seconds per step) | " + " | ".join(names) + " |",
    "|---|" + "---|" * len(names),
  ]
  for kind in KINDS:
    lines.append(
      f"| {kind} | " + " | ".join(f"{profiles[n].by_kind[kind]:.2f}" for n in names) + " |"
    )
  lines.append(
    "| sum of op times | "
    + " | ".join(f"{sum(profiles[n].by_kind.values()):.2f}" for n in names)
    + " |"
  )
  lines.append(
    "| wall time | " + " | ".join(f"{profiles[n].wall_seconds:.2f}" for n in names) + " |"
  )
  for n in names:
    lines.append(f"\n{n}: the longest ops, then the longest other than matmuls (s per step)")
    for op, kind, s in profiles[n].top:
      lines.append(f"  {s:7.3f}  {kind:<16} {op[:150]}")
    lines.append(f"{n}: time other than matmuls by source op, all layers together (s per step)")
    for source, s in profiles[n].by_source:
      lines.append(f"  {s:7.3f}  {source[:150]}")
  return "\n".join(lines)
