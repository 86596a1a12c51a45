"""Compiling for NVIDIA GPU hosts without a GPU (bert_jax.parallel.gpu_topology via
bert_jax.compile / bert_jax.plan).

The tiny preset's pre-training step is compiled by XLA:GPU (the CUDA PJRT plugin, deviceless)
for one host of 8 H100s (data parallel), two hosts of 8 (data across hosts, fsdp within) and one
A100-40GB with a batch too large for it. Checked against references computed here, independently
of the code under test: the parameter count from BERT's layer sizes by hand; per-GPU argument
bytes against parameters + AdamW moments + batch over their shard counts (the logical-axis rules
applied by hand); the gradient all-reduce against the gradient's size; the refusal against the
attention probabilities the backward pass must keep; the memory available against the data
sheet's HBM x JAX's default allocator fraction; link times against the data sheets' NVLink and
InfiniBand rates. Skips only where the CUDA plugin is not installed (``pip install
'.[gpu-aot]'``).
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
import subprocess
import sys
import types

import jax
import numpy as np
import pytest
from conftest import tiny_pretrain_config

from bert_jax.parallel import gpu_topology
from bert_jax.parallel import topology as topo_lib
from bert_jax.plan.compiler import compile_for_topology
from bert_jax.plan.hlo import cublas_flops
from bert_jax.plan.report import format_report
from bert_jax.runs.jobs import build_job
from launch.job import Job, LaunchError
from launch.launch import launch
from launch.targets import kubernetes, slurm

GiB = 1024**3
REPO = pathlib.Path(__file__).resolve().parent.parent
# tiny preset: 2 layers, hidden 128, 2 heads, intermediate 512; BERT's vocabulary and positions
V, H, L, I, POS, HEADS = 30522, 128, 2, 512, 512, 2


def _require_plugin() -> None:
  if not gpu_topology.cuda_plugin_installed():
    pytest.skip(
      "jax-cuda12-plugin is not installed (pip install -e '.[gpu-aot]'), so no GPU topology can "
      "be compiled"
    )


_config = tiny_pretrain_config


def _compile(name: str, mesh, **overrides):
  _require_plugin()
  config = _config(mesh, **overrides)
  topo = topo_lib.parse_topology(name)
  return config, topo, compile_for_topology(config, topo, with_eval=False)


def _num_params_by_hand() -> int:
  embeddings = V * H + POS * H + 2 * H + 2 * H  # word, position, token type, LayerNorm
  layer = 4 * (H * H + H) + 2 * H + (H * I + I + I * H + H) + 2 * H
  heads = (H * H + H) + (H * H + H + 2 * H + V) + (2 * H + 2)  # pooler, MLM (tied), NSP
  return embeddings + L * layer + heads


def _batch_bytes(config) -> float:
  b, seq, preds = config.train_batch_size, config.max_seq_length, config.max_predictions_per_seq
  return 3 * b * seq * 4 + 3 * b * preds * 4 + b * 4  # ids/mask/segments, MLM, NSP; int32


def _param_bytes_by_rules(config, sizes) -> float:
  """fp32 parameter bytes per device: each parameter over the mesh axes its logical names map
  to under config.logical_axis_rules (a dimension left whole when they do not divide it)."""
  boxed = jax.eval_shape(
    build_job(config, abstract=True).program.init_params, jax.random.PRNGKey(0)
  )
  mesh = dict(zip(("data", "fsdp", "tensor"), sizes))
  rules = dict(config.logical_axis_rules)
  total = 0.0
  for leaf in jax.tree_util.tree_leaves(boxed, is_leaf=lambda x: hasattr(x, "names")):
    shards = 1
    for name, size in zip(leaf.names, leaf.value.shape):
      axes = rules.get(name) if name is not None else None
      axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
      n = math.prod(mesh[a] for a in axes)
      shards *= n if size % n == 0 else 1
    total += math.prod(leaf.value.shape) * 4 / shards
  return total


# --- no plugin needed ---------------------------------------------------------------------------


def test_gpu_names_parse_and_unknown_ones_list_the_known():
  t = topo_lib.parse_topology("h100:8")
  assert (t.name, t.num_devices, t.shape, t.is_gpu) == ("h100:8", 8, (1, 8), True)
  assert topo_lib.parse_topology("H100:2x8").describe() == (
    "h100:2x8 (16 GPUs, 2 hosts x 8, NVIDIA H100 80GB HBM3)"
  )
  # data sheets: 40/80 GB, BF16 312 / 989.5 TFLOP/s dense, NVLink 600 / 900 GB/s bidirectional
  a100, h200 = topo_lib.parse_topology("a100-40gb:4").chip, topo_lib.parse_topology("h200:8").chip
  assert (a100.hbm_bytes, a100.peak_flops, a100.ici_bandwidth) == (40 * GiB, 312e12, 300e9)
  assert (h200.hbm_bytes, h200.peak_flops, h200.ici_bandwidth) == (141 * GiB, 989.5e12, 450e9)
  # TF32 (float32 matmuls at XLA's default precision): datasheets' 156 dense, 989.5 sparse / 2
  assert (a100.matmul_peak("float32"), h200.matmul_peak("float32")) == (156e12, 494.75e12)
  assert a100.matmul_peak("bfloat16") == 312e12
  with pytest.raises(ValueError, match=r"unknown GPU topology 'b200:8'; known: .*a100-40gb, "):
    topo_lib.parse_topology("b200:8")
  with pytest.raises(ValueError, match=r"3 GPUs per host .*h100:2x8"):
    topo_lib.parse_topology("h100:3")
  with pytest.raises(ValueError, match=r"--num_slices .* h100:2x8"):
    topo_lib.parse_topology("h100:8", num_slices=2)
  assert topo_lib.parse_topology("v5e:2x2").chip.platform == "tpu"  # TPU names unchanged


def test_missing_plugin_is_one_error_naming_the_extra(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util, "find_spec", lambda n, *a: None if "cuda12" in n else real(n, *a)
  )
  with pytest.raises(topo_lib.TopologyError, match=r"jax-cuda12-plugin is not installed.*gpu-aot"):
    topo_lib.topology_devices(topo_lib.parse_topology("h100:8"))


def test_cli_unknown_gpu_is_one_line_listing_the_known(subprocess_env):
  out = subprocess.run(
    [sys.executable, "-m", "bert_jax.compile", "--config", "configs/pretrain.py:tiny",
     "--topology", "h100:16"],
    capture_output=True, text=True, env=subprocess_env(1), cwd=REPO,
  )  # fmt: skip
  assert out.returncode == 1, out.stderr
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("compile: error: GPU topology 'h100:16': 16 GPUs per host"), last
  assert "h100, h200" in last


def test_gpu_devices_without_a_cuda_runtime_or_platform_pin(subprocess_env):
  # A user's host: no CUDA runtime and no JAX_PLATFORMS=cpu (which the test suite sets). The
  # plugin's start-up check for a CUDA runtime must not keep it from registering.
  _require_plugin()
  env = subprocess_env(1)
  for key in ("JAX_PLATFORMS", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK"):
    env.pop(key, None)
  code = (
    "from bert_jax.parallel import topology as t\n"
    "d = t.topology_devices(t.parse_topology('h100:8'))\n"
    "print(len(d), d[0].device_kind)"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split()[:2] == ["8", "NVIDIA"], out.stdout


def test_cublas_flops_read_from_hlo_with_loop_trip_counts():
  hlo = """\
