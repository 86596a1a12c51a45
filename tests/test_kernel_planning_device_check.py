"""benchmarks/device/check.py's smoke run on a CPU (``--quick``, marked slow): every section
runs at tiny sizes, the numerics pass, and the JSON has what the table prints.

The fused kernel checked on a CPU is ``dot_product`` (XLA's); the packed rows are checked
against each sequence alone, so a kernel that ignored ``sequence_ids`` would fail here too
(checked below by breaking the packing mask on purpose).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

from benchmarks.device import check as device_check


@pytest.mark.slow  # a minute or more of CPU: two JAX start-ups, torch, a dozen tiny compiles
def test_the_quick_run_checks_each_kernel_and_times_each_variant(tmp_path):
  out = tmp_path / "check.json"
  proc = subprocess.run(
    [sys.executable, "-m", "benchmarks.device.check", "--quick", f"--output={out}"],
    cwd=REPO, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["quick"] and result["device"].endswith("(cpu)")
  checked = {(r["kernel"], r["dtype"], r["packed"]) for r in result["numerics"]}
  assert checked >= {
    ("dot_product", "float32", False),
    ("dot_product", "float32", True),
    ("dot_product", "bfloat16", True),
  }
  assert all(r["ok"] for r in result["numerics"]), [r for r in result["numerics"] if not r["ok"]]
  packed = [r for r in result["numerics"] if r["packed"] and r["kernel"] == "dot_product"]
  assert all(r["packed_vs_alone_rel_err"] <= r["tolerance"]["output"] for r in packed)
  variants = {r["variant"] for r in result["speed"]}
  assert variants >= {"dot_product", "reference", "dot_product_packed", "reference_dropout0.1"}
  assert "torch_sdpa" in variants
  for r in result["speed"]:  # each row timed, or says why not
    assert "tokens_per_second" in r or r["note"], r
  timed = [r for r in result["speed"] if "tokens_per_second" in r]
  assert timed, result["speed"]
  for r in timed:
    assert r["tokens_per_second"] == pytest.approx(r["real_tokens_per_step"] / r["step_ms"] * 1e3)
  assert "numerics (vs reference):" in proc.stdout and "goals:" in proc.stdout


def test_the_packed_check_fails_a_kernel_that_ignores_the_packing_mask():
  """Outputs computed as if the packing mask were ignored (every token of a row attending to
  every other: the packed batch without ``sequence_ids``) fail the check against each sequence
  alone, while the real packed computation passes it."""
  batch = device_check._numerics_batch(2, 128, packed=True)
  alone, spans = device_check._alone(batch)
  assert len(spans) >= 3 and all(b - a >= 8 for _, a, b, _ in spans)
  real = batch["input_mask_BxL"] > 0
  alone_out = device_check.encoder_run("tiny", "reference", "float32", alone)[0]
  masked = device_check.encoder_run("tiny", "dot_product", "float32", batch)[0]
  ignoring = dict(batch)
  del ignoring["sequence_ids_BxL"]
  unmasked = device_check.encoder_run("tiny", "dot_product", "float32", ignoring)[0]
  row = lambda out: device_check._numerics_row(
    "dot_product", "float32", True, out, real, None, None, (alone_out, spans), False
  )
  good, bad = row(masked), row(unmasked)
  assert good["ok"] and good["packed_vs_alone_rel_err"] < 1e-4
  assert not bad["ok"] and bad["packed_vs_alone_rel_err"] > 10 * bad["tolerance"]["output"]
