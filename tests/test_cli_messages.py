"""What the command line tells a user: no libtpu report on a host without a TPU, a mistyped
config key as one clean line with the key it meant, ``--config_keys``, and the tensorflow-text
release to install."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys

import pytest

from bert_jax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What libtpu prints when JAX probes it on a host without a TPU.
LIBTPU_REPORT = ("Failed to find host bounds", "E0000", "INVALID_ARGUMENT", "Source Location Trace")


def _entry(module, *args, env=None):
  proc = subprocess.run(
    [sys.executable, "-m", module, *args],
    capture_output=True,
    text=True,
    cwd=ROOT,
    timeout=300,
    env=env,
  )
  return proc.returncode, proc.stdout, proc.stderr


# --- libtpu on a host without a TPU ----------------------------------------------------------
def test_no_libtpu_report_on_a_host_without_accelerators(tmp_path):
  """An entry point that starts JAX's devices (the fine-tuning trainer builds its mesh, then the
  missing vocabulary stops it) prints no libtpu report, only its own error line."""
  if importlib.util.find_spec("libtpu") is None:
    pytest.skip("libtpu is not installed: JAX has no TPU plugin to probe")
  if cli.platforms_for_host({}) is None:
    pytest.skip("this host has an accelerator: JAX is left to choose")
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  rc, _, err = _entry(
    "bert_jax.finetune",
    "--config=configs/glue.py:rte",
    f"--workdir={tmp_path / 'w'}",
    f"--config.vocab_file={tmp_path / 'no_vocab.txt'}",
    env=env,
  )
  assert rc == 1, err
  assert "Mesh {" in err  # JAX's backends did start
  assert not [marker for marker in LIBTPU_REPORT if marker in err], err
  assert err.strip().splitlines()[-1].startswith("finetune: error: ")


def _tree(tmp_path, *files):
  for name, text in files:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
  return str(tmp_path)


def test_platforms_only_where_no_accelerator_is_seen(tmp_path):
  """JAX_PLATFORMS=cpu only where libtpu is installed and the host shows no TPU or GPU; a TPU
  VM, a GPU host or the user's own choice leave JAX to choose."""
  choose = cli.platforms_for_host
  bare = _tree(tmp_path / "bare", ("dev/null", ""), ("sys/bus/pci/devices/0000:00:04.0/vendor", ""))
  assert choose({}, bare, libtpu_installed=True) == "cpu"
  assert choose({"JAX_PLATFORMS": ""}, bare, libtpu_installed=True) == "cpu"
  assert choose({}, bare, libtpu_installed=False) is None
  for env in (
    {"JAX_PLATFORMS": "tpu"},
    {"JAX_FORCE_TPU_INIT": "1"},
    {"TPU_ACCELERATOR_TYPE": "v5e-8"},
  ):
    assert choose(env, bare, libtpu_installed=True) is None
  gvnic = _tree(  # Google's network card (vendor 0x1ae0, device 0x0042) is not a TPU
    tmp_path / "gvnic",
    ("sys/bus/pci/devices/0000:00:04.0/vendor", "0x1ae0\n"),
    ("sys/bus/pci/devices/0000:00:04.0/device", "0x0042\n"),
  )
  assert choose({}, gvnic, libtpu_installed=True) == "cpu"
  tpu_vms = [
    _tree(tmp_path / "v4", ("dev/accel0", "")),
    _tree(tmp_path / "v5e", ("dev/vfio/0", "")),
    _tree(
      tmp_path / "v6e_pci",
      ("sys/bus/pci/devices/0000:00:05.0/vendor", "0x1ae0\n"),
      ("sys/bus/pci/devices/0000:00:05.0/device", "0x006f\n"),
    ),
  ]
  gpu_hosts = [_tree(tmp_path / name, (f"dev/{name}", "")) for name in ("nvidia0", "dxg", "kfd")]
  for root in tpu_vms + gpu_hosts:
    assert choose({}, root, libtpu_installed=True) is None, root


