"""bert_jax.compile, its planner and the launch pre-flight: refuse what a run refuses, before any
compile; cost cross-slice traffic; say how tight a fit is and which figure is an estimate; check
flags and output paths first; stop promptly on Ctrl-C; survive a corrupt cache entry; never stay
silent for long.

References, independent of the code under test: the run's own refusal (``check_run_config``, the
function ``pretrain`` / ``finetune`` call) and its messages as documented; the tiny model's
parameter bytes from the abstract state; the real process table (no child compile left after an
interrupt) and the real file system. Compiles use the tiny preset on ``v5e:2x2`` (one or two
slices), at the lowest compiler effort where only the program's structure matters.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import REPO, tiny_pretrain_config

from bert_jax.parallel import topology as topo_lib
from bert_jax.plan import compiler, hlo, isolation, planner
from bert_jax.plan.report import StepReport, format_report, step_report
from bert_jax.runs.jobs import build_job
from bert_jax.runs.rules import check_run_config
from launch.job import Job, LaunchError
from launch.launch import launch
from launch.targets import TpuTarget

GiB = 1024**3
TINY = "configs/pretrain.py:tiny"


def _devices(name: str, num_slices: int = 1):
  try:
    return topo_lib.topology_devices(topo_lib.parse_topology(name, num_slices))
  except topo_lib.TopologyError as e:
    pytest.skip(f"libtpu cannot load on this host, so no TPU topology can be compiled: {e}")


def _cli(env, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-m", "bert_jax.compile", "--config", TINY, *args],
    capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout,
  )  # fmt: skip


def _run_refusal(config) -> str:
  """What a run says of ``config``: ``check_run_config``, the check pretrain / finetune make
  first (bert_jax/train/trainer.py)."""
  with pytest.raises(ValueError) as e:
    check_run_config(config)
  return str(e.value)


# --- 1. the run's validation, before any compile ---------------------------------------------


@pytest.mark.parametrize("batch", [0, -8])
def test_compile_refuses_a_batch_the_run_refuses_with_the_runs_error(subprocess_env, batch):
  """A batch pretrain refuses (0: it would report "fits" at 0 tokens/s; -8: it would die in the
  compiler child) is refused by ``bert_jax.compile`` with the run's own one-line error, exit
  status 1, before any compile (no progress line, no child)."""
  run_says = _run_refusal(tiny_pretrain_config(train_batch_size=batch))
  assert run_says == f"invalid config: config.train_batch_size={batch} (must be positive)"
  out = _cli(subprocess_env(1), "--topology", "v5e:2x2", f"--config.train_batch_size={batch}")
  assert out.returncode == 1, out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1] == f"compile: error: {run_says}", out.stderr[-2000:]
  assert "compil" not in out.stdout + out.stderr.replace("compile: error", "")


def test_an_eval_batch_the_slices_cannot_split_is_the_runs_error_not_a_sharding_error():
  """Two slices, data=2 x fsdp=4: an eval batch of 12 does not split 8 ways. pretrain refuses
  it (``config.eval_batch_size=12 is not divisible by the data-parallel size 8``); the compile
  checks it before any compile, and compile_for_topology itself too."""
  topo = topo_lib.parse_topology("v5e:2x2", num_slices=2)
  config = tiny_pretrain_config((2, 4, 1), train_batch_size=64, eval_batch_size=12)
  expected = "config.eval_batch_size=12 is not divisible by the data-parallel size 8 "
  expected += "(mesh data=2 x fsdp=4)"
  with pytest.raises(ValueError) as e:
    compiler.check_config(config, topo)
  assert str(e.value) == expected
  with pytest.raises(ValueError, match=r"^config\.eval_batch_size=12 is not divisible"):
    compiler.compile_for_topology(config, topo, devices=["not used: refused before"])


def test_the_launch_preflight_refuses_an_invalid_config_before_compiling(monkeypatch):
  """The pre-flight refuses a config the run refuses with the run's error, before any compile
  (a compiler that would crash on purpose is never started), and nothing is created."""
  crash = (sys.executable, "-c", "import os; os.abort()")
  monkeypatch.setattr(isolation, "WORKER", crash)
  config = pathlib.Path(REPO) / "configs" / "pretrain.py"
  job = Job("pretrain", f"{config}:tiny", "gs://bucket/run",
            extra_args=("--config.train_batch_size=0",))  # fmt: skip
  target = TpuTarget(
    tpu_name="pod",
    zone="us-central2-b",
    project="my-project",
    create=True,
    accelerator_type="v5litepod-4",
  )
  out = __import__("io").StringIO()
  with pytest.raises(LaunchError) as e:
    launch(job, target, out=out)
  assert str(e.value) == (
    "pre-flight for v5litepod-4: invalid config: config.train_batch_size=0 (must be positive)"
  )
  assert "gcloud" not in out.getvalue()


def test_a_plan_checks_its_config_and_phase_before_any_compile(monkeypatch):
  def no_compile(*a, **k):
    raise AssertionError("compiled")

  monkeypatch.setattr(planner, "compile_cached", no_compile)
  monkeypatch.setattr(planner, "compile_isolated", no_compile)
  topo = topo_lib.parse_topology("v5e:2x2")
  with pytest.raises(ValueError, match=r"^invalid config: config.train_batch_size=0 "):
    planner.make_plan(tiny_pretrain_config(train_batch_size=0), topo, log=lambda _: None)
  with pytest.raises(ValueError, match=r"^--plan_phase=1: must be 0 \(the config has one phase"):
    planner.make_plan(tiny_pretrain_config(train_batch_size=32), topo, phase=1)
  # a layout the eval batch (6) does not divide over is no candidate: 4-way data x fsdp
  config = tiny_pretrain_config(train_batch_size=32, eval_batch_size=6)
  meshes = planner.check_plan_args(config, topo, max_meshes=10)
  assert meshes and all(6 % (d * f) == 0 for d, f, _ in meshes)
  assert meshes == [m for m in planner.mesh_candidates(4, 32) if 6 % (m[0] * m[1]) == 0]


# --- 2. cross-slice traffic at DCN bandwidth -------------------------------------------------

_MEGASCALE_HLO = """\
HloModule m

