r"""Compile a run's train and eval steps for a TPU topology or NVIDIA GPU hosts, on any host:
memory per chip, collectives, estimated step time; or plan the fastest mesh layout that fits.

  python -m bert_jax.compile --config configs/pretrain.py:large --topology v5e:16x16 \
      --config.mesh.fsdp=8 --config.dtype=bfloat16 --output plan.json
  python -m bert_jax.compile --config configs/squad.py --topology v4-128 --num_slices 2
  python -m bert_jax.compile --config configs/pretrain.py:large --topology v5e-256 --plan
  python -m bert_jax.compile --config configs/pretrain.py:large --topology v5e-256 --plan \
      --plan_quick       # screen the layouts at the lowest compiler effort, verify the winner
  python -m bert_jax.compile --config configs/pretrain.py:base --topology h100:2x8  # 2 hosts x 8

The config and its ``--config.<key>=value`` overrides are pretrain's / finetune's; the steps
compiled are the ones those entry points run (bert_jax.plan.compiler). Needs libtpu
(``pip install 'bert-jax[tpu]'``), not a TPU; GPU names need the CUDA plugin
(``pip install 'bert-jax[gpu-aot]'``), not a GPU. Exit status 0 when every step fits, 3 when the
compiler refuses one for memory (the numbers are printed), 1 (one line) for bad input: an
unknown topology, a mesh whose product is not the chip count, a step that does not compile for
another reason, a compiler that crashes (the compile runs in a child process; the message names
the signal and the file its output was kept in), a config ``pretrain`` / ``finetune`` would
refuse (the same one-line error, before any compile), an ``--output`` whose folder does not
exist or that names an input (checked before any work); 2 for a bad flag value (``--num_slices``,
``--plan_max_meshes``, ``--plan_workers``, ``--plan_phase``); 130 after an interrupt (Ctrl-C:
the compiling child processes are killed, one line). While it compiles or plans it prints a
progress line to stderr at least every 30 s. The report names the attention kernel the steps
run (``config.attention_kernel`` resolved for the topology's chips; a fused kernel with attention
dropout is refused before any compile) and counts the FLOPs of a fused kernel the compiler cannot
see into (bert_jax.plan.attention). See docs/compile.md.
"""

from __future__ import annotations

from bert_jax import interrupts

if __name__ == "__main__":  # a Ctrl-C during the imports below stops at once
  interrupts.stop_at_once_on_ctrl_c("compile")

import json
import os
import sys
import time

from absl import app, flags
from ml_collections import config_flags

from bert_jax import cli
from bert_jax.parallel.topology import TopologyError, parse_topology
from bert_jax.plan.compiler import check_config
from bert_jax.plan.isolation import compile_for_topology_isolated
from bert_jax.plan.planner import best_overrides, format_plan, make_plan
from bert_jax.plan.report import format_report
from bert_jax.train.progress import format_duration

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "A configs/*.py[:preset] file; override keys with --config.<key>=v",
  lock_config=True,
)  # fmt: skip
_TOPOLOGY = flags.DEFINE_string(
  "topology", None, "e.g. v5e:16x16, v4:4x4x8, v5p-128, v6e-64, h100:8, h100:2x8, a100-40gb:4"
)
_SLICES = flags.DEFINE_integer("num_slices", 1, "slices joined by the data-center network")
_PLAN = flags.DEFINE_bool("plan", False, "try the mesh layouts, remat, grad accumulation")
_MAX_MESHES = flags.DEFINE_integer("plan_max_meshes", 6, "--plan: mesh layouts to compile")
_PLAN_PHASE = flags.DEFINE_integer("plan_phase", 0, "--plan: which phase's train step")
_WORKERS = flags.DEFINE_integer(
  "plan_workers",
  0,
  "--plan: meshes compiled concurrently (0: as the host's cores and memory allow)",
)
_QUICK = flags.DEFINE_bool(
  "plan_quick",
  False,
  "--plan: compile the candidates at the compiler's lowest optimisation effort (faster), then "
  "verify the fastest that fits as a run compiles it",
)
_CACHE = flags.DEFINE_string("plan_cache", "~/.cache/bert_jax/plans", "--plan: cache ('' = off)")
_OUTPUT = flags.DEFINE_string("output", "", "write the report / plan here as JSON")
flags.mark_flags_as_required(["config", "topology"])

