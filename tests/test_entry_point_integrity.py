"""Entry points refuse early and say what they chose: an empty corpus is an error before anything
is written, a dry run refuses what the entry point would refuse, attention_kernel=auto names the
kernel it resolved to, and docs/export.md says what its loading snippet needs installed."""

from __future__ import annotations

import configparser
import io
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import REPO, subprocess_env_for

from launch.job import Job, LaunchError
from launch.launch import launch
from launch.targets.slurm import SlurmTarget


def test_create_pretraining_data_refuses_an_empty_input_before_writing(tmp_path):
  (tmp_path / "empty.txt").write_text("\n  \n")
  (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\n")
  out = tmp_path / "out"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.create_pretraining_data",
      f"--input_file={tmp_path}/empty.txt",
      f"--output_dir={out}",
      f"--vocab_file={tmp_path}/vocab.txt",
      "--num_workers=1",
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=subprocess_env_for(1),
    timeout=300,
  )
  errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
  assert proc.returncode == 1 and errors == [
    f"create_pretraining_data: error: {tmp_path}/empty.txt: the input file is empty (no text "
    "to make examples from)"
  ], proc.stderr[-3000:]
  assert not out.exists()  # nothing written


def _slurm():
  return SlurmTarget(partition="gpu", nodes=1, gpus_per_node=8, remote_dir=str(REPO))


@pytest.mark.parametrize(
  ("module", "config", "args", "refusal"),
  [
    (
      "finetune",
      "configs/squad.py",
      ("--config.packing.enabled=True",),
      "config.packing.enabled=True: task 'squad_v1' cannot be packed",
    ),
    (
      "pretrain",
      "configs/pretrain.py:tiny",
      ("--config.attention_kernel=dot_product",),
      "config.attention_kernel='dot_product' has no attention dropout but "
      "config.attention_probs_dropout_prob=0.1",
    ),
  ],
)
def test_a_dry_run_refuses_what_the_entry_point_refuses(tmp_path, module, config, args, refusal):
  job = Job(module, config, str(tmp_path / "run"), extra_args=args, python="python3")
  out = io.StringIO()
  with pytest.raises(LaunchError, match=re.escape(refusal)):
    launch(job, _slurm(), dry_run=True, out=out)
  assert out.getvalue() == "" and not (tmp_path / "run").exists()
  # The same config without the refused setting passes and is printed.
  ok = Job(module, config, str(tmp_path / "run"), python="python3")
  assert launch(ok, _slurm(), dry_run=True, out=out) == 0
  assert "sbatch" in out.getvalue() and not (tmp_path / "run").exists()


def test_a_dry_run_on_gpu_hosts_checks_on_their_topology(tmp_path):
  target = SlurmTarget(partition="gpu", gpus_per_node=8, gpu_type="h100", remote_dir=str(REPO))
  job = Job(
    "finetune",
    "configs/squad.py",
    str(tmp_path / "run"),
    extra_args=("--config.packing.enabled=True",),
    python="python3",
  )
  with pytest.raises(LaunchError, match="cannot be packed"):
    launch(job, target, dry_run=True, out=io.StringIO())


@pytest.mark.parametrize(
  ("platform", "dropout", "length", "kernel", "why"),
  [
    ("cpu", 0.0, 128, "reference", "CPU devices"),
    ("gpu", 0.0, 128, "dot_product", "GPU"),
    ("tpu", 0.0, 512, "splash", "config.max_seq_length=512 a multiple of 128"),
    ("tpu", 0.0, 200, "dot_product", "config.max_seq_length=200 is not a multiple of 128"),
    ("tpu", 0.1, 512, "reference", "config.attention_probs_dropout_prob=0.1"),
  ],
)
def test_auto_attention_kernel_logs_its_choice(monkeypatch, platform, dropout, length, kernel, why):
  from bert_jax.model.kernels import attention

  calls = []
  monkeypatch.setattr(attention.logging, "info", lambda fmt, *args: calls.append(fmt % args))
  got = attention.resolve_attention_kernel(
    "auto", attention_dropout=dropout, platform=platform, max_seq_length=length
  )
  assert got == kernel
  assert len(calls) == 1  # one line per resolution (a run resolves once per phase)
  assert calls[0].startswith(f"config.attention_kernel='auto' resolved to {kernel!r}: ")
  assert why in calls[0]
  explicit = attention.resolve_attention_kernel(
    "reference", attention_dropout=dropout, platform=platform, max_seq_length=length
  )
  assert explicit == "reference" and len(calls) == 1  # an explicit kernel: nothing to say