ENTRY %main (a: f32[1024]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %ar = f32[1024]{0} all-reduce(%a), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %send = (f32[1024]{0}, u32[], token[]) send(%ar, %after-all), channel_id=3, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce_0",_xla_megascale_reduce_operation="SUM",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %recv = (f32[1024]{0}, u32[], token[]) recv(%after-all), channel_id=2, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce_0",_xla_megascale_reduce_operation="SUM",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %send.1 = (f32[2,64]{1,0}, u32[], token[]) send(%b, %after-all), channel_id=5, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-gather.5_0",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_GATHER"}
  ROOT %r = f32[1024]{0} get-tuple-element(%recv), index=0
}
"""


def test_megascale_transfers_are_cross_slice_collectives():
  """libtpu's form of a collective across 2 slices of 4 chips (seen in the compiled 2-slice
  step): an all-reduce within the slice (its groups name the slice's own chips 0-3), then a
  host send / recv pair marked _xla_megascale_*. By hand: the all-reduce over fsdp (ICI) moves
  2 x 3/4 x 4 KiB; the send over data (DCN, 2 slices) 2 x 1/2 x 4 KiB; the all-gather sends its
  512 B piece to the other slice, its result 1 KiB."""
  _devices("v5e:2x2", 2)
  topo = topo_lib.parse_topology("v5e:2x2", num_slices=2)
  mesh = compiler.parallel.create_mesh(
    {"data": 2, "fsdp": 4, "tensor": 1}, devices=topo_lib.topology_devices(topo)
  )
  got = {(c["kind"], c["axes"], c["network"]): c for c in hlo.collectives(_MEGASCALE_HLO, mesh)}
  assert set(got) == {
    ("all-reduce", "fsdp", "ici"), ("all-reduce", "data", "dcn"), ("all-gather", "data", "dcn")
  }  # fmt: skip
  assert got[("all-reduce", "fsdp", "ici")]["moved_bytes"] == 2 * 3 / 4 * 4096
  dcn = got[("all-reduce", "data", "dcn")]
  assert (dcn["count"], dcn["bytes"], dcn["moved_bytes"]) == (1, 4096, 4096)
  ag = got[("all-gather", "data", "dcn")]
  assert (ag["bytes"], ag["moved_bytes"]) == (1024, 512)


def test_two_slices_cost_the_gradient_all_reduce_at_dcn_bandwidth():
  """``--num_slices=2 --config.mesh.data=2 --config.mesh.fsdp=4``: every collective's axes
  are named, and the cross-slice part is costed at DCN bandwidth. The data axis spans the slices, so each chip's gradient
  shard (its parameter bytes, fsdp-sharded) is all-reduced across them over DCN: at least the
  parameter bytes, at most those plus the word embedding's shard (the tied embedding's two
  gradient contributions, reduced separately by XLA), moved 2 x 1/2 of that in a 2-way ring."""
  devices = _devices("v5e:2x2", 2)
  topo = topo_lib.parse_topology("v5e:2x2", num_slices=2)
  config = tiny_pretrain_config((2, 4, 1), train_batch_size=64)
  steps = []
  with isolation.compiler_options(**planner.QUICK):
    result = compiler.compile_for_topology(
      config, topo, with_eval=False, devices=devices, on_step=steps.append
    )
  assert steps == ["train seq128 (1 of 1)"]
  step = result["steps"][0]
  colls = step["collectives"]
  assert all(c["axes"] != "?" for c in colls), colls
  (dcn,) = [c for c in colls if c["network"] == "dcn" and c["kind"] == "all-reduce"]
  assert dcn["axes"] == "data"
  params = step["memory"]["params_bytes"]  # per chip, from the shardings
  job = build_job(config, abstract=True)
  shapes = jax.eval_shape(job.program.init_params, jax.random.PRNGKey(0))
  embedding = [
    x for p, x in jax.tree_util.tree_leaves_with_path(shapes) if "word_embeddings" in str(p)
  ]
  emb_shard = math.prod(np.shape(embedding[0])) * 4 / 4  # f32, 4 fsdp shards
  assert params * 0.99 <= dcn["bytes"] <= (params + emb_shard) * 1.02, (dcn, params, emb_shard)
  assert dcn["moved_bytes"] == dcn["bytes"]  # 2 x (2 - 1) / 2
  est = step["estimate"]
  dcn_moved = sum(c["moved_bytes"] for c in colls if c["network"] == "dcn")
  assert est["dcn_seconds"] > 0
  assert est["dcn_seconds"] == pytest.approx(dcn_moved / topo.chip.dcn_bandwidth)
  assert dcn_moved >= params


# --- 3. the console report ------------------------------------------------------------------


def _fake_step(total_gib: float, mesh, batch: int = 64) -> StepReport:
  class Compiled:
    def memory_analysis(self):
      return type("M", (), dict(
        argument_size_in_bytes=int(total_gib * GiB), output_size_in_bytes=0,
        alias_size_in_bytes=0, temp_size_in_bytes=0, generated_code_size_in_bytes=0,
      ))()  # fmt: skip

    def cost_analysis(self):
      return {"flops": 1e9, "bytes accessed": 1e6}

    def as_text(self):
      return "HloModule m\n\nENTRY %main () -> f32[] {\n}\n"

  class Lowered:
    def compile(self):
      return Compiled()

  return step_report(
    "train seq128", Lowered(), topo_lib.parse_topology("v5e:2x2"), mesh, params_bytes=0,
    opt_state_bytes=0, model_flops=1e9, tokens=batch * 128, global_batch=batch,
  )  # fmt: skip


def test_the_report_gives_the_batch_and_flags_a_tight_fit():
  """v5e: 16 GiB per chip. 15.36 GiB used leaves 0.64 GiB (4%): flagged tight (under 10%
  free). 8 GiB used is a plain yes. Batch 64 over data 4: 16 per chip."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(4, 1, 1), ("data", "fsdp", "tensor"))
  topo = topo_lib.parse_topology("v5e:2x2")
  tight, roomy = _fake_step(16 - 0.64, mesh), _fake_step(8, mesh)
  assert (tight.global_batch, tight.batch_per_chip) == (64, 16)
  text = format_report([tight], topo)
  assert "train seq128: yes (tight: 0.64 GiB free, 4%)" in text
  row = next(line for line in text.splitlines() if line.startswith("train seq128 "))
  assert row.split()[2:5] == ["64", "16", "tight"]
  header = next(line for line in text.splitlines() if line.startswith("step "))
  assert header.split()[1:4] == ["batch", "/chip", "fits"]
  text = format_report([roomy], topo)
  assert "tight" not in text
  row = next(line for line in text.splitlines() if line.startswith("train seq128 "))
  assert row.split()[2:5] == ["64", "16", "yes"]