OUT_OF_MEMORY_EXIT = 3
INTERRUPTED_EXIT = 130  # as a shell reports a process ended by SIGINT


def _say(line: str) -> None:
  """A progress line, on stderr (stdout keeps the report)."""
  print(line, file=sys.stderr, flush=True)


def check_flags() -> None:
  """app.UsageError (exit status 2, one line) for a flag value out of range."""
  if _SLICES.value < 1:
    raise app.UsageError(f"--num_slices={_SLICES.value}: must be at least 1")
  if _MAX_MESHES.value < 1:
    raise app.UsageError(f"--plan_max_meshes={_MAX_MESHES.value}: must be at least 1")
  if _WORKERS.value < 0:
    raise app.UsageError(
      f"--plan_workers={_WORKERS.value}: must be >= 0 (0: as the host's cores and memory allow)"
    )
  if _PLAN_PHASE.value not in (0, 1):
    raise app.UsageError(
      f"--plan_phase={_PLAN_PHASE.value}: must be 0 (the first phase) or 1 (phase 2, seq 512)"
    )


def _input_files(config) -> set[str]:
  """Real paths of the files this run reads: the config file and every config value that names
  an existing file (or a comma-separated list of them)."""
  names = []
  try:
    names.append(config_flags.get_config_filename(flags.FLAGS["config"]))
  except (AttributeError, KeyError, TypeError):
    pass
  stack = [json.loads(config.to_json_best_effort())]
  while stack:
    node = stack.pop()
    if isinstance(node, dict):
      stack.extend(node.values())
    elif isinstance(node, list):
      stack.extend(node)
    elif isinstance(node, str) and "://" not in node:
      names.extend(node.split(","))
  paths = (os.path.expanduser(n) for n in names if n)
  return {os.path.realpath(p) for p in paths if os.path.isfile(p)}


def check_output(path: str, config) -> None:
  """Before any work: ValueError / FileNotFoundError when ``--output`` cannot be written (no such
  folder, a folder, not writable) or would overwrite one of the run's inputs."""
  if not path:
    return
  full = os.path.realpath(os.path.expanduser(path))
  folder = os.path.dirname(full)
  if not os.path.isdir(folder):
    shown = os.path.dirname(path) or "."
    raise FileNotFoundError(f"--output={path}: the folder {shown} does not exist")
  if os.path.isdir(full):
    raise IsADirectoryError(f"--output={path}: is a folder; give a file name")
  if not os.access(full if os.path.exists(full) else folder, os.W_OK):
    raise PermissionError(f"--output={path}: not writable")
  if full in _input_files(config):
    raise ValueError(f"--output={path}: is an input of this run; it would be overwritten")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  check_flags()
  config = _CONFIG.value
  check_output(_OUTPUT.value, config)
  topo = parse_topology(_TOPOLOGY.value, _SLICES.value)
  start = time.monotonic()
  try:
    if _PLAN.value:
      result = make_plan(
        config,
        topo,
        phase=_PLAN_PHASE.value,
        max_meshes=_MAX_MESHES.value,
        cache_dir=_CACHE.value,
        workers=_WORKERS.value,
        quick=_QUICK.value,
        log=lambda line: print(line, flush=True),
        progress=_say,
      )
      print(format_plan(result))
      if result["best"] is not None:
        print("best: " + " ".join(best_overrides(result)))
      ok = result["best"] is not None
    else:
      job = check_config(config, topo)  # a run's checks: one line, before any compile
      steps = [f"train {p.name}" for p in job.program.phases] + ["eval"]
      _say(f"compiling {', '.join(steps)} for {topo.describe()} (in a child process) ...")
      result = compile_for_topology_isolated(config, topo, progress=_say)
      print(format_report(result.pop("reports"), topo, f"mesh {result['mesh']}"))
      ok = result["fits"]
  except KeyboardInterrupt:
    _say(
      f"compile: interrupted after {format_duration(time.monotonic() - start)}; the compiling "
      "processes were stopped, nothing was written"
    )
    sys.exit(INTERRUPTED_EXIT)
  if _OUTPUT.value:
    with open(_OUTPUT.value, "w") as f:
      json.dump(result, f, indent=1)
    print(f"wrote {_OUTPUT.value}")
  if not ok:
    sys.exit(OUT_OF_MEMORY_EXIT)


def run():
  cli.run(main, prog="compile", user_errors=(TopologyError,))


if __name__ == "__main__":
  run()
