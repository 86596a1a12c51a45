"""bert_jax.hugepages: entry points restart once with glibc's malloc on transparent huge pages.

The process test reads the kernel's own accounting (AnonHugePages in /proc/self/smaps_rollup)
after a large allocation in the restarted process; the rules are checked case by case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from bert_jax import hugepages

GLIBC = (2, 36)


def test_rules_for_restarting():
  add = hugepages.tunables_with_hugepages
  assert add({}, "madvise", GLIBC) == "glibc.malloc.hugetlb=1"
  assert add({"JAX_PLATFORMS": "cpu"}, "madvise", GLIBC) == "glibc.malloc.hugetlb=1"
  kept = add({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", GLIBC)
  assert kept == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
  # Nothing to do: the user chose a value, opted out, an accelerator, or THP/glibc can't help.
  assert add({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", GLIBC) is None
  assert add({"BERT_JAX_HUGEPAGES": "0"}, "madvise", GLIBC) is None
  assert add({"JAX_PLATFORMS": "tpu,cpu"}, "madvise", GLIBC) is None
  assert add({"JAX_PLATFORMS": "cuda"}, "madvise", GLIBC) is None
  assert add({}, "always", GLIBC) is None
  assert add({}, "never", GLIBC) is None
  assert add({}, None, GLIBC) is None
  assert add({}, "madvise", (2, 34)) is None
  assert add({}, "madvise", None) is None
  # An accelerator on the host (JAX_PLATFORMS unset, or even set to cpu): never.
  assert add({}, "madvise", GLIBC, accelerator="gpu") is None
  assert add({"JAX_PLATFORMS": "cpu"}, "madvise", GLIBC, accelerator="tpu") is None


def test_accelerators_are_read_from_the_host_devices(tmp_path):
  from bert_jax.accelerators import accelerator_on_host

  assert accelerator_on_host({}, str(tmp_path)) is None
  (tmp_path / "dev").mkdir()
  (tmp_path / "dev" / "nvidiactl").touch()
  assert accelerator_on_host({}, str(tmp_path)) == "gpu"
  (tmp_path / "dev" / "accel0").touch()
  assert accelerator_on_host({}, str(tmp_path)) == "tpu"
  assert accelerator_on_host({"TPU_ACCELERATOR_TYPE": "v5litepod-4"}, "/nonexistent") == "tpu"


def test_only_entry_point_commands_restart():
  py = "/usr/bin/python3"
  assert hugepages.is_entry_point_command([py, "-m", "bert_jax.pretrain", "--config", "c.py"])
  assert hugepages.is_entry_point_command([py, "-X", "faulthandler", "-m", "bert_jax.finetune"])
  assert hugepages.is_entry_point_command([py, "/venv/bin/bert-jax-pretrain", "--workdir=w"])
  assert not hugepages.is_entry_point_command([py, "-m", "pytest", "tests"])
  assert not hugepages.is_entry_point_command([py, "-c", "import bert_jax"])
  assert not hugepages.is_entry_point_command([py])
  assert hugepages.restart_command([py, "-m", "bert_jax.pretrain", "--a=1"], py) == (
    py,
    [py, "-m", "bert_jax.pretrain", "--a=1"],
  )
  assert hugepages.restart_command([py, "-c", "pass"], py) is None
  assert hugepages.restart_command([py], py) is None


def test_thp_mode_reads_the_bracketed_word(tmp_path):
  path = tmp_path / "enabled"
  path.write_text("always [madvise] never\n")
  assert hugepages.thp_mode(str(path)) == "madvise"
  assert hugepages.thp_mode(str(tmp_path / "missing")) is None


_CHILD = textwrap.dedent(
  """
  import ctypes, json, os, sys
  from bert_jax import hugepages
  print(json.dumps({"pid": os.getpid()}), flush=True)
  hugepages.restart_with_hugepages()
  libc = ctypes.CDLL(None)
  libc.malloc.restype = ctypes.c_void_p
  size = 256 * 2**20
  block = libc.malloc(size)  # glibc's malloc itself (numpy would advise huge pages on its own)
  ctypes.memset(block, 1, size)
  with open("/proc/self/smaps_rollup") as f:
    huge_kb = [int(l.split()[1]) for l in f if l.startswith("AnonHugePages:")]
  print(json.dumps({
    "pid_after": os.getpid(),
    "tunables": os.environ.get("GLIBC_TUNABLES"),
    "args": sys.argv[1:],
    "huge_kb": huge_kb[0] if huge_kb else None,
  }))
  """
)


def _run_child(tmp_path, env_extra) -> dict:
  script = tmp_path / "child.py"
  script.write_text(_CHILD)
  # A CPU host: no TPU_ACCELERATOR_TYPE (a compile for a TPU topology earlier in this process
  # sets it for libtpu).
  dropped = ("GLIBC_TUNABLES", hugepages.OPT_OUT, "TPU_ACCELERATOR_TYPE")
  env = {k: v for k, v in os.environ.items() if k not in dropped}
  env.update(env_extra)
  env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
  done = subprocess.run(
    [sys.executable, str(script), "--flag=1"],
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  )
  out = done.stdout
  lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
  starts = [line["pid"] for line in lines if "pid" in line]  # the script ran once per start
  return {"starts": starts, "stderr": done.stderr, **lines[-1]}


def test_a_restarted_process_gets_huge_pages(tmp_path):
  got = _run_child(tmp_path, {"JAX_PLATFORMS": "cpu"})
  assert set(got["starts"]) == {got["pid_after"]}  # the same process, re-executed
  assert got["args"] == ["--flag=1"]
  glibc = hugepages.glibc_version() or (0,)
  if hugepages.thp_mode() == "madvise" and glibc >= hugepages.MIN_GLIBC:
    assert got["tunables"] == "glibc.malloc.hugetlb=1"
    assert len(got["starts"]) == 2  # restarted once, not again
    assert got["stderr"].count("bert_jax: restarting with GLIBC_TUNABLES=") == 1
    assert got["huge_kb"] >= 128 * 1024, got  # the kernel's count of huge pages in use
  else:  # the kernel or the libc cannot help: the process runs on as it was started
    assert got["tunables"] is None and len(got["starts"]) == 1


def test_opting_out_keeps_the_process_as_started(tmp_path):
  got = _run_child(tmp_path, {hugepages.OPT_OUT: "0"})
  assert got["tunables"] is None and len(got["starts"]) == 1
  if hugepages.thp_mode() == "madvise":  # nothing advised the block: no huge pages
    assert got["huge_kb"] == 0, got
