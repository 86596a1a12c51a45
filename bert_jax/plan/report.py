"""What one compiled step costs on one chip, and how long a step should take (a roofline).

  rep = step_report("train seq128", lowered, asm, phase, topo)   # compiles; never raises on OOM
  rep.fits, rep.memory["total_bytes"], rep.estimate["step_seconds"], rep.collectives
  print(format_report(reports, topo))

Memory per chip: parameters and optimizer state are computed from the abstract state's
shardings (each array's shard); arguments, outputs (minus those aliased to donated inputs),
temporaries and the program come from the compiler's ``memory_analysis()``. "Fits" is the
compiler's verdict: when the program does not fit, the TPU compiler refuses it, and the numbers
of its message (needed, available, over by) are reported instead. XLA:GPU does not refuse a
program for memory: on a GPU topology "fits" is total <= what JAX may allocate there (HBM x
XLA_PYTHON_CLIENT_MEM_FRACTION, bert_jax.parallel.gpu_topology.available_bytes), with the same
numbers when it does not. FLOPs and bytes accessed: the compiler's ``cost_analysis()``; the GPU
compile-only client has none, so there they are XLA's generic HLO cost analysis (its rules applied
to the compiled GPU module's HLO text, ``hlo_text_cost``) plus the FLOPs of its cuBLAS GEMM calls
(read from the HLO: a custom call counts none).
A fused attention kernel compiled to a custom call (splash on TPUs, cuDNN's on GPUs: the step's
``attention_kernel``) has its FLOPs added from the model (``bert_jax.plan.attention``) where the
compiled module makes such calls: ``attention_flops`` per chip, inside ``flops``.

Time per step (per chip; every chip runs the same SPMD program):
  compute  = max(compiler FLOPs, model FLOPs / chips) / peak FLOP/s at the compute dtype
             (bf16; float32 = the chip's f32 matmul rate: TF32 on NVIDIA GPUs, bf16 on TPUs)
  hbm      = compiler "bytes accessed" / HBM bandwidth
  ici, dcn = bytes each chip moves in collectives over that network / its bandwidth
             (GPUs: NVLink within a host, InfiniBand between hosts)
  step     = max(compute, hbm, ici + dcn)        (perfect overlap: the roofline bound)
  serial   = compute + ici + dcn                  (no overlap: an upper estimate)
MFU = model FLOPs per step / (step x chips x that peak); model FLOPs are the task's
``flops_per_example`` (bert_jax/train/flops.py) x global batch, remat excluded.

The console table (``format_report``) gives each step's global batch and the sequences each chip
computes per step (global / (data x fsdp)). A step that fits with less than ``TIGHT_FREE``
(10%) of the chip's memory free (on GPUs: of what JAX may allocate) is flagged under the table,
``yes (tight: 0.64 GiB free, 4%)``: the compiler's total leaves out what a run adds beside the
step (the next batch's device buffers while this step runs, a checkpoint's host copies,
allocator fragmentation), so such a fit may not survive the run.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any

import jax

from bert_jax.parallel import gpu_topology
from bert_jax.parallel.topology import Topology
from bert_jax.plan import attention, hlo
from bert_jax.plan.hlo_cost import hlo_text_cost

_GPU_NETWORKS = {"ici": "nvlink", "dcn": "ib"}  # how a GPU report names the two networks
TIGHT_FREE = 0.10  # a fit with less than this fraction of the chip's memory free is "tight"
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class CompileError(ValueError):
  """The step does not compile for the topology for a reason other than memory."""


@dataclasses.dataclass
class StepReport:
  name: str
  fits: bool
  compile_seconds: float
  memory: dict[str, float]
  flops: float = 0.0
  bytes_accessed: float = 0.0
  collectives: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  estimate: dict[str, Any] = dataclasses.field(default_factory=dict)
  error: str = ""
  global_batch: int = 0  # sequences (rows) per step, all chips
  batch_per_chip: float = 0.0  # global_batch / (data x fsdp)
  attention_kernel: str = "reference"  # the model's attention kernel (bert_jax.plan.attention)
  attention_flops: float = 0.0  # per chip: the fused kernel's FLOPs added to ``flops``
  compiled: Any = dataclasses.field(default=None, repr=False, compare=False)  # not in to_dict

  def to_dict(self) -> dict[str, Any]:
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "compiled"}


def _num(text: str) -> float:
  m = re.fullmatch(r"([\d.]+)\s*([KMGT]?)i?B?", text.strip())
  if not m:
    raise ValueError(text)
  return float(m.group(1)) * _UNITS[m.group(2)]


def parse_hbm_shortfall(message: str) -> dict[str, float] | None:
  """{needed_bytes, available_bytes, over_bytes} from the TPU compiler's out-of-memory error;
  None when ``message`` is not one."""
  patterns = (
    r"\(([\d.]+[KMGT]?)\)\s*exceeds available HBM\s*\(([\d.]+[KMGT]?)\)",
    r"[Uu]sed\s+([\d.]+[KMGT]?)\s+of\s+([\d.]+[KMGT]?)\s+hbm",
  )
  for pattern in patterns:
    m = re.search(pattern, message)
    if m:
      needed, available = _num(m.group(1)), _num(m.group(2))
      over = re.search(r"[Ee]xceeded hbm capacity by\s+([\d.]+[KMGT]?)", message)
      return dict(
        needed_bytes=needed,
        available_bytes=available,
        over_bytes=_num(over.group(1)) if over else needed - available,
      )
  return None


def is_out_of_memory(message: str) -> bool:
  return parse_hbm_shortfall(message) is not None or bool(
    re.search(r"RESOURCE_EXHAUSTED|[Rr]an out of memory", message)
  )


def sharded_bytes(tree: Any) -> float:
  """Bytes one device holds of a tree of ShapeDtypeStructs carrying their shardings."""
  total = 0.0
  for leaf in jax.tree_util.tree_leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += math.prod(shape) * jax.numpy.dtype(leaf.dtype).itemsize
  return total


def compiled_memory(compiled, hbm_bytes: int) -> dict[str, float]:
  """Per-chip bytes of a compiled step (memory_analysis()): arguments, outputs, aliased,
  temporaries, code, their total and what is left of ``hbm_bytes``."""
  m = compiled.memory_analysis()
  arg, out, alias = m.argument_size_in_bytes, m.output_size_in_bytes, m.alias_size_in_bytes
  temp, code = m.temp_size_in_bytes, m.generated_code_size_in_bytes
  total = arg + out - alias + temp + code
  return dict(
    argument_bytes=arg,
    output_bytes=out,
    alias_bytes=alias,
    temp_bytes=temp,
    code_bytes=code,
    total_bytes=total,
    hbm_bytes=hbm_bytes,
    free_bytes=hbm_bytes - total,
  )


def _cost(compiled, loop_trips: int = 1) -> tuple[float, float]:
  """(FLOPs, bytes accessed) of one step on one chip. XLA's cost analysis counts the
  accumulation loop's body once: it is taken ``loop_trips`` times. The cuBLAS GEMMs' FLOPs
  (where the compiler reports no cost) are read per execution already (``hlo.cublas_flops``
  counts a loop's trips), so they are not multiplied again."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  gemm_flops = 0.0
  if not cost:  # the GPU compile-only client reports none
    cost = _hlo_cost(compiled)
    gemm_flops = hlo.cublas_flops(compiled.as_text())
  flops = float(cost.get("flops", 0.0)) * loop_trips + gemm_flops
  return flops, float(cost.get("bytes accessed", 0.0)) * loop_trips


def _hlo_cost(compiled) -> dict[str, float]:
  """XLA's HloCostAnalysis of the compiled (optimised, per-device) module, read from its HLO
  text (``hlo_text_cost``): for compilers whose executables report no cost (the GPU
  compile-only client)."""
  try:
    return hlo_text_cost(compiled.as_text())
  except Exception:  # no estimate is better than no report: model FLOPs remain the floor
    return {}


def estimate(
  flops: float,
  bytes_accessed: float,
  collectives: list[dict[str, Any]],
  topo: Topology,
  model_flops: float,
  tokens: int,
  compute_dtype: str = "bfloat16",
) -> dict[str, Any]:
  """The roofline of the module docstring; ``model_flops`` and ``tokens`` per step, all chips."""
  chip, chips = topo.chip, topo.num_devices
  peak = chip.matmul_peak(compute_dtype)
  compute_flops = max(flops, model_flops / chips)
  t = dict(
    compute_seconds=compute_flops / peak,
    hbm_seconds=bytes_accessed / chip.hbm_bandwidth,
    ici_seconds=sum(c["moved_bytes"] for c in collectives if c["network"] == "ici")
    / chip.ici_bandwidth,
    dcn_seconds=sum(c["moved_bytes"] for c in collectives if c["network"] == "dcn")
    / chip.dcn_bandwidth,
  )
  comm = t["ici_seconds"] + t["dcn_seconds"]
  step = max(t["compute_seconds"], t["hbm_seconds"], comm)
  bound = max(
    ("compute", t["compute_seconds"]), ("hbm", t["hbm_seconds"]), ("network", comm),
    key=lambda kv: kv[1],
  )[0]  # fmt: skip
  t.update(
    step_seconds=step,
    serial_seconds=t["compute_seconds"] + comm,
    bound=bound,
    tokens_per_second=tokens / step if step else 0.0,
    mfu=model_flops / (step * chips * peak) if step else 0.0,
    peak_flops=peak,
    compute_dtype=compute_dtype,
    model_flops=model_flops,
    compiler_flops_per_chip=flops,
  )
  return t


def step_report(
  name: str,
  lowered,
  topo: Topology,
  mesh,
  *,
  params_bytes: float,
  opt_state_bytes: float,
  model_flops: float,
  tokens: int,
  compute_dtype: str = "bfloat16",
  loop_trips: int = 1,
  global_batch: int = 0,
  attention_kernel: str = "reference",
  fused_attention_flops: float = 0.0,
) -> StepReport:
  """Compiles ``lowered`` for the topology and reports it; an out-of-memory refusal is a
  report with ``fits=False`` (other compile errors raise).

  ``loop_trips``: the trip count of the step's gradient-accumulation loop (a ``lax.scan``).
  XLA's cost analysis counts a loop's body once, so the step's FLOPs and bytes accessed are
  the analysis's times this (the optimizer update outside the loop, small beside the
  micro-steps, is then counted ``loop_trips`` times too; the cuBLAS GEMMs of a GPU module, read
  from its HLO, count once per trip already). Collectives are counted per
  execution from the HLO (``hlo.collectives``: once per trip inside the loop).
  ``global_batch``: the step's rows, all chips (the report's batch columns).
  ``attention_kernel``: the model's; ``fused_attention_flops``: that kernel's FLOPs per step,
  all chips (``attention.fused_attention_flops``), added to the compiler's (per chip: over
  the chips) where the compiled module calls the kernel as a custom call XLA counts nothing in."""
  dp = mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1) if mesh is not None else 1
  batch = dict(
    global_batch=int(global_batch), batch_per_chip=global_batch / dp,
    attention_kernel=attention_kernel,
  )  # fmt: skip
  start = time.perf_counter()
  try:
    compiled = (
      lowered.compile(**gpu_topology.compile_kwargs()) if topo.is_gpu else lowered.compile()
    )
  except Exception as e:  # the compiler's refusal is the answer we are after
    msg = str(e)
    if not is_out_of_memory(msg):
      first = next((line.strip() for line in msg.splitlines() if line.strip()), type(e).__name__)
      raise CompileError(f"{name} does not compile for {topo.describe()}: {first}") from e
    short = parse_hbm_shortfall(msg) or {}
    memory = dict(params_bytes=params_bytes, opt_state_bytes=opt_state_bytes, **short)
    memory["hbm_bytes"] = topo.chip.hbm_bytes
    first = next((line for line in msg.splitlines() if line.strip()), msg)
    return StepReport(name, False, time.perf_counter() - start, memory, error=first[:500], **batch)
  seconds = time.perf_counter() - start
  memory = dict(params_bytes=params_bytes, opt_state_bytes=opt_state_bytes)
  memory.update(compiled_memory(compiled, topo.chip.hbm_bytes))
  fits, error = _limit_check(memory, topo)
  flops, bytes_accessed = _cost(compiled, loop_trips)
  text = compiled.as_text()
  on = "gpu" if topo.is_gpu else "tpu"
  added = 0.0
  if fused_attention_flops and attention.fused_calls(text, attention_kernel, on):
    added = fused_attention_flops / topo.num_devices
  flops += added
  # GPUs: a collective whose groups span hosts goes over InfiniBand (reported as "dcn")
  hosts = [d.process_index for d in mesh.devices.flat] if topo.is_gpu else None
  colls = hlo.collectives(text, mesh, domains=hosts)
  est = estimate(flops, bytes_accessed, colls, topo, model_flops, tokens, compute_dtype)
  est["attention_flops_per_chip"] = added
  return StepReport(
    name, fits, seconds, memory, flops, bytes_accessed, colls, est, error, compiled=compiled,
    attention_flops=added, **batch,
  )  # fmt: skip


