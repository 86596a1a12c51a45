"""Compiling for real TPU topologies without a TPU (bert_jax.compile, bert_jax.plan).

The tiny preset's pre-training step is compiled by the XLA TPU compiler (libtpu) for v5e:2x2
under data, fsdp and tensor meshes and for v4:2x2x2 under a mixed one. Checked against
references computed here, independently of the code under test: every parameter's compiled
sharding against the logical-axis rules applied by hand; the compiler's per-chip argument bytes
against parameters + AdamW moments + batch over their shard counts; the mixed mesh's shardings
against the same step compiled for 8 CPU devices (conftest.py's fake devices). Skips only
where libtpu cannot start (not installed: ``pip install '.[tpu]'``).
"""

from __future__ import annotations

import io
import math
import os
import pathlib
import re
import sys
import tempfile
import threading
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_pretrain_config
from jax.sharding import PartitionSpec

from bert_jax import parallel
from bert_jax.parallel import topology as topo_lib
from bert_jax.plan import hlo, isolation, planner
from bert_jax.plan.compiler import compile_for_topology
from bert_jax.plan.hlo_cost import hlo_text_cost
from bert_jax.plan.planner import input_demand, mesh_candidates
from bert_jax.plan.report import CompileError, parse_hbm_shortfall, step_report
from bert_jax.runs.jobs import build_job
from bert_jax.train import trainer
from configs import squad
from launch.job import Job, LaunchError
from launch.launch import launch
from launch.targets import TpuTarget

MESHES = {
  "data": ("v5e:2x2", (4, 1, 1)),
  "fsdp": ("v5e:2x2", (1, 4, 1)),
  "tensor": ("v5e:2x2", (1, 1, 4)),
  "mixed": ("v4:2x2x2", (2, 2, 2)),
}


def _devices(name: str):
  try:
    return topo_lib.topology_devices(topo_lib.parse_topology(name))
  except topo_lib.TopologyError as e:
    pytest.skip(f"libtpu cannot load on this host, so no TPU topology can be compiled: {e}")


_config = tiny_pretrain_config
BATCH = 64  # the meshes' global batch: the accumulation test's one-step case is the data mesh's


def _mesh_config(sizes, **overrides):
  return _config(sizes, train_batch_size=BATCH, **overrides)


def quick_compiles():
  """The compiler at its lowest execution-time optimisation effort (about half the compile time
  of the tiny step here; what a quick plan screens with). For the tests of structure: the SPMD
  partitioner, which decides every sharding and collective, and the arguments' sizes are the
  same at any effort; the tests of what fits compile at the default effort. An isolated
  compile's child inherits it (``isolation.compiler_settings``)."""
  return isolation.compiler_options(**planner.QUICK)


@pytest.fixture(scope="module")
def compiled_tpu():
  """{mesh kind: (topology, mesh sizes, the compile_for_topology result)}, compiled once (the
  suite runs with ``--dist loadfile``, setup.cfg: a module's tests share one worker)."""
  out = {}
  with quick_compiles():
    for kind, (name, sizes) in MESHES.items():
      devices = _devices(name)
      result = compile_for_topology(
        _mesh_config(sizes), topo_lib.parse_topology(name), with_eval=False, devices=devices
      )
      out[kind] = (name, sizes, result)
  return out


# --- the reference: logical rules applied by hand --------------------------------------------


def _expected_specs(config, sizes) -> dict[str, tuple]:
  """{param path: per-dimension mesh axes (size-1 axes dropped)} from the model's logical names
  and config.logical_axis_rules, a dimension left whole when its axes do not divide it."""
  job = build_job(config, abstract=True)
  boxed = jax.eval_shape(job.program.init_params, jax.random.PRNGKey(0))
  mesh_size = dict(zip(("data", "fsdp", "tensor"), sizes))
  rules = dict(config.logical_axis_rules)
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(
    boxed, is_leaf=lambda x: hasattr(x, "names")
  ):
    dims = []
    for name, size in zip(leaf.names, leaf.value.shape):
      axes = rules.get(name) if name is not None else None
      axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
      if size % math.prod(mesh_size[a] for a in axes):
        axes = ()
      dims.append(tuple(a for a in axes if mesh_size[a] > 1))
    out[_path(path)] = tuple(dims)
  return out


def _path(path) -> str:
  return "/".join(re.sub(r"[\[\]'.]", "", jax.tree_util.keystr((k,))) for k in path if k != "value")


def _norm(spec: PartitionSpec, ndim: int, mesh) -> tuple:
  entries = list(spec) + [None] * (ndim - len(spec))
  out = []
  for axes in entries:
    axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    out.append(tuple(a for a in axes if mesh.shape[a] > 1))
  return tuple(out)


def _compiled_param_specs(compiled, abstract_params) -> dict[str, tuple]:
  state_shardings = compiled.input_shardings[0][0]
  out = {}
  shards = jax.tree_util.tree_leaves_with_path(state_shardings.params)
  shapes = jax.tree_util.tree_leaves(abstract_params)
  for (path, sharding), shape in zip(shards, shapes):
    out[_path(path)] = _norm(sharding.spec, len(shape.shape), sharding.mesh)
  return out


# --- tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MESHES))
def test_parameter_shardings_follow_the_logical_rules(compiled_tpu, kind):
  name, sizes, result = compiled_tpu[kind]
  config = _mesh_config(sizes)
  expected = _expected_specs(config, sizes)
  abstract = jax.eval_shape(
    build_job(config, abstract=True).program.init_params, jax.random.PRNGKey(0)
  )
  compiled = result["reports"][0].compiled
  got = _compiled_param_specs(compiled, nn.meta.unbox(abstract))
  assert got.keys() == expected.keys()
  assert got == expected
  # the layouts do shard: something over each mesh axis of size > 1
  for axis, size in zip(("data", "fsdp", "tensor"), sizes):
    if size > 1 and axis != "data":
      assert any(axis in dim for dims in got.values() for dim in dims), axis


