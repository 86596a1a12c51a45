"""benchmarks/common: the flags (argparse read as absl reads the same flags), the child-process
runner (against what the child really printed and exited with) and the Timer (against the calls
it made); and every benchmark importable as ``benchmarks.<group>.<name>``."""

from __future__ import annotations

import importlib
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import pytest
from absl import flags as absl_flags
from conftest import REPO

from benchmarks.common import flags
from benchmarks.common.process import ChildFailed, run
from benchmarks.common.timing import Timer


def _absl(argv: list[str]) -> dict:
  fv = absl_flags.FlagValues()
  absl_flags.DEFINE_list("sizes", ["tiny", "mini"], "", flag_values=fv)
  absl_flags.DEFINE_bool("torch", True, "", flag_values=fv)
  absl_flags.DEFINE_bool("quick", False, "", flag_values=fv)
  fv(["prog", *argv])
  return {"sizes": fv.sizes, "torch": fv.torch, "quick": fv.quick}


def _ours(argv: list[str]) -> dict:
  p = flags.parser(None)
  flags.add_list(p, "sizes", ["tiny", "mini"], "")
  flags.add_bool(p, "torch", True, "")
  flags.add_bool(p, "quick", False, "")
  return vars(p.parse_args(argv))


@pytest.mark.parametrize(
  "argv",
  [
    [],
    ["--sizes=base"],
    ["--sizes", "tiny,base,large"],
    ["--notorch", "--quick"],
    ["--torch=false", "--quick=true"],
    ["--torch=0", "--sizes="],
  ],
)
def test_flags_read_lists_and_booleans_as_absl_does(argv):
  assert _ours(argv) == _absl(argv)


def test_run_keeps_stdout_and_stderr_apart_and_reports_status(tmp_path):
  code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
  done = run([sys.executable, "-c", code], check=False)
  assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
  with pytest.raises(ChildFailed, match=r"failed \(status 3\); err"):
    run([sys.executable, "-c", code])


def test_run_writes_the_log_and_puts_the_repository_on_the_path(tmp_path):
  log = tmp_path / "child.log"
  code = "import benchmarks, sys; print(benchmarks.__file__); print('e', file=sys.stderr)"
  done = run([sys.executable, "-c", code], log=log, cwd=tmp_path)
  assert done.returncode == 0 and done.stdout == ""
  lines = log.read_text().splitlines()
  assert pathlib.Path(lines[0]).parent.parent == pathlib.Path(REPO) and lines[1] == "e"
  run([sys.executable, "-c", "print('again')"], log=log, append=True)
  assert log.read_text().splitlines()[-1] == "again"


def test_run_streams_lines_and_stops_a_child_at_its_time_limit():
  seen = []
  code = "import time\nfor i in range(3): print(i, flush=True)\ntime.sleep(30)"
  with pytest.raises(subprocess.TimeoutExpired):
    run([sys.executable, "-c", code], on_line=lambda line, proc: seen.append(line), timeout_s=3)
  assert seen == ["0\n", "1\n", "2\n"]


def test_timer_makes_the_calls_it_reports():
  calls = []

  def f(i):
    calls.append(i)
    return jnp.ones(4) * i

  timing = Timer(warmup=2, repeats=3, calls=4).time(f)
  assert calls == [-2, -1] + [0, 1, 2, 3] * 3
  assert len(timing.warmup) == 2 and len(timing.times) == len(timing.cpu_times) == 3
  assert min(timing.times) == timing.best <= timing.median <= max(timing.times)


BENCHMARKS = sorted(
  ".".join(p.relative_to(REPO).with_suffix("").parts)
  for p in pathlib.Path(REPO, "benchmarks").glob("*/*.py")
  if p.name != "__init__.py" and p.parent.name != "results"
)


def test_every_benchmark_imports_as_a_module_of_its_group():
  assert len(BENCHMARKS) >= 25 and "benchmarks.speed.pretrain" in BENCHMARKS
  for name in BENCHMARKS:
    importlib.import_module(name)
