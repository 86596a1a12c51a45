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
the signal and the file its output was kept in). See docs/compile.md.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags
from ml_collections import config_flags

from bert_jax import cli
from bert_jax.parallel.topology import TopologyError, parse_topology
from bert_jax.plan.isolation import compile_for_topology_isolated
from bert_jax.plan.planner import best_overrides, format_plan, make_plan
from bert_jax.plan.report import format_report

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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  topo = parse_topology(_TOPOLOGY.value, _SLICES.value)
  config = _CONFIG.value
  if _PLAN.value:
    result = make_plan(
      config,
      topo,
      phase=_PLAN_PHASE.value,
      max_meshes=_MAX_MESHES.value,
      cache_dir=_CACHE.value,
      workers=_WORKERS.value,
      quick=_QUICK.value,
    )
    print(format_plan(result))
    if result["best"] is not None:
      print("best: " + " ".join(best_overrides(result)))
    ok = result["best"] is not None
  else:
    result = compile_for_topology_isolated(config, topo)
    print(format_report(result.pop("reports"), topo, f"mesh {result['mesh']}"))
    ok = result["fits"]
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