@pytest.mark.parametrize("kind", list(MESHES))
def test_argument_bytes_are_params_and_adam_moments_over_their_shards(compiled_tpu, kind):
  name, sizes, result = compiled_tpu[kind]
  config = _mesh_config(sizes)
  expected_specs = _expected_specs(config, sizes)
  mesh_size = dict(zip(("data", "fsdp", "tensor"), sizes))
  abstract = nn.meta.unbox(
    jax.eval_shape(build_job(config, abstract=True).program.init_params, jax.random.PRNGKey(0))
  )
  param_bytes = 0.0
  for path, leaf in jax.tree_util.tree_leaves_with_path(abstract):
    shards = math.prod(mesh_size[a] for dim in expected_specs[_path(path)] for a in dim)
    param_bytes += leaf.size * 4 / shards  # fp32 params
  # AdamW: two fp32 moments per parameter, sharded like it; the batch split over data x fsdp.
  b, seq, preds = config.train_batch_size, config.max_seq_length, config.max_predictions_per_seq
  batch_bytes = (3 * b * seq * 4 + 3 * b * preds * 4 + b * 4) / (sizes[0] * sizes[1])
  analytic = 3 * param_bytes + batch_bytes
  report = result["steps"][0]
  got = report["memory"]["argument_bytes"]
  assert got == pytest.approx(analytic, rel=0.05), (got, analytic)
  assert report["memory"]["params_bytes"] == pytest.approx(param_bytes, rel=0.01)
  assert report["fits"]
  assert report["memory"]["total_bytes"] < report["memory"]["hbm_bytes"]
  est = report["estimate"]
  assert est["step_seconds"] >= est["compute_seconds"] > 0
  assert 0 < est["mfu"] <= 1


def test_mixed_mesh_shardings_equal_those_on_8_cpu_devices(compiled_tpu):
  if jax.device_count() != 8 or jax.default_backend() != "cpu":
    pytest.skip("needs the suite's 8 fake CPU devices (tests/conftest.py)")
  name, sizes, result = compiled_tpu["mixed"]
  config = _mesh_config(sizes)
  mesh = parallel.create_mesh(config.mesh)
  rules = parallel.normalize_rules(config.logical_axis_rules)
  job = build_job(config, abstract=True)
  asm = trainer.assemble(job, config, mesh, rules)
  cpu = trainer.lower_train_step(asm, 0).compile()
  tpu = result["reports"][0].compiled
  cpu_specs = _compiled_param_specs(cpu, asm.abstract_state.params)
  tpu_specs = _compiled_param_specs(tpu, asm.abstract_state.params)
  assert cpu_specs == tpu_specs
  # the whole state (optimizer moments, step, rng) too
  cpu_all = [_norm(s.spec, 0, s.mesh) for s in jax.tree_util.tree_leaves(cpu.input_shardings[0])]
  tpu_all = [_norm(s.spec, 0, s.mesh) for s in jax.tree_util.tree_leaves(tpu.input_shardings[0])]
  assert cpu_all == tpu_all


def test_over_budget_config_is_reported_as_not_fitting_with_the_numbers():
  devices = _devices("v5e:2x2")
  config = _config((4, 1, 1), train_batch_size=16384, max_seq_length=512)
  result = compile_for_topology(
    config, topo_lib.parse_topology("v5e:2x2"), with_eval=False, devices=devices
  )
  step = result["steps"][0]
  assert not result["fits"] and not step["fits"]
  mem = step["memory"]
  # v5e has 16 GiB of HBM per chip; the compiler keeps a little for itself
  assert 15 * 1024**3 < mem["available_bytes"] <= 16 * 1024**3
  assert mem["needed_bytes"] > mem["available_bytes"]
  assert mem["over_bytes"] == pytest.approx(mem["needed_bytes"] - mem["available_bytes"], rel=0.02)
  assert "hbm" in step["error"].lower()


def test_accumulation_counts_every_micro_step(compiled_tpu):
  """The same global batch in one step or in two accumulated micro-steps does the same model
  work: XLA counts the accumulation loop's body once, the report counts each trip."""
  name, sizes, one_step = compiled_tpu["data"]
  with quick_compiles():
    two_steps = compile_for_topology(
      _mesh_config(sizes, grad_accum_steps=2),
      topo_lib.parse_topology(name),
      with_eval=False,
      devices=_devices(name),
    )
  one, two = one_step["steps"][0], two_steps["steps"][0]
  assert two["flops"] == pytest.approx(one["flops"], rel=0.15)
  # Bytes: the micro-steps' activations once in all, the optimizer update (outside the loop)
  # counted per trip, so never less than one step's (counting the body once would be).
  assert two["bytes_accessed"] >= one["bytes_accessed"]
  assert two["estimate"]["compute_seconds"] == pytest.approx(
    one["estimate"]["compute_seconds"], rel=0.15
  )
  # Collectives inside the loop count once per trip: the compiled loop's bound is the config's.
  text = two_steps["reports"][0].compiled.as_text()
  comps, _ = hlo._split_computations(text)
  loops = [line for lines in comps.values() for line in lines if " while(" in line]
  assert loops and {hlo._trip_count(line, comps) for line in loops} == {2}


def test_hbm_shortfall_parsed_from_both_message_forms():
  a = parse_hbm_shortfall(
    "RESOURCE_EXHAUSTED: HLO temporaries (38.28G) exceeds available HBM (15.75G)"
  )
  assert a["needed_bytes"] == pytest.approx(38.28 * 1024**3)
  assert a["available_bytes"] == pytest.approx(15.75 * 1024**3)
  b = parse_hbm_shortfall("Ran out of memory in memory space hbm. Used 20.5G of 15.75G hbm. "
                          "Exceeded hbm capacity by 4.75G.")  # fmt: skip
  assert b["over_bytes"] == pytest.approx(4.75 * 1024**3)
  assert parse_hbm_shortfall("INVALID_ARGUMENT: something else") is None


