"""The TPU VM worker setup script (launch/targets/tpu.py), run here as a worker runs it.

The script the launcher writes and copies to every worker is executed with bash in a temporary
code directory. Its interpreters are real where it matters: the environment is made by this
machine's Python (>= 3.11) with ``python -m venv``, and its version is read back from the made
environment. What needs the network or an old image is stood in for: ``python3`` answers as the
TPU VM images' Python 3.10; ``uv`` makes its environment with this machine's Python (as uv does
with a Python it fetched); ``pip`` (first on PYTHONPATH) records its arguments and "installs" a
pinned requirement by writing its metadata into the environment.
"""

import importlib.metadata
import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

from launch.job import Job
from launch.targets import TpuTarget

REAL_PYTHON = os.path.realpath(sys.executable)
JAX_VERSION = importlib.metadata.version("jax")


def executable(path: pathlib.Path, text: str) -> str:
  path.write_text(textwrap.dedent(text))
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return str(path)


def setup_script() -> str:
  return TpuTarget(tpu_name="pod", zone="us-central2-b", project="proj-1").setup_script()


@pytest.fixture
def worker(tmp_path):
  """A worker: the code directory, a bin directory (the only PATH entry), the fake pip."""
  code = tmp_path / "bert_jax"
  code.mkdir()
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  os.symlink(shutil.which("rm"), bin_dir / "rm")
  log = tmp_path / "pip.jsonl"
  stub_log = tmp_path / "stubs.log"
  # python3: the Python 3.10 of the TPU VM images (tpu-ubuntu2204-base); its pip cannot
  # install anything (the case "and uv could not be installed").
  executable(
    bin_dir / "python3",
    f"""\
    #!/bin/bash
    echo "python3.10 $*" >> {stub_log}
    case "$1" in -c) echo 3.10 ;; *) exit 1 ;; esac
    """,
  )
  fake_pip = tmp_path / "fake_pip" / "pip"
  fake_pip.mkdir(parents=True)
  (fake_pip / "__init__.py").write_text("")
  (fake_pip / "__main__.py").write_text(
    textwrap.dedent(
      f"""\
      import json, os, re, sys, sysconfig
      with open({str(log)!r}, "a") as f:
        f.write(json.dumps({{"pip": sys.argv[1:], "python": sys.prefix}}) + "\\n")
      for arg in sys.argv[1:]:
        m = re.fullmatch(r"([\\w-]+)(\\[[\\w,]+\\])?==(.+)", arg)
        if m:
          info = os.path.join(sysconfig.get_paths()["purelib"], f"{{m[1]}}-{{m[3]}}.dist-info")
          os.makedirs(info, exist_ok=True)
          with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\\nName: {{m[1]}}\\nVersion: {{m[3]}}\\n")
      """
    )
  )
  script = code.parent / "bert_jax_setup.sh"
  script.write_text(setup_script())

  def run():
    env = {
      "PATH": str(bin_dir),
      "HOME": str(tmp_path / "home"),
      "PYTHONPATH": str(fake_pip.parent),
    }
    proc = subprocess.run(
      ["/bin/bash", str(script)], cwd=code, env=env, capture_output=True, text=True, timeout=240
    )
    pips = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    stubs = stub_log.read_text().splitlines() if stub_log.exists() else []
    log.unlink(missing_ok=True)
    stub_log.unlink(missing_ok=True)
    return proc, pips, stubs

  return code, bin_dir, run