def _limit_check(memory: dict[str, float], topo: Topology) -> tuple[bool, str]:
  """Whether a compiled step's per-chip total fits the chip's limit; records the limit (and,
  when over, needed / over bytes) in ``memory``. GPUs: XLA:GPU compiles whatever the size, so
  the limit is what JAX may allocate (HBM x XLA_PYTHON_CLIENT_MEM_FRACTION). TPUs: the compiler
  refuses a program whose arguments + temporaries exceed its HBM (tested), but one case was
  seen where it accepted more than the chip has (docs/compile.md); a job that would run out of
  memory on the pod is worse than a refusal, so the chip's HBM is the limit."""
  total = memory["total_bytes"]
  if topo.is_gpu:
    limit = gpu_topology.available_bytes(topo.chip)
    memory.update(available_bytes=limit, free_bytes=limit - total)
    what = (
      f"needs {_gb(total)} GiB per GPU, {_gb(limit)} GiB available "
      f"(HBM x XLA_PYTHON_CLIENT_MEM_FRACTION)"
    )
  else:
    limit = topo.chip.hbm_bytes
    what = (
      f"compiled, but needs {_gb(total)} GiB per chip (arguments + temporaries), more than "
      f"the chip's {_gb(limit)} GiB of HBM"
    )
  if total <= limit:
    return True, ""
  memory.update(needed_bytes=total, over_bytes=total - limit)
  return False, what


