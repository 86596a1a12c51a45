"""The mesh planner: which data x fsdp x tensor layout, remat and gradient accumulation to run.

  plan = make_plan(config, topo, phase=0, max_meshes=6, cache_dir="~/.cache/bert_jax/plans")
  print(format_plan(plan)); plan["best"]

Candidates: every factorisation of the chip count into data x fsdp x tensor (tensor 1-8; data x
fsdp must divide the phase's global batch), in the order tensor, then fsdp, ascending (the
layouts that communicate least first), at most ``max_meshes`` of them. For each mesh: remat
off, then on; for each, gradient accumulation 1, 2, 4, ... (the per-chip micro-batch halving)
until the compiler accepts the step, down to one sequence per chip, or until a compile fails
for a reason other than memory (a compiler crash: more accumulation is no remedy). Remat on is
compiled only when remat off does not fit at accumulation 1 (recomputing the forward pass only
adds work). Attention kernels (``attention.fused_choices``): the kernel ``config.attention_kernel``
resolves to on the topology; where it is "auto" and resolves to a fused kernel (attention dropout
0), the reference path is searched beside it (the fused kernel keeps no L x L probabilities, but
its backward pass recomputes the scores), each mesh with each kernel. Every row names its kernel.
Every compile is cached on disk (JSON, one file per candidate, keyed by the config with the
candidate's overrides, the topology with its chip's numbers, ``ESTIMATE_VERSION``, jax and
libtpu versions, a digest of bert_jax's sources, the compiler settings of
``isolation.compiler_settings``), so a re-plan costs no compile. The meshes
are searched concurrently (``workers`` threads; by default as the host's cores and memory allow,
see ``default_workers``), and each compile runs in a child process (``compile_isolated``): a
crash of the compiler is one failed candidate, not the end of the plan. Rows: fits first,
fastest estimated step first; then the candidates that do not fit, with the compiler's numbers
(or, for a compile that failed otherwise, its error).

Before any compile the config is checked as a run checks it (``check_run_config``; the task's
checks; ``phase`` must be one of the run's phases; each candidate's batch layout: a layout the
run would refuse, e.g. one the eval batch does not divide over, is not a candidate). A cache
entry that cannot be read (empty, cut short) is a warning naming its file and is compiled
again. While it runs the plan logs a line at least every 30 s (the meshes searched of N, with an
ETA after the first, the compiles done, what is compiling and for how long). An interrupt
(Ctrl-C) kills the compiling children and starts no other compile; ``make_plan`` then raises
KeyboardInterrupt within seconds.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import pathlib
import threading
import time
from typing import Any

import jax
import numpy as np
from absl import logging

from bert_jax.parallel.topology import Topology, topology_devices
from bert_jax.plan import attention, isolation
from bert_jax.plan.compiler import compile_for_topology
from bert_jax.runs.jobs import build_job
from bert_jax.runs.rules import check_run_config, config_rules
from bert_jax.train import progress as progress_lib
from bert_jax.train.run_config import check_batch_layout

# Part of every cache key: bump it when bert_jax/plan/report.py's estimate changes its formula.
# 2: the compute term uses the chip's float32 matmul rate for float32 steps (TF32 on GPUs).
# 3: the TPU compiler's fused reduce-scatters are counted as reduce-scatters (were all-reduces).
# 4: with gradient accumulation, FLOPs and bytes are the accumulation loop's body times its trips.
# 5: collectives inside the accumulation loop count once per trip (the TPU module gives the bound
#    only in the loop's condition; they counted once).
# 6: multi-slice: the cross-slice part of a collective (libtpu's megascale send / recv) is costed
#    at DCN bandwidth, and a one-slice program's replica groups are matched within a slice.
# 7: a fused attention kernel's FLOPs (a custom call XLA counts none in) are added from the model.
# 8: a GPU step's cuBLAS GEMM FLOPs inside the accumulation loop count once per trip (were
#    multiplied by the trips twice).
ESTIMATE_VERSION = 8
# What a quick plan screens its candidates with (``make_plan(quick=True)``).
QUICK = dict(jax_exec_time_optimization_effort=-1.0)
PROGRESS_INTERVAL_SEC = progress_lib.INTERVAL_SEC  # a plan's progress lines, at least this often


def mesh_candidates(num_devices: int, global_batch: int, max_tensor: int = 8) -> list[tuple]:
  """(data, fsdp, tensor) with product ``num_devices``, tensor a power of two <= max_tensor and
  data x fsdp dividing ``global_batch``; fewest tensor, then fewest fsdp, first."""
  out = []
  t = 1
  while t <= min(max_tensor, num_devices):
    if num_devices % t == 0:
      dp = num_devices // t
      for f in range(1, dp + 1):
        if dp % f == 0 and global_batch % dp == 0:
          out.append((dp // f, f, t))
    t *= 2
  return out


def _versions() -> str:
  try:
    libtpu = importlib.metadata.version("libtpu")
  except importlib.metadata.PackageNotFoundError:
    libtpu = "none"
  return f"jax {jax.__version__} libtpu {libtpu}"


@functools.cache
def _code_digest() -> str:
  """A digest of bert_jax's own sources: a cached compile is of the code that made it (a change
  to the model or the step changes what the compiler is given, the config being the same)."""
  package = pathlib.Path(__file__).resolve().parent.parent
  h = hashlib.sha256()
  for path in sorted(package.rglob("*.py")):
    h.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
  return h.hexdigest()[:16]


def _candidate_config(
  config, mesh: tuple, remat: bool, accum: int, phase: int, kernel: str | None = None
):
  c = config.copy_and_resolve_references()
  c.unlock()
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh
  c.remat = remat
  if kernel is not None:
    c.attention_kernel = kernel
  if phase == 0:
    c.grad_accum_steps = accum
  else:
    c.phase2.grad_accum_steps = accum
  return c


def _key(config, topo: Topology, phase: int) -> str:
  text = json.dumps(
    [
      json.loads(config.to_json_best_effort()),
      topo.to_dict(),  # the chip's numbers: a changed spec is a new estimate
      phase,
      ESTIMATE_VERSION,
      _versions(),
      _code_digest(),
      isolation.compiler_settings(),
    ],
    sort_keys=True,
  )
  return hashlib.sha256(text.encode()).hexdigest()[:24]


def _cache_path(config, topo: Topology, phase: int, cache_dir: str) -> str:
  """The candidate's cache file; "" when caching is off."""
  if not cache_dir:
    return ""
  return os.path.join(os.path.expanduser(cache_dir), f"{_key(config, topo, phase)}.json")