def test_a_quick_plan_labels_the_quick_estimates_and_the_verified_compile(monkeypatch):
  """A quick plan's ranked rows are labelled as quick estimates, its verification rows as
  verified, and the best layout's line gives both figures. Stand-in compiler: quick compiles
  estimate 20 ms, the verification 40 ms."""
  key = "jax_exec_time_optimization_effort"
  default = jax.config.values[key]

  def fake_compile(cfg, topo, phase, cache_dir, devices):
    quick = jax.config.values[key] != default
    step = dict(
      fits=True, memory=dict(total_bytes=1 << 30),
      estimate=dict(step_seconds=0.020 if quick else 0.040, tokens_per_second=1.0, mfu=0.5),
      compile_seconds=0.0, error=None,
    )  # fmt: skip
    return dict(steps=[step], cached=False)

  monkeypatch.setattr(planner, "compile_cached", fake_compile)
  monkeypatch.setattr(planner, "topology_devices", lambda topo: None)
  plan = planner.make_plan(
    tiny_pretrain_config(train_batch_size=32), topo_lib.parse_topology("v5e:2x2"), max_meshes=1,
    isolate=False, quick=True, log=lambda _: None,
  )  # fmt: skip
  text = planner.format_plan(plan)
  lines = text.splitlines()
  ranked = next(line for line in lines if line.lstrip().startswith("1 "))
  verified = next(line for line in lines if " ver. " in line)
  assert "20.0ms" in ranked and ranked.endswith("quick est.")
  assert "40.0ms" in verified and verified.endswith("verified")
  assert (
    "  best: data=4 fsdp=1 tensor=1 remat off accum 1: est. step 40.0 ms verified (its quick "
    "estimate: 20.0 ms at accumulation 1)" in lines
  )