def venv_python_version(code: pathlib.Path) -> tuple[int, int]:
  out = subprocess.run(
    [str(code / ".venv" / "bin" / "python"), "-c", "import sys; print(*sys.version_info[:2])"],
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  return tuple(int(x) for x in out.split())


def check_installed(code, proc, pips, stubs):
  assert proc.returncode == 0, proc.stderr
  assert not [s for s in stubs if s.startswith("python3.10 -m")]  # the image's Python unused
  assert len(pips) == 1
  # the code, editable, and exactly this machine's jax (the pre-flight's) with libtpu
  assert pips[0]["pip"] == ["install", "-q", "-e", ".", f"jax[tpu]=={JAX_VERSION}"]
  assert pips[0]["python"] == str(code / ".venv")  # run by the environment's own Python
  assert (3, 11) <= venv_python_version(code) < (3, 13)
  assert proc.stdout.splitlines()[-1].endswith(f"jax {JAX_VERSION})")


def test_setup_picks_a_supported_python_replaces_an_old_env_and_is_idempotent(worker):
  code, bin_dir, run = worker
  executable(bin_dir / "python3.11", f'#!/bin/bash\nexec {REAL_PYTHON} "$@"\n')
  # A leftover environment of the image's Python 3.10: replaced.
  (code / ".venv" / "bin").mkdir(parents=True)
  shutil.copy(bin_dir / "python3", code / ".venv" / "bin" / "python")
  proc, pips, stubs = run()
  check_installed(code, proc, pips, stubs)
  assert f"made {code}/.venv with {bin_dir}/python3.11" in proc.stdout
  made = (code / ".venv" / "pyvenv.cfg").stat().st_mtime_ns

  proc, pips, stubs = run()  # a second launch: the same environment, the install repeated
  check_installed(code, proc, pips, stubs)
  assert "reusing" in proc.stdout
  assert (code / ".venv" / "pyvenv.cfg").stat().st_mtime_ns == made


def test_setup_fetches_python_with_uv_when_the_image_has_only_3_10(worker):
  code, bin_dir, run = worker
  executable(
    bin_dir / "uv",
    f"""\
    #!/bin/bash
    echo "uv $*" >> {bin_dir.parent}/stubs.log
    [ "$1 $2 $3 $4 $5" = "venv -q --seed --python 3.11" ] || exit 2
    exec {REAL_PYTHON} -m venv "$6"
    """,
  )
  proc, pips, stubs = run()
  check_installed(code, proc, pips, stubs)
  assert f"uv venv -q --seed --python 3.11 {code}/.venv" in stubs
  assert f"made {code}/.venv with {bin_dir}/uv" in proc.stdout


def test_setup_refuses_when_no_supported_python_can_be_had(worker):
  code, _, run = worker
  proc, pips, stubs = run()
  assert proc.returncode == 1
  assert proc.stderr.splitlines() == [
    "bert_jax setup: error: no Python >=3.11,<3.13 here (python3 is 3.10) and uv could not be "
    "installed to fetch one"
  ]
  assert not (code / ".venv").exists()
  assert not pips
  # it tried to get uv with the image's pip (which failed here), nothing else
  assert [s for s in stubs if " -m " in s] == [
    "python3.10 -m pip install -q --user uv>=0.4",
    "python3.10 -m pip install -q --user --break-system-packages uv>=0.4",
  ]


def test_launch_ships_and_runs_the_setup_script(tmp_path):
  target = TpuTarget(tpu_name="pod", zone="us-central2-b", project="proj-1", ship="git",
                     repo_url="https://example.com/bert_jax.git")  # fmt: skip
  job = Job("pretrain", "configs/pretrain.py:tiny", "gs://b/run")
  files = target.files(job)
  assert files == {"/tmp/bert_jax_setup_pod.sh": setup_script()}
  cmds = target.commands(job)
  assert cmds[0][3:6] == ["tpu-vm", "scp", "/tmp/bert_jax_setup_pod.sh"]
  install = next(a for a in cmds[1] if a.startswith("--command="))
  assert install.endswith("&& cd $HOME/bert_jax && bash /tmp/bert_jax_setup_pod.sh")
  run = next(a for a in cmds[2] if a.startswith("--command="))
  assert 'export PATH="$PWD/.venv/bin:$PATH"' in run  # python3 is the environment's
  # A sweep's later runs (ship=none) and a custom install have no setup script.
  assert (
    TpuTarget(tpu_name="pod", zone="us-central2-b", project="proj-1", ship="none").files(job) == {}
  )