def test_docs_export_names_what_its_loading_snippet_needs():
  """The README's install has neither transformers nor torch: the page says to install the
  ``hf`` extra, and setup.cfg's ``hf`` extra holds both."""
  doc = (REPO / "docs" / "export.md").read_text()
  assert "pip install -e '.[hf]'" in doc or "pip install 'bert-jax[hf]'" in doc
  cfg = configparser.ConfigParser()
  cfg.read(REPO / "setup.cfg")
  hf = cfg["options.extras_require"]["hf"]
  names = {re.split(r"[<>=!~ \[]", line.strip())[0] for line in hf.splitlines() if line.strip()}
  assert {"transformers", "torch"} <= names


def test_progress_logs_while_one_slow_batch_runs():
  """An evaluation whose first batch compiles the step for longer than the interval: lines keep
  coming while it runs (at most one interval apart), naming the batch still running."""
  from bert_jax.train.progress import MIN_BEAT_SEC, Progress

  lines, stamps = [], []

  def log(line):
    lines.append(line)
    stamps.append(time.monotonic())

  t0 = time.monotonic()
  with Progress("evaluating dev", total=4, interval_sec=MIN_BEAT_SEC, log=log) as progress:
    time.sleep(3.4 * MIN_BEAT_SEC)  # batch 1: compiling
    progress.update()
  beats = [line for line in lines if line.endswith("; batch 1 still running")]
  assert len(beats) >= 2, lines
  assert beats[0].startswith("evaluating dev: 0/4 batches (0%), 0.00 batches/s, elapsed 0m0")
  gaps = [b - a for a, b in zip([t0, *stamps], stamps)]
  assert max(gaps) < 2.5 * MIN_BEAT_SEC, gaps  # never silent much past the interval
  assert lines[-1].startswith("evaluating dev: 1/4 batches (25%)") and lines[-1].endswith("(done)")


def test_a_slow_evaluation_in_the_training_loop_logs_while_it_runs(monkeypatch, caplog):
  """The held-out evaluation (and its first compile) runs under a heartbeat: a line at least
  every interval while eval_fn runs."""
  import dataclasses
  import functools

  import jax
  import jax.numpy as jnp
  from test_train_loop import _Manager as Manager
  from test_train_loop import _Writer as Writer

  from bert_jax import parallel
  from bert_jax.train import loop
  from bert_jax.train.job import Phase
  from bert_jax.train.progress import Heartbeat
  from configs.common import logical_axis_rules

  def inputs():
    while True:
      yield {"input_ids": np.ones((8, 4), np.int32)}

  @jax.tree_util.register_dataclass
  @dataclasses.dataclass
  class State:
    step: jax.Array

  def eval_fn(state):
    time.sleep(1.0)
    return {"accuracy": 0.5}

  monkeypatch.setattr(loop, "Heartbeat", functools.partial(Heartbeat, interval_sec=0.3))
  caplog.set_level("INFO")
  step = jax.jit(lambda s, b: (State(s.step + 1), {"loss": jnp.sum(b["input_ids"]) * 0.0}))
  mesh = parallel.create_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  options = loop.LoopOptions(save_every_steps=100, eval_every_steps=2, eval_fn=eval_fn)
  loop.train_loop(
    State(jnp.zeros((), jnp.int32)),
    [Phase("finetune", 2, 8, 4, {}, make_input=inputs)],
    [step],
    Manager(),
    options,
    Writer(),
    mesh,
    parallel.normalize_rules(logical_axis_rules()),
  )
  beats = [
    r.getMessage() for r in caplog.records if "evaluating at step 2: still" in r.getMessage()
  ]
  assert len(beats) >= 2, [r.getMessage() for r in caplog.records]