def _read_cached(path: str) -> dict | None:
  """The cache entry at ``path``; None when there is none, or (with a warning naming the file)
  when it cannot be read: an empty or cut-short entry is compiled again, not the end of a plan."""
  if not path or not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      entry = json.load(f)
    if not isinstance(entry, dict) or not entry.get("steps"):
      raise ValueError("not a compile result")
  except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
    logging.warning("%s: unreadable plan-cache entry (%s); compiling it again", path, e)
    return None
  return dict(entry, cached=True)


def compile_cached(config, topo: Topology, phase: int, cache_dir: str, devices=None) -> dict:
  """One candidate's train-step report (``compile_for_topology`` of one phase, no eval),
  read from ``cache_dir`` when this exact config was compiled before."""
  path = _cache_path(config, topo, phase, cache_dir)
  cached = _read_cached(path)
  if cached is not None:
    return cached
  result = compile_for_topology(config, topo, phases=[phase], with_eval=False, devices=devices)
  result.pop("reports")
  if path:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
      json.dump(result, f)
    os.replace(tmp, path)
  return dict(result, cached=False)


def compile_isolated(
  config, topo: Topology, phase: int, cache_dir: str, command: tuple[str, ...] | None = None
) -> dict:
  """``compile_cached`` in a child process (``isolation.run_in_child``; ``command`` replaces
  the worker in tests): a crash of the compiler (libtpu segfaulted here on a BERT-base candidate
  of 1,024 sequences per chip with remat) or a step that does not compile becomes a failed
  candidate whose error says why, not the end of the plan. A crashed child's output is kept
  beside the cache entry (``<key>.failed.log``). Cache hits are read here without a child."""
  path = _cache_path(config, topo, phase, cache_dir)
  cached = _read_cached(path)
  if cached is not None:
    return cached
  start = time.perf_counter()
  log_path = f"{path[: -len('.json')]}.failed.log" if path else ""
  try:
    return isolation.run_in_child(
      "compile_cached", (config, topo, phase, cache_dir), log_path, command
    )
  except ValueError as e:
    error = str(e)
  step = dict(
    fits=False, memory={}, estimate=None, compile_seconds=time.perf_counter() - start, error=error
  )
  return dict(steps=[step], fits=False, cached=False)


