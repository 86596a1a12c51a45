"""Two pre-training runs on one workdir: the second is refused while the first runs, naming the
first's host and pid, and the first's results (config.json, summary.json) are its own."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from bert_jax.interrupts import PREEMPTED_EXIT

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, shared_data):
  """A vocabulary and a one-layer BERT config (compilation is most of a tiny run's time)."""
  from bert_jax.tokenize.vocab import build_wordpiece_vocab

  out = tmp_path_factory.mktemp("tiny_model")
  text = str(shared_data / "pretrain" / "bert_sample_text.txt")
  build_wordpiece_vocab([text], str(out / "vocab.txt"), 600, do_lower_case=True)
  vocab_size = len((out / "vocab.txt").read_text().splitlines())
  (out / "bert_config.json").write_text(
    json.dumps(
      dict(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
      )
    )
  )
  return out


def _cmd(workdir, model, learning_rate):
  return [
    sys.executable,
    "-m",
    "bert_jax.pretrain",
    f"--config={REPO}/configs/pretrain.py:tiny",
    f"--workdir={workdir}",
    "--config.synthetic_data=True",
    f"--config.vocab_file={model / 'vocab.txt'}",
    f"--config.bert_config_file={model / 'bert_config.json'}",
    "--config.num_train_steps=1000000",  # runs until told to stop (SIGTERM)
    "--config.phase2.fraction=0",
    "--config.max_seq_length=32",
    "--config.max_predictions_per_seq=4",
    "--config.train_batch_size=4",
    "--config.eval_batch_size=4",
    "--config.num_warmup_steps=1",
    "--config.save_checkpoints_steps=5",
    "--config.eval_every_steps=0",
    "--config.logging.log_every_steps=1",
    f"--config.learning_rate={learning_rate}",
  ]


def test_second_run_on_a_running_workdir_is_refused(tmp_path, tiny_model, subprocess_env):
  workdir = tmp_path / "run"
  first = subprocess.Popen(
    _cmd(workdir, tiny_model, 1e-3),
    cwd=REPO,
    env=subprocess_env(1),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  lines = []
  try:
    for line in first.stdout:  # wait until it trains (it holds the lock from before its setup)
      lines.append(line)
      if "] step 2/" in line:
        break
    assert first.poll() is None, "".join(lines)[-3000:]
    second = subprocess.run(
      _cmd(workdir, tiny_model, 5e-3),
      cwd=REPO,
      env=subprocess_env(1),
      capture_output=True,
      text=True,
      timeout=600,
    )
    assert second.returncode != 0, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    last = second.stderr.strip().splitlines()[-1]
    assert last.startswith("pretrain: error: "), last
    assert f"host {socket.gethostname()}" in last and f"pid {first.pid}" in last, last
    assert first.poll() is None  # the first run is untouched and still training
    first.send_signal(signal.SIGTERM)  # it saves and stops
    lines += first.stdout.readlines()
    assert first.wait(timeout=600) == PREEMPTED_EXIT, "".join(lines)[-3000:]  # saved, stopped
  finally:
    if first.poll() is None:
      first.kill()
  config = json.loads((workdir / "config.json").read_text())
  assert config["learning_rate"] == pytest.approx(1e-3)
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["step"] >= 2
  assert not (workdir / ".lock").exists()  # released when the first run ended
