"""The attention kernel in compiles and plans for TPU topologies (bert_jax.compile, bert_jax.plan).

A tiny pre-training step with the splash kernel is compiled by the XLA TPU compiler (libtpu) for
v5e:2x2: the report names the kernel, its compiled module calls it as a Pallas custom call, and
the estimate's FLOPs include the kernel's attention FLOPs counted here by hand (4 x B x H x L^2
x K per layer forward, the backward 2.5 x that), which the compiler itself does not see (checked
against the same step on the reference path, where XLA counts them). A fused kernel asked for
with attention dropout is refused with the run's one-line error before anything compiles.
Skips only where libtpu cannot start (not installed: ``pip install '.[tpu]'``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, tiny_pretrain_config

from bert_jax.parallel import topology as topo_lib
from bert_jax.plan import attention, isolation, planner
from bert_jax.plan.compiler import check_config, compile_for_topology
from bert_jax.plan.report import format_report
from bert_jax.runs.rules import check_run_config

TOPOLOGY = "v5e:2x2"
BATCH, SEQ = 8, 128
REFUSAL = (
  "config.attention_kernel='splash' has no attention dropout but "
  "config.attention_probs_dropout_prob=0.1: set it to 0, or use 'reference' (or 'auto', which "
  "falls back to it)"
)


def _devices():
  try:
    return topo_lib.topology_devices(topo_lib.parse_topology(TOPOLOGY))
  except topo_lib.TopologyError as e:
    pytest.skip(f"libtpu cannot load on this host, so no TPU topology can be compiled: {e}")


def _config(kernel: str, dropout: float = 0.0, **overrides):
  return tiny_pretrain_config(
    (4, 1, 1),
    train_batch_size=BATCH,
    eval_batch_size=BATCH,
    max_seq_length=SEQ,
    attention_kernel=kernel,
    attention_probs_dropout_prob=dropout,
    **overrides,
  )


@pytest.fixture(scope="module")
def compiled():
  """{kernel: compile_for_topology result} for the splash and reference kernels, attention
  dropout 0 (the quick compiler effort: FLOPs are the same at any effort). The left-to-right
  objective: every layer computes every row on both paths (with masked-LM's few positions the
  reference path narrows the last layer's queries, splash does not), so the steps differ only
  in how attention is computed."""
  devices = _devices()
  topo = topo_lib.parse_topology(TOPOLOGY)
  out = {}
  with isolation.compiler_options(**planner.QUICK):
    for kernel in ("splash", "reference"):
      out[kernel] = compile_for_topology(
        _config(kernel, objective="ltr"), topo, with_eval=False, devices=devices
      )
  return out


def _by_hand_forward_flops_per_chip() -> float:
  """Attention's forward FLOPs of one train step per chip: 4 x B x H x L^2 x K per layer (the
  scores and the weighted sum, 2 FLOPs a multiply-add), every layer, the batch over 4 chips."""
  layers, hidden, heads = 2, 128, 2  # the tiny preset
  return 4 * BATCH * heads * SEQ * SEQ * (hidden // heads) * layers / 4


def test_a_splash_step_reports_its_kernel_and_counts_its_attention_flops(compiled):
  splash = compiled["splash"]
  step = splash["steps"][0]
  assert splash["attention_kernel"] == "splash"
  assert step["attention_kernel"] == "splash"
  # the compiled module calls the Pallas kernel
  assert attention.fused_calls(splash["reports"][0].compiled.as_text(), "splash", "tpu") > 0
  forward = _by_hand_forward_flops_per_chip()
  assert step["attention_flops"] == pytest.approx(forward * 3.5)  # forward + backward 2.5x
  assert step["estimate"]["attention_flops_per_chip"] == step["attention_flops"]
  assert step["estimate"]["compiler_flops_per_chip"] == step["flops"]
  # The compiler alone sees (almost) none of it: the reference step, where XLA computes the
  # same attention (forward + 2x backward), counts at least that much more than splash's own.
  reference = compiled["reference"]["steps"][0]
  assert reference["attention_kernel"] == "reference" and reference["attention_flops"] == 0
  seen_by_compiler = step["flops"] - step["attention_flops"]
  assert reference["flops"] - seen_by_compiler > 0.9 * 3 * forward
  # with the kernel's FLOPs the estimate's compute is no less than the reference's
  assert step["flops"] > reference["flops"]
  text = format_report(splash["reports"], topo_lib.parse_topology(TOPOLOGY))
  tflop = step["attention_flops"] / 1e12
  assert (
    f"  attention kernel: splash (a custom call the compiler counts no FLOPs in: {tflop:,.2f} "
    "TFLOP per chip per train step added from the model, backward 2.5x forward)"
  ) in text.splitlines()
  assert "  attention kernel: reference" in format_report(
    compiled["reference"]["reports"], topo_lib.parse_topology(TOPOLOGY)
  )


def test_a_fused_kernel_with_attention_dropout_is_refused_before_any_compile():
  """The paper's attention dropout (0.1, the default) with splash: the run's one-line error
  from the checks, from compile_for_topology before it touches a device, and from the plan."""
  topo = topo_lib.parse_topology(TOPOLOGY)
  config = _config("splash", 0.1)
  with pytest.raises(ValueError) as e:
    check_config(config, topo)
  assert str(e.value) == REFUSAL
  with pytest.raises(ValueError) as e:
    compile_for_topology(config, topo, devices=["not used: refused before"])
  assert str(e.value) == REFUSAL

  def no_compile(*a, **k):
    raise AssertionError("compiled")

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(planner, "compile_isolated", no_compile)
    mp.setattr(planner, "compile_cached", no_compile)
    with pytest.raises(ValueError) as e:
      planner.make_plan(config, topo, log=lambda _: None)
  assert str(e.value) == REFUSAL
  # the command line: one line, exit status 1, nothing compiled (no child started)
  out = subprocess.run(
    [sys.executable, "-m", "bert_jax.compile", "--config=configs/pretrain.py:tiny",
     f"--topology={TOPOLOGY}", "--config.attention_kernel=splash",
     "--config.attention_probs_dropout_prob=0.1"],
    cwd=REPO, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert out.returncode == 1, out.stderr
  assert out.stderr.strip().splitlines()[-1] == f"compile: error: {REFUSAL}"
  assert "compiling" not in out.stderr


def test_auto_with_dropout_0_plans_the_fused_kernel_beside_the_reference(monkeypatch):
  """``auto`` with attention dropout 0 on a TPU: each mesh is searched with splash and with the
  reference path; each row names its kernel and the best's flags select it."""
  topo = topo_lib.parse_topology(TOPOLOGY)
  config = _config("auto")
  assert attention.fused_choices(config, topo) == ["splash", "reference"]
  assert attention.fused_choices(_config("splash"), topo) == ["splash"]
  assert attention.fused_choices(_config("auto", 0.1), topo) == ["reference"]
  _devices()
  seen = []

  def fake_compile(cfg, topo, phase, cache_dir, command=None):
    kernel = attention.kernel_for(cfg, topo)
    seen.append((cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, kernel))
    seconds = 0.010 if kernel == "splash" else 0.012
    est = dict(step_seconds=seconds, tokens_per_second=1.0, mfu=0.5)
    step = dict(fits=True, memory={"total_bytes": 1.0}, estimate=est, compile_seconds=1.0, error="")
    return dict(steps=[step], fits=True, cached=False)

  monkeypatch.setattr(planner, "compile_isolated", fake_compile)
  plan = planner.make_plan(config, topo, max_meshes=2, cache_dir="", log=lambda _: None)
  assert plan["attention_kernels"] == ["splash", "reference"]
  assert sorted(seen) == sorted(
    (d, f, t, k) for d, f, t in [(4, 1, 1), (2, 2, 1)] for k in ("splash", "reference")
  )
  assert plan["best"]["attention_kernel"] == "splash"
  assert "--config.attention_kernel=splash" in planner.best_overrides(plan)
  rows = [line for line in planner.format_plan(plan).splitlines() if " yes " in line]
  assert len(rows) == 4
  assert sum(" splash " in r for r in rows) == 2 and sum(" reference " in r for r in rows) == 2


def test_an_unknown_kernel_is_one_of_the_config_checks():
  """``check_run_config`` (pretrain, finetune, compile, the launcher's pre-flight) names it with
  the other out-of-range keys, before any job is built."""
  config = _config("flash", learning_rate=-1.0)
  expected = (
    "invalid config: config.learning_rate=-1.0 (must be a positive number); "
    "config.attention_kernel='flash' (must be auto, reference, dot_product or splash)"
  )
  with pytest.raises(ValueError) as e:
    check_run_config(config)
  assert str(e.value) == expected
  with pytest.raises(ValueError) as e:
    check_config(config, topo_lib.parse_topology(TOPOLOGY))
  assert str(e.value) == expected