# --- 4. flags, output paths, interrupts, the cache ------------------------------------------


@pytest.mark.parametrize(
  "flag, words",
  [
    ("--plan_max_meshes=0", "--plan_max_meshes=0: must be at least 1"),
    ("--plan_workers=-2", "--plan_workers=-2: must be >= 0"),
    ("--plan_phase=9", "--plan_phase=9: must be 0 (the first phase) or 1"),
  ],
)
def test_plan_flags_out_of_range_are_usage_errors_before_any_work(subprocess_env, flag, words):
  out = _cli(subprocess_env(1), "--topology", "v5e:2x2", "--plan", flag, timeout=120)
  assert out.returncode == 2, out.stderr[-2000:]
  (line,) = out.stderr.strip().splitlines()
  assert line.startswith(f"compile: error: {words}"), line
  assert out.stdout == ""


def test_output_paths_are_checked_before_any_work(subprocess_env, tmp_path):
  """--output to a missing folder, and an output that names an input (here the bert_config_file
  the config names), are refused at once: no compile, the input unchanged."""
  env = subprocess_env(1)
  missing = tmp_path / "no_such_folder" / "plan.json"
  start = time.monotonic()
  out = _cli(env, "--topology", "v5e:2x2", f"--output={missing}", timeout=120)
  assert out.returncode == 1, out.stderr[-2000:]
  assert out.stderr.strip().splitlines() == [
    f"compile: error: --output={missing}: the folder {missing.parent} does not exist"
  ]
  assert "compiling" not in out.stdout + out.stderr and not missing.parent.exists()
  bert_config = tmp_path / "bert_config.json"
  bert_config.write_text(json.dumps({"vocab_size": 30522}))
  before = bert_config.read_text()
  out = _cli(
    env, "--topology", "v5e:2x2", f"--config.bert_config_file={bert_config}",
    f"--output={bert_config}", timeout=120,
  )  # fmt: skip
  assert out.returncode == 1, out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1] == (
    f"compile: error: --output={bert_config}: is an input of this run; it would be overwritten"
  )
  assert bert_config.read_text() == before
  assert time.monotonic() - start < 60  # two start-ups, no compile