HloModule m

%body (p: (s32[], f32[64,256])) -> (s32[], f32[64,256]) {
  %p = (s32[], f32[64,256]) parameter(0)
  %a = f32[64,32]{1,0} parameter(1)
  %b = f32[32,256]{1,0} parameter(2)
  %g = (f32[64,256]{1,0}, s8[1024]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  ROOT %t = (s32[], f32[64,256]) tuple(%i, %g)
}

ENTRY %main (x: f32[8,16,128]) -> f32[8,16,16] {
  %x = f32[8,16,128]{2,1,0} parameter(0)
  %y = (f32[8,16,16]{2,1,0}, s8[1024]{0}) custom-call(%x, %x), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["2"],"rhs_contracting_dimensions":["2"],"lhs_batch_dimensions":["0"],"rhs_batch_dimensions":["0"]}}}
  %w = (s32[], f32[64,256]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %r = f32[8,16,16]{2,1,0} get-tuple-element(%y), index=0
}
"""
  # by hand: batched 8 x (16x128 @ 128x16) once, (64x32 @ 32x256) three times
  assert cublas_flops(hlo) == 2 * 8 * 16 * 16 * 128 + 3 * 2 * 64 * 256 * 32


# --- compiled by XLA:GPU ------------------------------------------------------------------------


def test_two_host_devices_carry_their_host_and_kind():
  _require_plugin()
  devices = topo_lib.topology_devices(topo_lib.parse_topology("h100:2x8"))
  assert len(devices) == 16
  assert {d.device_kind for d in devices} == {"NVIDIA H100 80GB HBM3"}
  assert [d.process_index for d in devices] == [i // 8 for i in range(16)]


def test_data_parallel_on_8_h100_replicates_state_and_all_reduces_the_gradients(monkeypatch):
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  config, topo, result = _compile("h100:8", (8, 1, 1))
  p = _num_params_by_hand()
  assert result["num_params"] == p
  step = result["steps"][0]
  mem = step["memory"]
  # replicated: params + two AdamW moments, fp32; the batch split 8 ways (+ step and rng)
  assert mem["params_bytes"] == 4 * p
  assert mem["argument_bytes"] == pytest.approx(3 * 4 * p + _batch_bytes(config) / 8, abs=64)
  assert step["fits"] and mem["available_bytes"] == 0.75 * 80 * GiB  # JAX's default fraction
  assert mem["free_bytes"] == mem["available_bytes"] - mem["total_bytes"]
  colls = step["collectives"]
  assert {(c["kind"], c["axes"], c["network"]) for c in colls} == {("all-reduce", "data", "ici")}
  # every fp32 gradient is reduced over data: at least the parameters (less the position rows
  # beyond seq 128, whose gradient is zero), at most that plus the tied word embedding's second
  # contribution (lookup and MLM decoder) and the loss's scalars
  reduced = sum(c["bytes"] for c in colls)
  assert 4 * (p - (POS - 128) * H) <= reduced <= 4 * (p + V * H) + 64, (reduced, 4 * p)
  est = step["estimate"]
  # ring all-reduce moves 2 (n-1)/n of it per GPU, at half NVLink 4's 900 GB/s
  assert est["ici_seconds"] == pytest.approx(2 * 7 / 8 * reduced / 450e9, rel=1e-6)
  assert est["dcn_seconds"] == 0
  # the compiler's FLOPs (HLO cost + cuBLAS GEMMs) near the model's: remat is off
  assert est["compiler_flops_per_chip"] == pytest.approx(est["model_flops"] / 8, rel=0.15)
  # a float32 step: XLA runs its GEMMs as TF32, 494.75 TFLOP/s dense (datasheet: 989.5 sparse)
  assert est["compute_seconds"] == pytest.approx(est["compiler_flops_per_chip"] / 494.75e12)
  text = format_report(result["reports"], topo)
  assert "all-reduce         over data             nvlink" in text


def test_two_hosts_shard_fsdp_over_nvlink_and_reduce_data_over_infiniband():
  config, topo, result = _compile("h100:2x8", (2, 8, 1))
  step = result["steps"][0]
  mem = step["memory"]
  params = _param_bytes_by_rules(config, (2, 8, 1))
  assert mem["params_bytes"] == pytest.approx(params)
  assert params < 4 * _num_params_by_hand() / 7  # mostly sharded 8 ways
  assert mem["argument_bytes"] == pytest.approx(3 * params + _batch_bytes(config) / 16, rel=0.01)
  mesh = result["reports"][0].compiled.input_shardings[0][0].params
  mesh = jax.tree_util.tree_leaves(mesh)[0].mesh
  hosts = np.vectorize(lambda d: d.process_index)(mesh.devices)
  assert (hosts[0] == 0).all() and (hosts[1] == 1).all()  # data index = host
  nets = {c["axes"]: c["network"] for c in step["collectives"]}
  assert nets["fsdp"] == "ici" and nets["data"] == "dcn"  # NVLink within, InfiniBand across
  dcn = sum(c["moved_bytes"] for c in step["collectives"] if c["network"] == "dcn")
  assert dcn > 0
  assert step["estimate"]["dcn_seconds"] == pytest.approx(dcn / 50e9)  # 400 Gb/s per GPU


def test_a_batch_too_large_for_an_a100_40gb_is_refused_with_the_numbers(monkeypatch):
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  b, seq = 4096, 512
  config, topo, result = _compile(
    "a100-40gb:1", (1, 1, 1), train_batch_size=b, max_seq_length=seq, max_predictions_per_seq=80
  )
  step = result["steps"][0]
  assert not result["fits"] and not step["fits"]
  mem = step["memory"]
  assert mem["available_bytes"] == 0.75 * 40 * GiB  # data sheet 40 GB x JAX's 0.75
  # the backward pass keeps every layer's fp32 attention probabilities [b, heads, seq, seq]
  assert mem["needed_bytes"] > L * b * HEADS * seq * seq * 4
  assert mem["needed_bytes"] > mem["available_bytes"]
  assert mem["over_bytes"] == pytest.approx(mem["needed_bytes"] - mem["available_bytes"])
  text = format_report(result["reports"], topo)
  need = mem["needed_bytes"] / GiB
  assert f"needs {need:.2f} GiB of 30.00 GiB available" in text


def _pretrain_job(workdir: str, *extra: str):
  return Job("pretrain", f"{REPO / 'configs' / 'pretrain.py'}:tiny", workdir, extra_args=extra)


def test_slurm_and_kubernetes_preflight_compile_for_their_gpus(monkeypatch, tmp_path):
  """The GPU targets hand the pre-flight the topology of what they allocate; an unknown GPU is
  refused with the known ones listed, before anything is written (no plugin needed)."""
  asked = []
  for module in (slurm, kubernetes):
    monkeypatch.setattr(module, "preflight", lambda job, config, name: asked.append(name) or {})
  job = _pretrain_job(str(tmp_path / "run"))
  slurm.SlurmTarget(partition="p", nodes=2, gpus_per_node=8, gpu_type="h100").preflight(job, {})
  slurm.SlurmTarget(partition="p", gpus_per_node=4, gpu_type="a100-80gb").preflight(job, {})
  kubernetes.KubernetesTarget(image="i", num_hosts=3, gpus_per_host=8, gpu_type="h200").preflight(
    job, {}
  )
  assert slurm.SlurmTarget(partition="p", gpu_type="h100", skip_preflight=True).preflight(
    job, {}
  ) is None  # fmt: skip
  assert slurm.SlurmTarget(partition="p").preflight(job, {}) is None
  assert asked == ["h100:2x8", "a100-80gb:4", "h200:3x8"]
  monkeypatch.undo()

  with pytest.raises(
    LaunchError, match=r"slurm target: --gpu_type='h999': unknown GPU topology .*h100"
  ):
    launch(job, slurm.SlurmTarget(partition="p", gpu_type="h999"))
  assert not (tmp_path / "run").exists()
  with pytest.raises(LaunchError, match=r"gpu_type 'h100' needs gpus_per_host >= 1"):
    kubernetes.KubernetesTarget(image="i", gpu_type="h100").validate(_pretrain_job("gs://b/r"))


def test_slurm_preflight_refuses_a_job_too_large_for_its_gpus(monkeypatch, tmp_path):
  """Compiled for one A100-40GB, a batch its memory cannot hold: refused with the numbers,
  no sbatch script, no launch.json, nothing submitted."""
  _require_plugin()
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  submitted = []
  # sbatch only (the pre-flight compiles in a child process: subprocess itself stays real)
  sbatch = types.SimpleNamespace(run=lambda *a, **k: submitted.append(a))
  monkeypatch.setattr(slurm, "subprocess", sbatch)
  job = _pretrain_job(
    str(tmp_path / "run"),
    "--config.train_batch_size=4096",
    "--config.max_seq_length=512",
    "--config.max_predictions_per_seq=80",
    "--config.phase2.fraction=0.0",
  )
  target = slurm.SlurmTarget(partition="p", gpus_per_node=1, gpu_type="a100-40gb")
  with pytest.raises(LaunchError, match=r"does not fit on .*needs [\d.]+ GiB per chip, 30.00 GiB"):
    launch(job, target)
  assert not (tmp_path / "run").exists() and not submitted
