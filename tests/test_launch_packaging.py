"""Packaging: what `pip install` puts into site-packages, and the launcher installed there.

The wheel is built from a copy of the checkout (nothing is written into the checkout) and
unpacked into a folder that stands in for site-packages. It must hold ``bert_jax`` and the
launcher as ``bert_jax_launch`` and no generic top-level ``launch`` or ``configs`` package
(they would collide with other projects' packages of those names); the installed launcher must
load a config from the checkout by path, siblings (``from configs import common``) included,
with the current directory outside the checkout.
"""

import configparser
import pathlib
import shutil
import subprocess
import sys
import zipfile

import setuptools

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_setup_cfg_lists_every_package_folder():
  """A package_dir mapping rules out `packages = find:`, so the list is checked here."""
  cfg = configparser.ConfigParser()
  cfg.read(REPO / "setup.cfg")
  listed = set(cfg["options"]["packages"].split())
  found = set(setuptools.find_packages(str(REPO), include=["bert_jax", "bert_jax.*"]))
  found |= {"bert_jax_launch"} | {
    f"bert_jax_launch.{p}" for p in setuptools.find_packages(str(REPO / "launch"))
  }
  assert listed == found
  assert cfg["options"]["package_dir"].split() == ["bert_jax_launch", "=", "launch"]


def test_wheel_installs_no_generic_top_level_package_and_its_launcher_runs(tmp_path):
  src = tmp_path / "src"
  src.mkdir()
  for name in ("bert_jax", "launch"):
    shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
  for name in ("setup.cfg", "pyproject.toml", "README.md"):
    shutil.copy(REPO / name, src / name)
  wheels = tmp_path / "wheels"
  build = subprocess.run(
    [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    + ["-w", str(wheels), str(src)],
    capture_output=True,
    text=True,
  )
  assert build.returncode == 0, build.stdout + build.stderr
  (wheel,) = wheels.glob("bert_jax-*.whl")
  site = tmp_path / "site"
  with zipfile.ZipFile(wheel) as z:
    z.extractall(site)
    entry_points = next(n for n in z.namelist() if n.endswith("entry_points.txt"))
    scripts = z.read(entry_points).decode()
  top_level = {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")}
  assert top_level == {"bert_jax", "bert_jax_launch"}
  assert (site / "bert_jax_launch" / "targets" / "local.py").is_file()
  assert "bert-jax-launch = bert_jax_launch.__main__:run" in scripts

  # The installed launcher, run from outside the checkout: a dry run loads configs/glue.py
  # (which imports configs.common) by path and prints the command it would start.
  workdir = tmp_path / "rte"
  run = subprocess.run(
    [sys.executable, "-c", "from bert_jax_launch.__main__ import run; run()", "run"]
    + ["--job=finetune", f"--config={REPO / 'configs' / 'glue.py'}:rte"]
    + [f"--workdir={workdir}", "--dry_run", "--", "--config.seed=7"],
    cwd=tmp_path,
    env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    capture_output=True,
    text=True,
  )
  assert run.returncode == 0, run.stdout + run.stderr
  assert "-m bert_jax.finetune" in run.stdout and "--config.seed=7" in run.stdout