def _session_processes(session: int) -> list[str]:
  """Command lines of the live processes in ``session`` (from /proc)."""
  out = []
  for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat.read_text().rsplit(")", 1)[1].split()
      cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
      continue
    if int(fields[3]) == session and fields[0] != "Z":
      out.append(cmd)
  return out


def test_ctrl_c_during_a_plan_stops_at_once_with_one_line(subprocess_env, tmp_path):
  """SIGINT to the planner alone (its children do not get it) during ``--plan`` kills the child
  compile at once, starts no other candidate, and ends within seconds with one line and no
  traceback, exit status 130."""
  _devices("v5e:2x2")
  proc = subprocess.Popen(
    [sys.executable, "-m", "bert_jax.compile", "--config", TINY, "--topology", "v5e:2x2",
     "--plan", "--plan_max_meshes=3", "--plan_workers=1", f"--plan_cache={tmp_path}"],
    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(1), cwd=REPO,
    start_new_session=True,
  )  # fmt: skip
  try:
    first = proc.stdout.readline()  # "compiling data=4 fsdp=1 ...": a child is starting
    assert first.startswith("compiling data="), first + proc.stderr.read()[-2000:]
    deadline = time.monotonic() + 60
    while not any("compile_worker" in c for c in _session_processes(proc.pid)):
      assert time.monotonic() < deadline, "no compiling child appeared"
      time.sleep(0.2)
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    took = time.monotonic() - sent
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == 130, stderr[-3000:]
  assert took < 15, took
  assert "Traceback" not in stderr, stderr[-3000:]
  assert stderr.strip().splitlines()[-1].startswith("compile: interrupted after ")
  assert "compiling data=" not in stdout  # no other candidate started
  assert not _session_processes(proc.pid)  # the child compile is gone too
  assert not list(tmp_path.glob("*.json")) and not list(tmp_path.glob("*.log"))


def test_a_corrupt_cache_entry_is_compiled_again_with_a_warning_naming_it(monkeypatch, tmp_path):
  """An empty or cut-short plan-cache file is a warning naming the file (not "Expecting value:
  line 1 column 1" ending every plan), and the candidate is compiled again (its entry
  rewritten); the in-process and the isolated paths both."""
  topo = topo_lib.parse_topology("v5e:2x2")
  config = tiny_pretrain_config((4, 1, 1))
  path = pathlib.Path(planner._cache_path(config, topo, 0, str(tmp_path)))
  path.write_text("")
  fresh = dict(steps=[dict(fits=True, memory={}, estimate=None, compile_seconds=1.0, error="")])
  monkeypatch.setattr(planner, "compile_for_topology", lambda *a, **k: dict(fresh, reports=[]))
  warnings = []
  monkeypatch.setattr(planner.logging, "warning", lambda fmt, *a: warnings.append(fmt % a))
  got = planner.compile_cached(config, topo, 0, str(tmp_path))
  assert not got["cached"] and got["steps"] == fresh["steps"]
  assert len(warnings) == 1 and warnings[0].startswith(f"{path}: unreadable plan-cache entry")
  assert json.loads(path.read_text())["steps"] == fresh["steps"]  # rewritten, valid
  path.write_text('{"steps": [')  # cut short
  calls = []
  monkeypatch.setattr(
    isolation, "run_in_child", lambda *a, **k: calls.append(a) or dict(fresh, cached=False)
  )
  assert not planner.compile_isolated(config, topo, 0, str(tmp_path))["cached"]
  assert len(calls) == 1 and len(warnings) == 2 and str(path) in warnings[1]