def _gb(x: float) -> str:
  return f"{x / 1024**3:.2f}"


def _batch(x: float) -> str:
  return f"{x:g}" if x else "-"


def tight_fit(memory: dict[str, float]) -> str:
  """The note "tight: 0.64 GiB free, 4%" when a fitting step leaves less than ``TIGHT_FREE``
  of the chip's memory (HBM; on GPUs what JAX may allocate) free; "" otherwise."""
  limit = memory.get("available_bytes") or memory.get("hbm_bytes") or 0
  free = memory.get("free_bytes")
  if not limit or free is None or free >= TIGHT_FREE * limit:
    return ""
  return f"tight: {_gb(free)} GiB free, {free / limit:.0%}"


def _mfu(e: dict[str, Any]) -> str:
  return f"{e['mfu']:.0%}" if e["model_flops"] else "-"  # "-": the task states no model FLOPs


def format_report(reports: list[StepReport], topo: Topology, header: str = "") -> str:
  """A console table of the steps, then each step's collectives."""
  lines = [header] if header else []
  lines.append(f"Topology {topo.describe()}; HBM {_gb(topo.chip.hbm_bytes)} GiB per chip")
  if topo.is_gpu:
    lines.append(
      f"  JAX may allocate {_gb(gpu_topology.available_bytes(topo.chip))} GiB of it "
      "(XLA_PYTHON_CLIENT_MEM_FRACTION, default 0.75): 'fits' and 'free' are against that"
    )
  if topo.chip.notes:
    lines.append(f"  note: {topo.chip.notes}")
  est = next((r.estimate for r in reports if r.estimate), None)
  if est:
    lines.append(
      f"  peak {est['peak_flops'] / 1e12:,.1f} TFLOP/s per chip at {est['compute_dtype']} "
      "(the estimate's compute term and MFU)"
    )
  if reports:
    train = next((r for r in reports if r.name.startswith("train")), reports[0])
    lines.append("  " + attention.describe(train.attention_kernel, train.attention_flops))
  cols = (
    "step", "batch", "/chip", "fits", "params", "opt", "temp", "total", "free", "compile",
    "est. step", "tok/s",
  )  # fmt: skip
  lines.append(
    "{:<16} {:>6} {:>6} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>11}  MFU  bound".format(
      *cols
    )
  )
  tight = []
  for r in reports:
    m, e = r.memory, r.estimate
    head = f"{r.name:<16} {_batch(r.global_batch):>6} {_batch(r.batch_per_chip):>6}"
    if r.fits:
      note = tight_fit(m)
      if note:
        tight.append(f"  {r.name}: yes ({note})")
      lines.append(
        f"{head} {'tight' if note else 'yes':>5} {_gb(m['params_bytes']):>8} "
        f"{_gb(m['opt_state_bytes']):>8} {_gb(m['temp_bytes']):>8} {_gb(m['total_bytes']):>8} "
        f"{_gb(m['free_bytes']):>8} {r.compile_seconds:>7.1f}s {e['step_seconds'] * 1e3:>8.1f}ms "
        f"{e['tokens_per_second']:>11,.0f} {_mfu(e):>4}  {e['bound']}"
      )
    else:
      need = m.get("needed_bytes")
      detail = (
        f"needs {_gb(need)} GiB of {_gb(m['available_bytes'])} GiB available "
        f"(over by {_gb(m['over_bytes'])} GiB)"
        if need
        else r.error
      )
      lines.append(
        f"{head} {'NO':>5} {_gb(m['params_bytes']):>8} {_gb(m['opt_state_bytes']):>8}  "
        f"{detail}; compile {r.compile_seconds:.1f}s"
      )
  lines += tight
  if tight:
    lines.append(
      f"  (tight: under {TIGHT_FREE:.0%} of the chip's memory free; a run adds buffers the "
      "compiler does not count: docs/compile.md)"
    )
  lines.append(
    "  (batch: sequences per step, all chips; /chip: per chip, global / (data x fsdp); memory "
    "in GiB per chip; params/opt from the shardings, the rest from the compiler)"
  )
  for r in reports:
    if r.collectives:
      lines.append(f"  {r.name} collectives per step (per chip):")
      for c in r.collectives:
        net = _GPU_NETWORKS.get(c["network"], c["network"]) if topo.is_gpu else c["network"]
        lines.append(
          f"    {c['kind']:<18} over {c['axes']:<16} {net:<6}  x{c['count']:<5} "
          f"{c['bytes'] / 1024**2:>10.1f} MiB  moves {c['moved_bytes'] / 1024**2:>10.1f} MiB"
        )
  return "\n".join(lines)