# --- config keys ------------------------------------------------------------------------------
def test_mistyped_config_key_is_one_clean_line(tmp_path):
  rc, _, err = _entry(
    "bert_jax.finetune",
    "--config=configs/glue.py:rte",
    f"--workdir={tmp_path / 'w'}",
    "--config.lerning_rate=1e-5",
  )
  assert rc == 2, err
  assert err.strip().splitlines()[-1] == (
    "finetune: error: unknown config key 'lerning_rate' (from --config.lerning_rate=1e-5): "
    "did you mean 'learning_rate'? (--config_keys lists them)"
  )
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
  "arg, meant",
  [
    ("--config.optimizer.schedul=x", "optimizer.schedule"),
    ("--config.optimzer.b1=1", "optimizer.b1"),
  ],
)
def test_mistyped_nested_key_names_the_whole_path(tmp_path, arg, meant):
  rc, _, err = _entry(
    "bert_jax.pretrain", "--config=configs/pretrain.py:tiny", f"--workdir={tmp_path}/w", arg
  )
  assert rc == 2, err
  key = arg[len("--config.") :].partition("=")[0]
  assert err.strip().splitlines()[-1] == (
    f"pretrain: error: unknown config key {key!r} (from {arg}): did you mean {meant!r}? "
    "(--config_keys lists them)"
  )


def _config(module, arg):
  """The config a config file's get_config builds, flattened to {dotted key: value}."""
  sys.path.insert(0, ROOT)
  try:
    config = importlib.import_module(f"configs.{module}").get_config(arg)
  finally:
    sys.path.remove(ROOT)
  flat = {}

  def walk(d, prefix):
    for k, v in d.items():
      if isinstance(v, dict) and v:
        walk(v, f"{prefix}{k}.")
      else:
        flat[f"{prefix}{k}"] = v

  walk(config.to_dict(), "")
  return flat


@pytest.mark.parametrize(
  "module, config",
  [
    ("bert_jax.finetune", "glue:rte"),
    ("bert_jax.pretrain", "pretrain:tiny"),
    ("bert_jax.probe", "probe:cola_source"),
    ("bert_jax.compile", "pretrain:base"),
  ],
)
def test_config_keys_lists_every_key_with_its_value(module, config):
  """``--config_keys`` (no --workdir or --topology needed) prints each key of the config file's
  config with its value, overrides applied, and exits 0."""
  import ast

  name, arg = config.split(":")
  rc, out, err = _entry(
    module, f"--config=configs/{name}.py:{arg}", "--config_keys", "--config.seed=7"
  )
  assert rc == 0, err
  head, *lines = out.strip().splitlines()
  want = _config(name, arg)
  want["seed"] = 7
  assert head == (
    f"--config=configs/{name}.py:{arg}: {len(want)} keys; override with --config.<key>=<value>"
  )
  got = {}
  for line in lines:
    key, sep, value = line.strip().partition(" = ")
    assert sep, line
    got[key] = None if value.startswith("None (") else ast.literal_eval(value)
  normal = lambda v: [normal(x) for x in v] if isinstance(v, (list, tuple)) else v
  assert {k: normal(v) for k, v in got.items()} == {k: normal(v) for k, v in want.items()}


def test_config_keys_without_a_config_is_one_line():
  rc, _, err = _entry("bert_jax.finetune", "--config_keys")
  assert rc == 2
  assert err.strip().splitlines()[-1] == (
    "finetune: error: --config_keys lists the keys of --config: give --config=<file> "
    "(--helpshort lists the flags)"
  )


def test_helpshort_lists_config_keys():
  _, out, err = _entry("bert_jax.pretrain", "--helpshort")  # absl's help exits with status 1
  assert "--[no]config_keys: Print every key of the config" in out, out + err


# --- tensorflow-text ------------------------------------------------------------------------
def _installed_tf_version() -> str | None:
  for name in ("tensorflow", "tensorflow-cpu"):
    try:
      return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return None


def test_tf_text_hint_names_the_release_matching_tensorflow(minilm_dir, caplog):
  if importlib.util.find_spec("tensorflow_text") is not None:
    pytest.skip("tensorflow-text is installed: no hint to give")
  version = _installed_tf_version()
  if version is None:
    pytest.skip("TensorFlow is not installed")
  from bert_jax.tokenize import WordPieceTokenizer, load_tokenizer

  major, minor = version.split(".")[:2]
  with caplog.at_level("INFO"):
    tok = load_tokenizer(minilm_dir, backend="fast")
  assert type(tok) is WordPieceTokenizer
  assert f"pip install --no-deps 'tensorflow-text=={major}.{minor}.*'" in caplog.text
  assert "<its version>" not in caplog.text