_HLO = """\
HloModule m

%body (p: (s32[], f32[256])) -> (s32[], f32[256]) {
  %p = (s32[], f32[256]) parameter(0)
  %x = f32[256]{0} get-tuple-element(%p), index=1
  %ar = f32[256]{0} all-reduce(%x), channel_id=3, replica_groups={{0,2},{1,3}}, use_global_device_ids=true, to_apply=%add
  ROOT %t = (s32[], f32[256]) tuple(%i, %ar)
}

ENTRY %main (a: bf16[8,128]) -> f32[256] {
  %a = bf16[8,128]{1,0} parameter(0)
  %ag = bf16[16,128]{1,0} all-gather(%a), channel_id=1, replica_groups=[2,2]<=[4], dimensions={0}, use_global_device_ids=true
  %w = (s32[], f32[256]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  ROOT %r = f32[256]{0} get-tuple-element(%w), index=1
}
"""


# The form the TPU compiler leaves: no known_trip_count, the bound in the loop's condition.
_HLO_COND = _HLO.replace(', backend_config={"known_trip_count":{"n":"4"}}', "").replace(
  "ENTRY",
  """%cond (c: (s32[], f32[256])) -> pred[] {
  %n = s32[]{:T(128)} constant(4)
  %c = (s32[], f32[256]) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%c), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i, %n), direction=LT, metadata={op_name="while/cond/lt"}
}

ENTRY""",
)


@pytest.mark.parametrize("text", [_HLO, _HLO_COND], ids=["known_trip_count", "condition"])
def test_collectives_counted_per_execution_with_their_mesh_axes(text):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2, 1), ("data", "fsdp", "tensor"))
  got = {(c["kind"], c["axes"]): c for c in hlo.collectives(text, mesh)}
  # positions 0..3 on a (data=2, fsdp=2) mesh: {0,1},{2,3} vary fsdp; {0,2},{1,3} vary data
  ag = got[("all-gather", "fsdp")]
  assert ag["count"] == 1 and ag["bytes"] == 16 * 128 * 2
  assert ag["moved_bytes"] == 16 * 128 * 2 / 2
  ar = got[("all-reduce", "data")]
  assert ar["count"] == 4  # inside the while body, trip count 4
  assert ar["bytes"] == 4 * 256 * 4 and ar["moved_bytes"] == 4 * 2 * 256 * 4 / 2


_HLO_COMBINED = """\
HloModule m

ENTRY %main (a: bf16[8,128], b: f32[4], c: f32[256], d: f32[64]) -> f32[256] {
  %a = bf16[8,128]{1,0} parameter(0)
  %b = f32[4]{0} parameter(1)
  %ags = ((bf16[8,128]{1,0}, f32[4]{0}), (bf16[16,128]{1,0}, f32[8]{0})) all-gather-start(%a, %b), channel_id=1, replica_groups={{0,1},{2,3}}, dimensions={0}, use_global_device_ids=true
  %agd = (bf16[16,128]{1,0}, f32[8]{0}) all-gather-done(%ags)
  %ars = (f32[256]{0}, f32[64]{0}) all-reduce-start(%c, %d), channel_id=2, replica_groups={{0,2},{1,3}}, use_global_device_ids=true, to_apply=%add
  %ard = (f32[256]{0}, f32[64]{0}) all-reduce-done(%ars)
  %rs = (f32[4,128]{1,0}, f32[2]{0}) reduce-scatter(%e, %f), channel_id=3, replica_groups={{0,1},{2,3}}, dimensions={0}, use_global_device_ids=true, to_apply=%add
  ROOT %r = f32[256]{0} get-tuple-element(%ard), index=0
}
"""


def test_combined_collectives_count_every_array_they_carry():
  # XLA combines many small collectives into one op over a tuple of arrays: every result counts
  # (by hand from the shapes above), and an async all-gather's operands are not its result.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2, 1), ("data", "fsdp", "tensor"))
  got = {(c["kind"], c["axes"]): c for c in hlo.collectives(_HLO_COMBINED, mesh)}
  assert got[("all-gather", "fsdp")]["bytes"] == 16 * 128 * 2 + 8 * 4
  assert got[("all-reduce", "data")]["bytes"] == 256 * 4 + 64 * 4
  assert got[("reduce-scatter", "fsdp")]["bytes"] == 2 * (4 * 128 * 4 + 2 * 4)  # the input


_HLO_FUSED_REDUCE_SCATTER = """\
HloModule m

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%all-reduce-scatter.3 (input: f32[1024,512]) -> f32[512,512] {
  %input = f32[1024,512]{1,0} parameter(0)
  %all-reduce.2 = f32[1024,512]{1,0} all-reduce(%input), channel_id=3, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=%add
  %offset = u32[] parameter(1)
  %zero = u32[] constant(0)
  ROOT %slice = f32[512,512]{1,0} dynamic-slice(%all-reduce.2, %offset, %zero), dynamic_slice_sizes={512,512}
}

ENTRY %main (g: f32[1024,512]) -> f32[512,512] {
  %g = f32[1024,512]{1,0} parameter(0)
  ROOT %fusion = f32[512,512]{1,0} fusion(%g), kind=kCustom, calls=%all-reduce-scatter.3
}
"""


def test_a_reduce_scatter_written_as_an_all_reduce_fusion_counts_as_one():
  # The TPU compiler's form of a reduce-scatter (seen in the compiled FSDP step): an all-reduce
  # of the whole gradient, then this chip's slice, in a fusion calling an "all-reduce-scatter"
  # computation. A ring reduce-scatter over 2 chips sends half its input (not an all-reduce's
  # twice that).
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2, 1), ("data", "fsdp", "tensor"))
  (got,) = hlo.collectives(_HLO_FUSED_REDUCE_SCATTER, mesh)
  assert (got["kind"], got["axes"], got["count"]) == ("reduce-scatter", "fsdp", 1)
  assert got["bytes"] == 1024 * 512 * 4 and got["moved_bytes"] == 1024 * 512 * 4 / 2


