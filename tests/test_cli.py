"""bert_jax.cli.run: a user error is one line ``prog: error: ...`` (status 2 usage, 1 other)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from bert_jax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PROG = textwrap.dedent(
  """
  from absl import app, flags
  from ml_collections import config_flags
  from bert_jax import cli

  class MyError(Exception):
    pass

  _CONFIG = config_flags.DEFINE_config_file("config", None, "config", lock_config=True)
  _RAISE = flags.DEFINE_string("raise_", "", "what main raises")

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    kind = _RAISE.value
    if kind == "missing":
      open("/nonexistent/dir/vocab.txt")
    if kind == "value":
      raise ValueError("dev.tsv line 3: 4 fields, expected 3\\n(second line)")
    if kind == "key":
      raise KeyError("data_dir")
    if kind == "mine":
      raise MyError("mine went wrong")
    if kind == "bug":
      raise RuntimeError("a bug")
    if kind == "usage":
      raise app.UsageError("--layers must be integers")
    print("lr", _CONFIG.value.lr)

  cli.run(main, prog="toy", user_errors=(MyError,))
  """
)

_CONFIG = textwrap.dedent(
  """
  import ml_collections

  def get_config(preset="small"):
    if preset not in ("small",):
      raise ValueError(f"unknown preset {preset!r}")
    config = ml_collections.ConfigDict()
    config.lr = 0.1
    config.optimizer = ml_collections.ConfigDict({"beta": 0.9})
    return config
  """
)


def _run(tmp_path, *args):
  (tmp_path / "prog.py").write_text(_PROG)
  (tmp_path / "conf.py").write_text(_CONFIG)
  proc = subprocess.run(
    [sys.executable, str(tmp_path / "prog.py"), f"--config={tmp_path / 'conf.py'}", *args],
    capture_output=True,
    text=True,
    cwd=ROOT,
    timeout=120,
  )
  return proc.returncode, proc.stdout, proc.stderr


def _one_error_line(stderr: str) -> str:
  assert "Traceback" not in stderr, stderr
  lines = [line for line in stderr.splitlines() if "error:" in line]
  assert len(lines) == 1, stderr
  assert lines[0].startswith("toy: error: ")
  return lines[0]


def test_runs(tmp_path):
  rc, out, err = _run(tmp_path, "--config.lr=0.5")
  assert rc == 0, err
  assert "lr 0.5" in out


@pytest.mark.parametrize(
  "args, expected",
  [
    (["--config.nosuch=1"], "unknown config key 'nosuch' (from --config.nosuch=1)"),
    (["--config.optimizer.nosuch=1"], "unknown config key 'optimizer.nosuch'"),
    (["--config.nosuch.deeper=1"], "unknown config key 'nosuch.deeper'"),
    (["--config.lr=abc"], "flag --config.lr=abc: could not convert string to float: 'abc'"),
    (["--nosuchflag"], "Unknown command line flag 'nosuchflag'"),
    (["extra"], "unexpected arguments: ['extra']"),
    (["--raise_=usage"], "--layers must be integers"),
  ],
)
def test_usage_errors_are_one_line_status_2(tmp_path, args, expected):
  rc, _, err = _run(tmp_path, *args)
  assert rc == 2, err
  assert expected in _one_error_line(err)


def test_config_file_errors_are_usage_errors(tmp_path):
  rc, _, err = _run(tmp_path, f"--config={tmp_path / 'conf.py'}:large")
  assert rc == 2
  assert "unknown preset 'large'" in _one_error_line(err)
  rc, _, err = _run(tmp_path, f"--config={tmp_path / 'missing.py'}")
  assert rc == 2
  line = _one_error_line(err)
  assert "missing.py" in line and "No such file" in line


@pytest.mark.parametrize(
  "kind, expected",
  [
    ("missing", "No such file or directory: /nonexistent/dir/vocab.txt"),
    ("value", "dev.tsv line 3: 4 fields, expected 3 (second line)"),
    ("key", "key 'data_dir' not found"),
    ("mine", "mine went wrong"),
  ],
)
def test_user_errors_in_main_are_one_line_status_1(tmp_path, kind, expected):
  rc, _, err = _run(tmp_path, f"--raise_={kind}")
  assert rc == 1, err
  assert _one_error_line(err) == f"toy: error: {expected}"


def test_verbose_errors_adds_the_traceback(tmp_path):
  rc, _, err = _run(tmp_path, "--raise_=value", "--verbose_errors")
  assert rc == 1
  assert "Traceback" in err and err.strip().splitlines()[-1].startswith("toy: error: dev.tsv")
  rc, _, err = _run(tmp_path, "--config.nosuch=1", "--verbose_errors")
  assert rc == 2
  assert "Traceback" in err and "toy: error: unknown config key" in err


def test_a_bug_keeps_its_traceback(tmp_path):
  rc, _, err = _run(tmp_path, "--raise_=bug")
  assert rc != 0
  assert "Traceback" in err and "RuntimeError: a bug" in err


def test_one_line_formats():
  assert cli.one_line(FileNotFoundError(2, "No such file or directory", "/x/v.txt")) == (
    "No such file or directory: /x/v.txt"
  )
  assert cli.one_line(ValueError("a\n  b")) == "a b"
  assert cli.one_line(KeyError("nosuch")) == "key 'nosuch' not found"
  assert cli.one_line(KeyError("unknown key 'x' in --set")) == "unknown key 'x' in --set"


def _entry(module, *args):
  proc = subprocess.run(
    [sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT, timeout=300
  )
  return proc.returncode, proc.stderr


def test_pretrain_unknown_config_key_is_one_line(tmp_path):
  rc, err = _entry(
    "bert_jax.pretrain",
    "--config=configs/pretrain.py:tiny",
    f"--workdir={tmp_path / 'w'}",
    "--config.nosuch_key=1",
  )
  assert rc == 2, err
  assert "Traceback" not in err
  assert err.strip().splitlines()[-1].startswith("pretrain: error: unknown config key 'nosuch_key'")
  assert not (tmp_path / "w").exists()


def test_finetune_unknown_config_key_is_one_line(tmp_path):
  rc, err = _entry(
    "bert_jax.finetune",
    "--config=configs/glue.py:rte",
    f"--workdir={tmp_path / 'w'}",
    "--config.optimizer.nosuch=1",
  )
  assert rc == 2, err
  assert "Traceback" not in err
  assert "finetune: error: unknown config key 'optimizer.nosuch'" in err.strip().splitlines()[-1]


def test_pretrain_workdir_that_is_a_file_is_one_line(tmp_path):
  workdir = tmp_path / "file"
  workdir.write_text("x")
  rc, err = _entry(
    "bert_jax.pretrain",
    "--config=configs/pretrain.py:tiny",
    f"--workdir={workdir}",
    "--config.synthetic_data=true",
  )
  assert rc == 1, err
  assert "Traceback" not in err
  last = err.strip().splitlines()[-1]
  assert last.startswith("pretrain: error: ") and str(workdir) in last