def default_workers(num_meshes: int) -> int:
  """Concurrent compiles when not given: one per two cores (XLA's compiler runs some of its own
  passes in parallel) and per 8 GiB of available memory (compiling BERT-base for 256 chips
  peaked at 7 GB here), at most one per mesh, at least one."""
  try:
    with open("/proc/meminfo") as f:
      available = next(int(x.split()[1]) * 1024 for x in f if x.startswith("MemAvailable:"))
  except (OSError, StopIteration, ValueError, IndexError):
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  by_memory = available // (8 * 1024**3)
  return max(1, min(num_meshes, (os.cpu_count() or 1) // 2, by_memory))


def plan_phases(config, topo: Topology | None = None) -> int:
  """How many train phases a run of ``config`` has (pre-training with a seq-512 phase: 2); the
  task's checks of ``config``, its attention kernel resolved for ``topo``'s chips."""
  mesh = None
  if topo is not None and attention.kernel_for(config, topo) != "reference":
    devices = np.asarray(topology_devices(topo)).reshape(-1, 1, 1)  # only their platform counts
    mesh = jax.sharding.Mesh(devices, ("data", "fsdp", "tensor"))
  return len(build_job(config, abstract=True, mesh=mesh).program.phases)


def check_plan_args(
  config, topo: Topology, *, phase: int = 0, max_meshes: int = 6, workers: int = 0
) -> list[tuple]:
  """The checks of ``make_plan``'s input, before any compile: ValueError naming the argument
  or config key; the mesh candidates (``mesh_candidates``, at most ``max_meshes``, those whose
  batch layout a run would accept)."""
  if max_meshes < 1:
    raise ValueError(f"--plan_max_meshes={max_meshes}: must be at least 1")
  if workers < 0:
    raise ValueError(f"--plan_workers={workers}: must be >= 0 (0: as the host allows)")
  check_run_config(config)
  attention.kernel_for(config, topo)  # a fused kernel with attention dropout: the run's error
  phases = plan_phases(config, topo)  # the task's own checks too
  if not 0 <= phase < phases:
    which = "0 (seq128) or 1 (phase 2)" if phases == 2 else "0 (the config has one phase)"
    raise ValueError(f"--plan_phase={phase}: must be {which}")
  batch = config.train_batch_size if phase == 0 else config.phase2.train_batch_size
  meshes, refused = [], ""
  for mesh in mesh_candidates(topo.num_devices, batch):
    try:  # the run's own layout check (eval batch, processes) at accumulation 1
      check_batch_layout(
        _candidate_config(config, mesh, False, 1, phase),
        dict(zip(("data", "fsdp", "tensor"), mesh)),
        processes=max(1, topo.num_hosts),
        rules=config_rules(config),
      )
    except ValueError as e:
      refused = refused or str(e)
      continue
    meshes.append(mesh)
  if not meshes:
    why = f" a run accepts ({refused})" if refused else ""
    raise ValueError(
      f"no data x fsdp x tensor layout of {topo.num_devices} chips divides the global batch "
      f"{batch}{why}"
    )
  return meshes[:max_meshes]


class _Tracker:
  """What the plan is doing, for its progress lines: meshes searched of N, compiles done and
  the compiles running (each candidate and since when)."""

  def __init__(self, topo: Topology, meshes: int):
    self.lock = threading.Lock()
    self.name, self.meshes, self.searched, self.done = topo.describe(), meshes, 0, 0
    self.running: dict[int, tuple[str, float]] = {}
    self.start = time.monotonic()

  def begin(self, what: str) -> None:
    with self.lock:
      self.running[threading.get_ident()] = (what, time.monotonic())

  def end(self) -> None:
    with self.lock:
      self.running.pop(threading.get_ident(), None)
      self.done += 1

  def mesh_done(self) -> None:
    with self.lock:
      self.searched += 1

  def line(self, heartbeat: str) -> str:
    """``heartbeat`` ("plan ...: still running, 2m30s") with the plan's state."""
    with self.lock:
      now = time.monotonic()
      text = f"{heartbeat}; meshes {self.searched} of {self.meshes} searched"
      if 0 < self.searched < self.meshes:
        left = (now - self.start) / self.searched * (self.meshes - self.searched)
        text += f" (eta {progress_lib.format_duration(left)})"
      text += f", {self.done} compiles done"
      for what, since in self.running.values():
        text += f"; {what} for {progress_lib.format_duration(now - since)}"
    return text


def make_plan(
  config,
  topo: Topology,
  *,
  phase: int = 0,
  max_meshes: int = 6,
  cache_dir: str = "~/.cache/bert_jax/plans",
  workers: int = 0,
  isolate: bool = True,
  quick: bool = False,
  log=print,
  progress=None,
) -> dict[str, Any]:
  """Compiles the candidates (module docstring); ``log`` gets a line per compile, ``progress``
  (default: ``log``) a line at least every ``PROGRESS_INTERVAL_SEC`` while the plan runs. The
  meshes are searched concurrently by ``workers`` threads (0: ``default_workers``); each mesh's
  remat / accumulation search is sequential, and the result does not depend on ``workers``.
  With ``isolate`` each compile runs in a child process (``compile_isolated``); without it in
  this one. ValueError (``check_plan_args``) before any compile for input a run would refuse.

  ``quick``: the candidates are compiled with ``QUICK`` (the compiler's lowest execution-time
  optimisation effort: about 5x faster for BERT-base on a TPU, with the same FLOPs, about half
  the "bytes accessed" and somewhat less memory), then the fitting ones are compiled again at
  this process's settings in their rank order, each with more accumulation where it needs it,
  until one fits there: that one is ``best``, with its numbers at these settings (``verified``
  lists each such compile)."""
  meshes = check_plan_args(config, topo, phase=phase, max_meshes=max_meshes, workers=workers)
  kernels = attention.fused_choices(config, topo)
  batch = config.train_batch_size if phase == 0 else config.phase2.train_batch_size
  devices = topology_devices(topo)  # here too: a missing compiler is one clear error up front
  stop = threading.Event()  # an interrupt: no compile starts after it
  tracker = _Tracker(topo, len(meshes))

  def compile_one(mesh: tuple, remat: bool, accum: int, what: str, kernel: str) -> dict:
    """One candidate's row (mesh, remat, accumulation, kernel, the compiler's verdict and
    numbers)."""
    if stop.is_set():
      raise isolation.Stopped("the plan was interrupted")
    cfg = _candidate_config(config, mesh, remat, accum, phase, kernel)
    tracker.begin(what)
    try:
      if isolate:
        res = compile_isolated(cfg, topo, phase, cache_dir)
      else:
        res = compile_cached(cfg, topo, phase, cache_dir, devices)
    finally:
      tracker.end()
    step = res["steps"][0]
    return dict(
      mesh=dict(zip(("data", "fsdp", "tensor"), mesh)),
      remat=remat,
      grad_accum_steps=accum,
      attention_kernel=kernel,
      micro_batch_per_chip=batch // accum / (mesh[0] * mesh[1]),
      fits=step["fits"],
      memory=step["memory"],
      estimate=step["estimate"],
      compile_seconds=step["compile_seconds"],
      cached=res["cached"],
      error=step["error"],
    )

  def descend(
    mesh: tuple, remat: bool, accum: int, kernel: str, verb: str = "compiling"
  ) -> list[dict]:
    """Rows from ``accum`` on, doubling it until the step fits, the micro-batch cannot halve,
    or a compile fails for a reason other than memory (more accumulation is no remedy)."""
    rows = []
    dp = mesh[0] * mesh[1]
    while True:
      what = f"data={mesh[0]} fsdp={mesh[1]} tensor={mesh[2]} remat={remat} grad_accum={accum}"
      if len(kernels) > 1:
        what += f" attention={kernel}"
      if stop.is_set():
        raise isolation.Stopped("the plan was interrupted")
      log(f"{verb} {what} ...")
      rows.append(compile_one(mesh, remat, accum, f"{verb} {what}", kernel))
      if rows[-1]["fits"] or batch // (2 * accum) < dp or (batch // accum) % 2:
        return rows
      if not rows[-1]["memory"]:
        return rows
      accum *= 2

  def search(mesh: tuple) -> list[dict]:
    """One mesh's rows: for each kernel, remat off, then on (only if off needs accumulation)."""
    rows = []
    for kernel in kernels:
      off = descend(mesh, False, 1, kernel)
      rows += off
      if not (off[-1]["fits"] and off[-1]["grad_accum_steps"] == 1):
        rows += descend(mesh, True, 1, kernel)  # (when it fits at 1, remat would only recompute)
    tracker.mesh_done()
    return rows

  workers = workers or default_workers(len(meshes))
  settings = isolation.compiler_settings()
  screening = isolation.compiler_options(**QUICK) if quick else contextlib.nullcontext()
  say = progress or log
  beat = progress_lib.Heartbeat(
    f"plan for {topo.describe()}",
    interval_sec=PROGRESS_INTERVAL_SEC,
    log=lambda line: say(tracker.line(line)),
  )
  pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="plan")
  try:
    with beat:
      with screening:
        per_mesh = list(pool.map(search, meshes))
      rows = [row for mesh_rows in per_mesh for row in mesh_rows]
      fitting = sorted((r for r in rows if r["fits"]), key=lambda r: r["estimate"]["step_seconds"])
      rest = [r for r in rows if not r["fits"]]
      best = fitting[0] if fitting and not quick else None
      verified = []
      for row in fitting if quick else []:  # in rank order, at this process's own settings
        mesh = (row["mesh"]["data"], row["mesh"]["fsdp"], row["mesh"]["tensor"])
        kernel = row["attention_kernel"]
        verified += descend(mesh, row["remat"], row["grad_accum_steps"], kernel, "verifying")
        if verified[-1]["fits"]:
          best = verified[-1]
          break
  except (KeyboardInterrupt, isolation.Stopped):
    stop.set()
    isolation.stop_children()  # the compiling children end now; their threads return
    pool.shutdown(wait=isolate, cancel_futures=True)
    isolation.resume_children()
    raise KeyboardInterrupt from None
  finally:
    pool.shutdown(wait=False)
  return dict(
    topology=topo.to_dict(),
    phase=phase,
    global_batch_size=batch,
    attention_kernels=kernels,  # the kernels searched (bert_jax.plan.attention.fused_choices)
    candidates=fitting + rest,
    best=best,
    quick=quick,
    verified=verified,  # quick: the screened candidates compiled again, in rank order
    input=input_demand(batch, best["estimate"]["step_seconds"], topo) if best else None,
    versions=_versions(),
    code=_code_digest(),  # the sources that compiled every row (part of each row's cache key)
    estimate_version=ESTIMATE_VERSION,
    compiler_settings=settings,  # the verdict's; quick: the candidates' were these with QUICK
    workers=workers,
  )


def input_demand(global_batch: int, step_seconds: float, topo: Topology) -> dict[str, Any]:
  """What each host's input pipeline must deliver to keep up with the estimated step: the
  global batch over the step time, split over the hosts (each reads its own share)."""
  hosts = topo.num_hosts
  return dict(hosts=hosts, examples_per_second_per_host=global_batch / step_seconds / hosts)


def _format_row(rank: str, r: dict[str, Any], label: str = "") -> list[str]:
  m, e = r["mesh"], r["estimate"]
  mem = r["memory"].get("total_bytes") or r["memory"].get("needed_bytes") or 0
  timing = (
    f"{e['step_seconds'] * 1e3:>8.1f}ms {e['tokens_per_second']:>10,.0f} {e['mfu']:>4.0%}"
    if r["fits"]
    else f"{'':>25}"
  )
  src = "cached" if r["cached"] else f"{r['compile_seconds']:.0f}s"
  kernel = r.get("attention_kernel", "reference")
  lines = [
    f"  {rank:>4}  {m['data']:>4} {m['fsdp']:>4} {m['tensor']:>6} {'on' if r['remat'] else 'off':>5}"
    f" {r['grad_accum_steps']:>5} {r['micro_batch_per_chip']:>8g} {kernel:>11}"
    f"  {'yes' if r['fits'] else 'NO':>4}"
    f" {mem / 1024**3:>10.2f} {timing}  {src}{'  ' + label if label else ''}"
  ]
  if not r["fits"] and not mem and r["error"]:
    lines.append(f"        failed: {r['error']}")
  return lines


def format_plan(plan: dict[str, Any]) -> str:
  t = plan["topology"]
  lines = [
    f"Plan for {t['name']}{' x ' + str(t['num_slices']) if t['num_slices'] > 1 else ''} "
    f"({t['num_chips']} chips), phase {plan['phase']}, global batch {plan['global_batch_size']}",
    "  rank  data fsdp tensor remat accum seq/chip   attention  fits  total GiB  est. step"
    "      tok/s  MFU  compile",
  ]
  quick = plan.get("quick")
  if quick:
    lines.insert(
      1, f"  quick: candidates compiled with {QUICK}, then verified as compiled for a run"
    )
    lines.append(
      "  screened at the lowest compiler effort: 'quick est.' rows rank the layouts; their "
      "est. step and memory are not a run's"
    )
  for i, r in enumerate(plan["candidates"], 1):
    lines += _format_row(str(i) if r["fits"] else "-", r, "quick est." if quick else "")
  if quick and plan.get("verified"):
    lines.append("  verified as a run compiles it (the run's numbers):")
  for r in plan.get("verified", []):
    lines += _format_row("ver.", r, "verified")
  if quick and plan["best"] is not None:
    b = plan["best"]
    screened = next(
      (
        r
        for r in plan["candidates"]
        if r["fits"]
        and (r["mesh"], r["remat"], r.get("attention_kernel"))
        == (b["mesh"], b["remat"], b.get("attention_kernel"))
      ),
      None,
    )
    was = (
      f" (its quick estimate: {screened['estimate']['step_seconds'] * 1e3:.1f} ms at "
      f"accumulation {screened['grad_accum_steps']})"
      if screened
      else ""
    )
    m = b["mesh"]
    lines.append(
      f"  best: data={m['data']} fsdp={m['fsdp']} tensor={m['tensor']} remat "
      f"{'on' if b['remat'] else 'off'} accum {b['grad_accum_steps']}"
      + (
        f" attention {b['attention_kernel']}" if len(plan.get("attention_kernels", [])) > 1 else ""
      )
      + ": est. step "
      f"{b['estimate']['step_seconds'] * 1e3:.1f} ms verified{was}"
    )
  if plan["best"] is None:
    lines.append("  No candidate fits" + (" once verified." if plan.get("quick") else "."))
  else:
    i = plan["input"]
    lines.append(
      f"  input: {i['examples_per_second_per_host']:,.0f} examples/s per host at the best "
      f"layout's estimated step ({i['hosts']} hosts; the tf.data reader's rate per core: "
      "benchmarks/speed/data.py)"
    )
  lines.append("  (total: per chip, compiler's; for a row that does not fit, what it needed)")
  return "\n".join(lines)


def best_overrides(plan: dict[str, Any]) -> list[str]:
  """The ``--config.*`` flags that select the plan's best candidate."""
  b = plan["best"]
  if b is None:
    return []
  accum_key = "grad_accum_steps" if plan["phase"] == 0 else "phase2.grad_accum_steps"
  out = [f"--config.mesh.{k}={v}" for k, v in b["mesh"].items()]
  out += [f"--config.remat={b['remat']}", f"--config.{accum_key}={b['grad_accum_steps']}"]
  if len(plan.get("attention_kernels", [])) > 1:  # "auto" searched both: name the winner
    out.append(f"--config.attention_kernel={b['attention_kernel']}")
  return out