def test_unknown_topology_lists_the_known_ones():
  with pytest.raises(ValueError, match=r"unknown TPU topology 'v9:2x2'; known: v4: 2x2x1"):
    topo_lib.parse_topology("v9:2x2")
  with pytest.raises(ValueError, match="v5e: .*16x16"):
    topo_lib.parse_topology("v5e:3x3")
  t = topo_lib.parse_topology("v4-128")
  assert (t.name, t.num_devices, t.accelerator_type) == ("v4:4x4x4", 64, "v4-128")
  assert topo_lib.parse_topology("v5litepod-256").name == "v5e:16x16"


def test_hosts_and_the_input_each_must_read():
  # Cloud TPU docs: v4-128 is 16 VMs of 4 chips; v5litepod-256 64 VMs of 4 chips; v5litepod-8
  # one 8-chip VM; v5p-128 (64 chips) 16 VMs; two v4-8 slices two VMs.
  hosts = {
    name: topo_lib.parse_topology(name).num_hosts
    for name in ("v4-128", "v5litepod-256", "v5litepod-8", "v5p-128", "v4-8")
  }
  assert hosts == {"v4-128": 16, "v5litepod-256": 64, "v5litepod-8": 1, "v5p-128": 16, "v4-8": 1}
  assert topo_lib.parse_topology("v4-8", num_slices=2).num_hosts == 2
  demand = input_demand(256, 0.05, topo_lib.parse_topology("v5litepod-256"))
  assert demand == {"hosts": 64, "examples_per_second_per_host": 256 / 0.05 / 64}


def test_mesh_product_not_the_chip_count_is_one_clear_error():
  _devices("v5e:2x2")
  with pytest.raises(ValueError, match=r"v5e:2x2 .*has 3 devices but 4 are available"):
    compile_for_topology(_config((3, 1, 1)), topo_lib.parse_topology("v5e:2x2"))


def test_multi_slice_puts_data_across_slices():
  _devices("v4:2x2x1")
  topo = topo_lib.parse_topology("v4:2x2x1", num_slices=2)
  devices = topo_lib.topology_devices(topo)
  mesh = parallel.create_mesh({"data": 2, "fsdp": 4, "tensor": 1}, devices=devices)
  slices = np.vectorize(lambda d: d.slice_index)(mesh.devices)
  assert (slices[0] == 0).all() and (slices[1] == 1).all()  # data index = slice


def test_launch_preflight_refuses_a_job_that_does_not_fit_before_creating_anything():
  _devices("v5e:2x2")
  config = pathlib.Path(__file__).resolve().parent.parent / "configs" / "pretrain.py"
  job = Job(
    "pretrain",
    f"{config}:tiny",
    "gs://bucket/run",
    extra_args=(
      "--config.train_batch_size=16384",
      "--config.max_seq_length=512",
      "--config.phase2.fraction=0.0",
    ),
  )
  target = TpuTarget(
    tpu_name="pod",
    zone="us-central2-b",
    project="my-project",
    create=True,
    accelerator_type="v5litepod-4",
  )
  out = io.StringIO()
  with (
    quick_compiles(),  # the refusal at the default effort: the over-budget test above
    pytest.raises(LaunchError, match=r"does not fit on v5e:2x2 .*needs [\d.]+ GiB per chip"),
  ):
    launch(job, target, out=out)
  assert "gcloud" not in out.getvalue()  # nothing was created


@pytest.mark.slow
def test_squad_bert_large_finetune_step_compiles_for_a_topology():
  """The fine-tuning job (SQuAD v1.1, seq 384, BERT-large, the paper's batch 32) through the
  same compiler path; minutes on a 2-core host."""
  devices = _devices("v4:2x2x1")
  config = squad.get_config("v1")
  config.unlock()
  config.model_preset = "large"
  config.dtype = "bfloat16"
  result = compile_for_topology(config, topo_lib.parse_topology("v4-8"), devices=devices)
  assert [s["name"] for s in result["steps"]] == ["train finetune", "eval"]
  assert result["fits"], result["steps"]
  train = result["steps"][0]
  # BERT-large + a span head: ~334M fp32 params, replicated over data=4
  assert 330e6 * 4 < train["memory"]["params_bytes"] < 340e6 * 4
  assert train["memory"]["total_bytes"] < 32 * 1024**3


def test_planner_candidates_are_the_factorisations_that_divide_the_batch():
  got = mesh_candidates(8, 16, max_tensor=2)
  # by hand: tensor 1 -> data x fsdp = 8; tensor 2 -> 4; fewest tensor, then fewest fsdp, first
  assert got == [(8, 1, 1), (4, 2, 1), (2, 4, 1), (1, 8, 1), (4, 1, 2), (2, 2, 2), (1, 4, 2)]
  assert all(d * f * t == 64 and 32 % (d * f) == 0 for d, f, t in mesh_candidates(64, 32))
  assert mesh_candidates(8, 4, max_tensor=1) == []  # a batch of 4 cannot be split 8 ways


