"""The launcher's pre-flight for a remote target whose devices' platform it does not know: a
fused kernel is checked as the run resolves it, on a platform the kernel table says it runs on,
at each phase's length."""

import dataclasses
import re

import pytest

from launch.job import Job, LaunchError, resolve_config
from launch.preflight import check_job_config

CONFIG = "configs/pretrain.py:tiny"


@dataclasses.dataclass
class RemoteTarget:
  """A target on other machines that names no topology (its platform is unknown here)."""

  on_this_machine: bool = False

  def topology_name(self):
    return None


def _check(**overrides):
  job = Job("pretrain", CONFIG, "gs://bucket/runs/tiny", overrides=tuple(overrides.items()))
  check_job_config(job, resolve_config(job), RemoteTarget())


def _refused(message: str):
  return pytest.raises(
    LaunchError,
    match="^" + re.escape(f"invalid config (the entry point would refuse it): {message}") + "$",
  )


def test_a_fused_kernel_without_attention_dropout_passes():
  _check(**{"attention_kernel": "splash", "attention_probs_dropout_prob": 0.0})
  _check(**{"attention_kernel": "dot_product", "attention_probs_dropout_prob": 0.0})


@pytest.mark.parametrize("kernel", ["splash", "dot_product"])
def test_a_fused_kernel_with_attention_dropout_is_refused(kernel):
  with _refused(
    f"config.attention_kernel={kernel!r} has no attention dropout but "
    "config.attention_probs_dropout_prob=0.1: set it to 0, or use 'reference' (or 'auto', which "
    "falls back to it)"
  ):
    _check(**{"attention_kernel": kernel, "attention_probs_dropout_prob": 0.1})


def test_splash_checks_the_length_of_each_phase_that_runs():
  splash = {"attention_kernel": "splash", "attention_probs_dropout_prob": 0.0}
  with _refused(
    "config.attention_kernel='splash' needs config.phase2.max_seq_length a multiple of 128, got 200"
  ):
    _check(**splash, **{"phase2.max_seq_length": 200})
  _check(**splash, **{"phase2.max_seq_length": 200, "phase2.fraction": 0.0})  # no phase 2
  # a length dot_product takes (no block)
  _check(**{**splash, "attention_kernel": "dot_product"}, **{"phase2.max_seq_length": 200})