# --- 5. never silent ------------------------------------------------------------------------

_SLOW_CHILD = (
  sys.executable,
  "-c",
  "import json, os, sys, time\n"
  "open(os.environ['BERT_JAX_COMPILE_STATUS'], 'w').write('train seq128 (1 of 2)')\n"
  "time.sleep(2.6)\n"
  "json.dump(dict(steps=[], fits=True, mesh={}), open(sys.argv[1], 'w'))\n",
)


def test_a_compile_reports_progress_with_the_step_it_is_on(monkeypatch):
  """While the child compiles, a line at least every interval (30 s; here 1 s) naming the
  topology, the time elapsed and the step the child is compiling (a stand-in child that writes
  its status, then takes 2.6 s)."""
  monkeypatch.setattr(isolation, "WORKER", _SLOW_CHILD)
  monkeypatch.setattr(isolation, "PROGRESS_INTERVAL_SEC", 1.0)
  lines = []
  result = isolation.compile_for_topology_isolated(
    tiny_pretrain_config((4, 1, 1)), topo_lib.parse_topology("v5e:2x2"), progress=lines.append
  )
  assert result["fits"] and len(lines) >= 2, lines
  where = topo_lib.parse_topology("v5e:2x2").describe()
  assert lines[0] == f"compile for {where}: still running, 0m01s; at train seq128 (1 of 2)"
  assert lines[1].startswith(f"compile for {where}: still running, 0m02s")


def test_a_plan_reports_progress_meshes_compiles_and_eta(monkeypatch):
  """A plan's progress lines (interval 0.2 s here): meshes searched of N with an ETA once one
  is done, compiles done, the candidate compiling and for how long (a stand-in compiler that
  takes 0.5 s per candidate; every candidate fits at accumulation 1: one compile per mesh)."""

  def slow_compile(cfg, topo, phase, cache_dir, devices):
    time.sleep(0.5)
    step = dict(fits=True, memory=dict(total_bytes=1 << 30),
                estimate=dict(step_seconds=1e-3, tokens_per_second=1.0, mfu=0.5),
                compile_seconds=0.5, error=None)  # fmt: skip
    return dict(steps=[step], cached=False)

  monkeypatch.setattr(planner, "compile_cached", slow_compile)
  monkeypatch.setattr(planner, "topology_devices", lambda topo: None)
  monkeypatch.setattr(planner, "PROGRESS_INTERVAL_SEC", 0.2)
  lines = []
  planner.make_plan(
    tiny_pretrain_config(train_batch_size=32), topo_lib.parse_topology("v5e:2x2"), max_meshes=3,
    workers=1, isolate=False, log=lambda _: None, progress=lines.append,
  )  # fmt: skip
  assert len(lines) >= 5, lines
  assert all(line.startswith("plan for v5e:2x2") for line in lines)
  assert any("meshes 0 of 3 searched, 0 compiles done; compiling data=4 fsdp=1" in x for x in lines)
  later = [x for x in lines if "meshes 1 of 3 searched (eta " in x]
  assert any("1 compiles done; compiling data=2 fsdp=2 tensor=1 remat=False" in x for x in later)