@pytest.mark.parametrize("workers", [1, 3])
def test_planner_search_order_and_ranking_with_concurrent_meshes(monkeypatch, workers):
  """The planner's search (its module docstring) against candidates listed by hand, with a
  stand-in compiler: a step fits when its micro-batch is at most 4 sequences per chip (8 with
  remat), and takes 1 ms per accumulation step (+0.5 with remat, +0.1 per tensor shard, +0.01 per
  fsdp shard). The rows do not depend on how many meshes compile at once; with 3 workers the
  first three meshes' first compiles must meet (so they ran at the same time)."""
  meet = threading.Barrier(3, timeout=60) if workers == 3 else None
  started = set()
  lock = threading.Lock()

  def fake_compile(cfg, topo, phase, cache_dir, devices):
    mesh = (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    with lock:
      first = mesh not in started
      started.add(mesh)
    if meet is not None and first and mesh != (2, 1, 2):
      meet.wait()
    micro = cfg.train_batch_size / cfg.grad_accum_steps / (mesh[0] * mesh[1])
    fits = micro <= (8 if cfg.remat else 4)
    seconds = 1e-3 * cfg.grad_accum_steps + 5e-4 * cfg.remat + 1e-4 * mesh[2] + 1e-5 * mesh[1]
    step = dict(
      fits=fits,
      memory=dict(total_bytes=1 << 30) if fits else dict(needed_bytes=2 << 30),
      estimate=dict(step_seconds=seconds, tokens_per_second=1.0, mfu=0.5),
      compile_seconds=0.0,
      error=None,
    )
    return dict(steps=[step], cached=False)

  monkeypatch.setattr(planner, "compile_cached", fake_compile)
  monkeypatch.setattr(planner, "topology_devices", lambda topo: None)
  config = _config(train_batch_size=32)
  plan = planner.make_plan(
    config,
    topo_lib.parse_topology("v5e:2x2"),
    max_meshes=4,
    workers=workers,
    isolate=False,
    log=lambda _: None,
  )
  got = [
    ((r["mesh"]["data"], r["mesh"]["fsdp"], r["mesh"]["tensor"]), r["remat"], r["grad_accum_steps"], r["fits"])
    for r in plan["candidates"]
  ]  # fmt: skip
  # By hand: meshes (4,1,1), (2,2,1), (1,4,1) (4-way batch split: 8 per chip) and (2,1,2) (2-way:
  # 16 per chip). Remat off fits at accumulation 2 (4 on the last mesh); remat on is tried
  # because off did not fit at 1, and fits at 1 (2 on the last mesh).
  assert got == [
    ((4, 1, 1), True, 1, True), ((2, 2, 1), True, 1, True), ((1, 4, 1), True, 1, True),
    ((4, 1, 1), False, 2, True), ((2, 2, 1), False, 2, True), ((1, 4, 1), False, 2, True),
    ((2, 1, 2), True, 2, True), ((2, 1, 2), False, 4, True),
    ((4, 1, 1), False, 1, False), ((2, 2, 1), False, 1, False), ((1, 4, 1), False, 1, False),
    ((2, 1, 2), False, 1, False), ((2, 1, 2), False, 2, False), ((2, 1, 2), True, 1, False),
  ]  # fmt: skip
  assert plan["best"] is plan["candidates"][0] and plan["workers"] == workers
  assert (
    plan["code"] == planner._code_digest() and plan["estimate_version"] == planner.ESTIMATE_VERSION
  )
  assert planner.best_overrides(plan)[-2:] == ["--config.remat=True", "--config.grad_accum_steps=1"]
  assert plan["input"]["examples_per_second_per_host"] == pytest.approx(
    32 / 1.61e-3
  )  # 1 + 0.5 + 0.1 + 0.01 ms
  assert len(planner.format_plan(plan).splitlines()) == 2 + 14 + 2


def test_a_quick_plan_screens_at_low_effort_and_verifies_in_rank_order(monkeypatch):
  """``quick``: every candidate compiles with ``QUICK``; then the fitting ones compile again at
  the process's own settings, fastest first, each with more accumulation where needed, until
  one fits there (stand-in compiler: at the low effort every layout fits, at the default the
  fastest does not at any accumulation). The option is restored."""
  key = "jax_exec_time_optimization_effort"
  default = jax.config.values[key]
  calls = []

  def fake_compile(cfg, topo, phase, cache_dir, devices):
    mesh, effort = (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor), jax.config.values[key]
    calls.append((mesh, effort))
    fits = effort != default or mesh != (4, 1, 1)
    step = dict(
      fits=fits,
      memory=dict(total_bytes=(1 if effort != default else 2) << 30) if fits else dict(needed_bytes=3 << 30),
      estimate=dict(step_seconds=1e-3 * sum(mesh[1:]), tokens_per_second=1.0, mfu=0.5),
      compile_seconds=0.0,
      error=None,
    )  # fmt: skip
    return dict(steps=[step], cached=False)

  monkeypatch.setattr(planner, "compile_cached", fake_compile)
  monkeypatch.setattr(planner, "topology_devices", lambda topo: None)
  plan = planner.make_plan(
    _config(train_batch_size=32), topo_lib.parse_topology("v5e:2x2"), max_meshes=3,
    isolate=False, quick=True, log=lambda _: None,
  )  # fmt: skip
  quick = planner.QUICK[key]
  # screened: (4,1,1) 2 ms, (2,2,1) 3 ms, (1,4,1) 5 ms, each at accumulation 1. Verified:
  # (4,1,1) refused at accumulation 1, 2, 4, 8 (then 2 sequences per chip cannot halve over
  # 4 chips), so (2,2,1), which fits
  assert sorted(calls[:3]) == [((1, 4, 1), quick), ((2, 2, 1), quick), ((4, 1, 1), quick)]
  assert calls[3:] == [((4, 1, 1), default)] * 4 + [((2, 2, 1), default)]
  got = [(r["mesh"]["data"], r["grad_accum_steps"], r["fits"]) for r in plan["verified"]]
  assert got == [(4, 1, False), (4, 2, False), (4, 4, False), (4, 8, False), (2, 1, True)]
  assert plan["best"] is plan["verified"][-1] and plan["best"]["memory"]["total_bytes"] == 2 << 30
  assert plan["quick"] and plan["compiler_settings"][key] == str(default)
  assert jax.config.values[key] == default
  text = planner.format_plan(plan)
  assert "quick: candidates compiled with" in text and text.count(" ver. ") == 5


def test_a_quick_plans_best_has_the_numbers_of_a_compile_at_the_default_effort(tmp_path):
  """The tiny step on one data-parallel layout, planned quickly: its best row's memory and
  estimate are those of the same candidate compiled directly at the default effort."""
  devices = _devices("v5e:2x2")
  topo = topo_lib.parse_topology("v5e:2x2")
  config = _config(train_batch_size=32)
  plan = planner.make_plan(
    config, topo, max_meshes=1, cache_dir=str(tmp_path), isolate=False, quick=True,
    log=lambda _: None,
  )  # fmt: skip
  best = plan["best"]
  direct = planner.compile_cached(
    planner._candidate_config(config, (4, 1, 1), False, 1, 0), topo, 0, "", devices
  )["steps"][0]
  assert best is plan["verified"][0] and best["mesh"] == dict(data=4, fsdp=1, tensor=1)
  assert best["memory"] == direct["memory"]
  assert best["estimate"]["step_seconds"] == direct["estimate"]["step_seconds"]
  assert len(list(tmp_path.glob("*.json"))) == 2  # the screening compile and the verification


_CRASH = (
  sys.executable,
  "-c",
  "import ctypes, sys; print('dying', file=sys.stderr, flush=True); ctypes.string_at(0)",
)


def test_a_compiler_crash_is_one_failed_candidate_and_the_plan_goes_on(monkeypatch, tmp_path):
  """libtpu segfaults here on BERT-base with remat (a stack overflow in its convolution
  emitter), which ended a plan. Compiles run in a child process: a child that crashes (here one
  that segfaults on purpose, for every remat candidate) becomes a failed row naming the signal,
  its branch is not searched further (more accumulation is no remedy for a crash), and the
  plan goes on: without remat, accumulation 1 is refused for memory (stand-in numbers) and 2
  fits."""
  isolated = planner.compile_isolated

  def compile_isolated(cfg, topo, phase, cache_dir):
    if cfg.remat:
      return isolated(cfg, topo, phase, str(tmp_path), command=_CRASH)
    fits = cfg.grad_accum_steps >= 2
    step = dict(
      fits=fits,
      memory=dict(total_bytes=1 << 30) if fits else dict(needed_bytes=2 << 30),
      estimate=dict(step_seconds=1e-3 * cfg.grad_accum_steps, tokens_per_second=1.0, mfu=0.5),
      compile_seconds=0.0,
      error=None,
    )
    return dict(steps=[step], cached=False)

  monkeypatch.setattr(planner, "compile_isolated", compile_isolated)
  monkeypatch.setattr(planner, "topology_devices", lambda topo: None)
  plan = planner.make_plan(
    _config(train_batch_size=32), topo_lib.parse_topology("v5e:2x2"), max_meshes=1,
    log=lambda _: None,
  )  # fmt: skip
  rows = [(r["remat"], r["grad_accum_steps"], r["fits"]) for r in plan["candidates"]]
  assert rows == [(False, 2, True), (False, 1, False), (True, 1, False)]
  failed = plan["candidates"][2]
  assert failed["error"].startswith("the compiler process died (signal SIGSEGV; its output: ")
  assert "failed: the compiler process died (signal SIGSEGV" in planner.format_plan(plan)
  # nothing cached for a crash, only the child's output kept
  assert [p.suffixes for p in tmp_path.iterdir()] == [[".failed", ".log"]]


def test_an_isolated_compile_fills_the_cache_as_in_process(tmp_path):
  """The child process compiles the same step with this process's compiler settings (the same
  compiler numbers, the same cache key) and leaves the cache entry a re-plan reads without
  compiling; at other compiler settings that entry is not used."""
  devices = _devices("v5e:2x2")
  topo = topo_lib.parse_topology("v5e:2x2")
  config = _config((4, 1, 1))
  with quick_compiles():  # set here, in this process: the child compiles with it too
    child = planner.compile_isolated(config, topo, 0, str(tmp_path))
    here = planner.compile_cached(config, topo, 0, "", devices)
  assert not child["cached"] and child["fits"]
  assert child["steps"][0]["memory"] == here["steps"][0]["memory"]
  assert len(list(tmp_path.glob("*.json"))) == 1
  with quick_compiles():
    assert [str(p) for p in tmp_path.glob("*.json")] == [
      planner._cache_path(config, topo, 0, str(tmp_path))
    ]
    assert planner.compile_isolated(config, topo, 0, str(tmp_path))["cached"]
  assert not os.path.exists(planner._cache_path(config, topo, 0, str(tmp_path)))


def test_a_compiler_crash_in_compile_or_preflight_is_an_error_naming_the_signal(
  monkeypatch, tmp_path
):
  """``bert_jax.compile`` and a launch's pre-flight compile in a child process: a compiler
  that crashes (here a child that segfaults on purpose) is one error naming the signal and the
  file that keeps the child's output, not the end of the process; the launcher creates
  nothing."""
  monkeypatch.setattr(isolation, "WORKER", _CRASH)
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  topo = topo_lib.parse_topology("v5e:2x2")
  died = r"the compiler process died \(signal SIGSEGV; its output: (\S+)\) dying"
  with pytest.raises(isolation.CompilerDied, match=died) as e:
    isolation.compile_for_topology_isolated(_config((4, 1, 1)), topo)
  log = pathlib.Path(re.search(died, str(e.value)).group(1))
  assert log.parent == tmp_path and log.read_text() == "dying\n"

  config = pathlib.Path(__file__).resolve().parent.parent / "configs" / "pretrain.py"
  job = Job("pretrain", f"{config}:tiny", "gs://bucket/run")
  target = TpuTarget(
    tpu_name="pod",
    zone="us-central2-b",
    project="my-project",
    create=True,
    accelerator_type="v5litepod-4",
  )
  out = io.StringIO()
  with pytest.raises(LaunchError, match=r"pre-flight for v5litepod-4: the compiler process died "
                     r"\(signal SIGSEGV.*--skip_preflight to launch anyway"):  # fmt: skip
    launch(job, target, out=out)
  assert "gcloud" not in out.getvalue()


def test_an_input_error_in_the_compiling_child_is_the_same_error_here():
  _devices("v5e:2x2")
  with pytest.raises(ValueError, match=r"v5e:2x2 .*has 3 devices but 4 are available"):
    isolation.compile_for_topology_isolated(_config((3, 1, 1)), topo_lib.parse_topology("v5e:2x2"))


def test_a_cached_compile_is_reused_only_for_the_same_code(monkeypatch, tmp_path):
  """The cache key covers bert_jax's sources: after an edit to the model (here a digest of
  other sources), the same config and topology compile afresh instead of reading numbers of
  the old code."""
  topo = topo_lib.parse_topology("v5e:2x2")
  config = _config((4, 1, 1))
  path = planner._cache_path(config, topo, 0, str(tmp_path))
  assert path == planner._cache_path(config, topo, 0, str(tmp_path))
  bert_py = pathlib.Path(planner.__file__).resolve().parent.parent / "model" / "bert.py"
  edited = {bert_py: bert_py.read_bytes() + b"\n# edited\n"}
  read_bytes = pathlib.Path.read_bytes
  monkeypatch.setattr(pathlib.Path, "read_bytes", lambda p: edited.get(p) or read_bytes(p))
  planner._code_digest.cache_clear()
  try:
    assert planner._cache_path(config, topo, 0, str(tmp_path)) != path
  finally:
    monkeypatch.undo()
    planner._code_digest.cache_clear()
  assert planner._cache_path(config, topo, 0, str(tmp_path)) == path


def test_plan_workers_follow_cores_and_memory(monkeypatch):
  monkeypatch.setattr(planner.os, "cpu_count", lambda: 16)
  assert 1 <= planner.default_workers(6) <= 6
  assert planner.default_workers(1) == 1
  monkeypatch.setattr(planner.os, "cpu_count", lambda: 2)
  assert planner.default_workers(6) == 1


@pytest.mark.parametrize(
  "arg_gib, temp_gib, fits",
  [(8, 7.5, True), (8, 8, False), (15.5, 0.5, False), (0.01, 15, True)],
)
def test_the_compilers_verdict_counts_arguments_with_temporaries(arg_gib, temp_gib, fits):
  """What the report's total means: the TPU compiler refuses a program whose arguments plus
  temporaries exceed the chip's available HBM (15.75 GiB on v5e), though either alone fits; the
  report's total (arguments + outputs - aliased + temporaries + code) agrees with its verdict."""
  devices = _devices("v5e:2x2")
  topo = topo_lib.parse_topology("v5e:2x2")
  mesh = jax.sharding.Mesh(np.array(devices), ("d",))
  replicated = jax.sharding.NamedSharding(mesh, PartitionSpec())
  n_arg, n_temp = int(arg_gib * 2**30) // 4, int(temp_gib * 2**30) // 4

  def f(a, b):  # a temporary of temp_gib GiB, kept whole by the cumulative sum
    t = jnp.cumsum(jnp.sin(jnp.broadcast_to(b, (n_temp // 1024, 1024)) * 3.0), axis=0)
    return a[:8] + jnp.sum(t)

  lowered = jax.jit(f).lower(
    jax.ShapeDtypeStruct((n_arg,), jnp.float32, sharding=replicated),
    jax.ShapeDtypeStruct((1024,), jnp.float32, sharding=replicated),
  )
  rep = step_report(
    "probe", lowered, topo, mesh, params_bytes=0, opt_state_bytes=0, model_flops=0, tokens=0
  )
  assert rep.fits == fits
  if fits:
    assert rep.memory["total_bytes"] == pytest.approx((arg_gib + temp_gib) * 2**30, rel=0.02)
    assert rep.memory["total_bytes"] <= 15.75 * 2**30
  else:
    assert rep.memory["needed_bytes"] == pytest.approx((arg_gib + temp_gib) * 2**30, rel=0.02)


def test_a_compiled_step_larger_than_the_chip_is_not_a_fit():
  """The compiler accepted a program whose arguments + temporaries exceed the chip's HBM (seen
  once, docs/compile.md): the report says it does not fit, with the numbers."""
  gib = 1024**3

  class Compiled:
    def memory_analysis(self):
      return types.SimpleNamespace(
        argument_size_in_bytes=4 * gib, output_size_in_bytes=4 * gib,
        alias_size_in_bytes=4 * gib, temp_size_in_bytes=94 * gib,
        generated_code_size_in_bytes=0,
      )  # fmt: skip

    def cost_analysis(self):
      return {"flops": 1.0, "bytes accessed": 1.0}

    def as_text(self):
      return "HloModule m\n\nENTRY %main () -> f32[] {\n}\n"

  class Lowered:
    def compile(self):
      return Compiled()

  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(4, 1, 1), ("data", "fsdp", "tensor"))
  topo = topo_lib.parse_topology("v5p:2x2x1")
  rep = step_report(
    "train", Lowered(), topo, mesh, params_bytes=0, opt_state_bytes=0, model_flops=1, tokens=1
  )
  assert not rep.fits
  assert rep.memory["needed_bytes"] == 98 * gib
  assert rep.memory["over_bytes"] == 98 * gib - topo.chip.hbm_bytes
  assert "98.00 GiB" in rep.error and "HBM" in rep.error


def test_a_compile_failure_other_than_memory_is_one_line_naming_the_step():
  class Lowered:
    def compile(self):
      raise RuntimeError("INVALID_ARGUMENT: unsupported op foo\n  at bar.cc:12\nmore detail")

  topo = topo_lib.parse_topology("v5e:2x2")
  with pytest.raises(CompileError, match=r"^train seq128 does not compile for v5e:2x2 .*foo$"):
    step_report(
      "train seq128", Lowered(), topo, None, params_bytes=0, opt_state_bytes=0, model_flops=0,
      tokens=0,
    )  # fmt: skip
  out_of_memory = "RESOURCE_EXHAUSTED: HLO temporaries (20.00G) exceeds available HBM (15.75G)"

  class TooBig:
    def compile(self):
      raise RuntimeError(out_of_memory)

  rep = step_report(
    "train", TooBig(), topo, None, params_bytes=1.0, opt_state_bytes=2.0, model_flops=0, tokens=0
  )
  assert not rep.fits and rep.memory["over_bytes"] == pytest.approx(4.25 * 1024**3)


def test_flops_and_bytes_read_from_the_hlo_text_equal_xlas_cost_analysis():
  """``hlo_text_cost`` (what the report falls back to where the compiler reports no cost, the
  GPU compile-only client) applies XLA's HloCostAnalysis rules to ``compiled.as_text()``: on
  the CPU, whose compiled programs do report one, the two agree."""
  if jax.device_count() != 8 or jax.default_backend() != "cpu":
    pytest.skip("needs the suite's 8 fake CPU devices (tests/conftest.py)")
  mesh = jax.make_mesh((8,), ("d",))
  rows = jnp.array([1, 3, 5])

  def probe(x, w, i, v):
    """What the cost rules treat apart: dots, transcendentals, reductions, a scan, a dynamic
    slice and update, a gather and scatter, a multi-output sort and an all-to-all of eight
    arrays (whose HLO marks operands ``/*index=5*/``)."""
    y = jnp.tanh(x @ w) + 1.0
    s = jax.lax.dynamic_slice(y, (i, 0), (4, y.shape[1]))
    z, _ = jax.lax.scan(lambda c, _: (c * 2.0 + jnp.sum(c), None), s, None, length=3)
    keys, order = jax.lax.sort((y[:, 0], jnp.arange(y.shape[0])), num_keys=1)
    mixed = jax.shard_map(
      lambda a: jax.lax.all_to_all(a, "d", 0, 0, tiled=True) * 2.0,
      mesh=mesh, in_specs=PartitionSpec("d"), out_specs=PartitionSpec("d"),
    )(v)  # fmt: skip
    return jnp.sum(z, 0), keys, order, y.at[i].set(0.0), y[rows].at[:, 0].add(1.0), mixed

  sharded = jax.sharding.NamedSharding(mesh, PartitionSpec("d"))
  compiled = (
    jax.jit(probe)
    .lower(
      jnp.ones((64, 32)),
      jnp.ones((32, 16)),
      2,
      jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=sharded),
    )
    .compile()
  )
  text = compiled.as_text()
  assert " sort(" in text and " all-to-all(" in text and "/*index=5*/" in text
  assert " while(" in text and "dynamic-update-slice" in text
  xla = compiled.cost_analysis()
  got = hlo_text_cost(text)
  assert got["flops"] == xla["flops"]
  assert got["bytes accessed"] == xla["bytes accessed"]


def test_a_gpu_report_without_a_compiler_cost_takes_it_from_the_hlo_text():
  """The GPU compile-only client's executables report no cost (an empty ``cost_analysis()``):
  the report's FLOPs and bytes accessed are then the rules of XLA's cost analysis applied to
  the compiled module's text, equal to what XLA reports for the same module where it can (the
  tiny pre-training step compiled for the 8 CPU devices)."""
  if jax.device_count() != 8 or jax.default_backend() != "cpu":
    pytest.skip("needs the suite's 8 fake CPU devices (tests/conftest.py)")
  config = _config((2, 2, 2), train_batch_size=16)
  mesh = parallel.create_mesh(config.mesh)
  asm = trainer.assemble(
    build_job(config, abstract=True), config, mesh, parallel.normalize_rules(config.logical_axis_rules)
  )  # fmt: skip
  compiled = trainer.lower_train_step(asm, 0).compile()
  xla = compiled.cost_analysis()

  class CompileOnly:  # a compiled GPU step: memory and text, but no cost analysis
    def memory_analysis(self):
      return compiled.memory_analysis()

    def cost_analysis(self):
      return []

    def as_text(self):
      return compiled.as_text()

  class Lowered:
    def compile(self, **kwargs):
      return CompileOnly()

  rep = step_report(
    "train", Lowered(), topo_lib.parse_topology("h100:8"), mesh, params_bytes=0,
    opt_state_bytes=0, model_flops=1, tokens=1,
  )  # fmt: skip
  # XLA sums in float32: over thousands of instructions its totals round by a few in a million
  assert rep.flops == pytest.approx(xla["flops"], rel=1e-5)
  assert rep.bytes_accessed == pytest.approx(xla["bytes accessed"], rel=1e-5)
  assert rep.flops > 1e9 and rep.bytes_accessed > 1e8


_GEMM_LOOP = """\
HloModule m

%body (p: (s32[], f32[64,128])) -> (s32[], f32[64,128]) {
  %p = (s32[], f32[64,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[64,128]{1,0} get-tuple-element(%p), index=1
  %c = f32[] constant(1)
  %w = f32[128,128]{1,0} broadcast(%c), dimensions={}
  %g = (f32[64,128]{1,0}, s8[1024]{0}) custom-call(%x, %w), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  %y = f32[64,128]{1,0} get-tuple-element(%g), index=0
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[64,128]{1,0}) tuple(%n, %y)
}

%cond (q: (s32[], f32[64,128])) -> pred[] {
  %q = (s32[], f32[64,128]{1,0}) parameter(0)
  %qi = s32[] get-tuple-element(%q), index=0
  %k = s32[] constant(2)
  ROOT %lt = pred[] compare(%qi, %k), direction=LT
}

ENTRY %main (a: f32[64,128]) -> f32[64,128] {
  %a = f32[64,128]{1,0} parameter(0)
  %z = s32[] constant(0)
  %init = (s32[], f32[64,128]{1,0}) tuple(%z, %a)
  %loop = (s32[], f32[64,128]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"2"}}
  ROOT %r = f32[64,128]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_a_gpu_steps_gemm_flops_count_once_per_micro_step():
  """Gradient accumulation on a GPU topology: the step is a loop of 2 micro-steps whose body
  calls cuBLAS for a [64, 128] x [128, 128] GEMM. The step's FLOPs are that GEMM's 2 x 64 x 128
  x 128 once per micro-step (and the few elementwise FLOPs of the loop counter), not once per
  micro-step squared."""
  gemm = 2 * 64 * 128 * 128

  class CompileOnly:  # what the GPU compile-only client gives: memory and text, no cost
    def memory_analysis(self):
      return types.SimpleNamespace(
        argument_size_in_bytes=0, output_size_in_bytes=0, alias_size_in_bytes=0,
        temp_size_in_bytes=0, generated_code_size_in_bytes=0,
      )  # fmt: skip

    def cost_analysis(self):
      return []

    def as_text(self):
      return _GEMM_LOOP

  class Lowered:
    def compile(self, **kwargs):
      return CompileOnly()

  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
  rep = step_report(
    "train", Lowered(), topo_lib.parse_topology("h100:1"), mesh, params_bytes=0,
    opt_state_bytes=0, model_flops=1, tokens=1, loop_trips=2,
  )  # fmt: skip
  assert rep.flops == pytest.approx(2 * gemm, abs=16)
