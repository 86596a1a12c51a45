"""The pre-training entry point end to end, in subprocesses: kill (SIGTERM, Ctrl-C, and SIGKILL between
checkpoints) and restart gives exactly the uninterrupted loss trajectory across the 128 -> 512
phase change; the result loads for fine-tuning; bad input is a clear error."""

import glob
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import subprocess_env_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(devices=2):
  return subprocess_env_for(devices)


def pretrain_cmd(workdir, *overrides, preset="tiny"):
  return [
    sys.executable,
    "-m",
    "bert_jax.pretrain",
    f"--config={REPO}/configs/pretrain.py:{preset}",
    f"--workdir={workdir}",
    *overrides,
  ]


def run(workdir, *overrides, kill_at=None, sig=None, devices=2, check=True):
  """Runs the entry point; with ``kill_at`` sends ``sig`` once 'step {kill_at}/' is logged."""
  proc = subprocess.Popen(
    pretrain_cmd(workdir, *overrides),
    cwd=REPO,
    env=_env(devices),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if kill_at is not None and f"] step {kill_at}/" in line:
      proc.send_signal(sig)
      kill_at = None
  proc.wait(timeout=600)
  out = "".join(lines)
  if check and sig is None:
    assert proc.returncode == 0, out[-3000:]
  return proc.returncode, out


def losses_by_step(workdir):
  """train/loss per step from the TensorBoard event files; a step logged by several runs (a
  killed one and its restart) keeps the value written last."""
  import tensorflow as tf

  events = []
  for path in glob.glob(os.path.join(workdir, "tensorboard", "events.*")):
    for e in tf.compat.v1.train.summary_iterator(path):
      for v in e.summary.value:
        if v.tag == "train/loss":
          events.append((e.wall_time, e.step, v.simple_value))
  out = {}
  for _, step, value in sorted(events):
    out[step] = value
  return out


@pytest.fixture(scope="module")
def tfrecords(tmp_path_factory, shared_data):
  """A vocabulary and seq-128 / seq-512 TFRecords made from the original BERT demo corpus."""
  from bert_jax.data import generate as generate_lib
  from bert_jax.tokenize.vocab import build_wordpiece_vocab

  out = tmp_path_factory.mktemp("pretrain_data")
  text = str(shared_data / "pretrain" / "bert_sample_text.txt")
  build_wordpiece_vocab([text], str(out / "vocab.txt"), 600, do_lower_case=True)
  config = generate_lib.GenerationConfig(
    tokenizer_path=str(out / "vocab.txt"),
    do_lower_case=True,
    max_seq_lengths=(128, 512),
    max_predictions_per_seq=(20, 80),
    dupe_factor=4,
    eval_fraction=0.0,
  )
  files = generate_lib.generate([text], str(out), config, num_workers=1, progress=False)["files"]
  # A one-layer BERT keeps compilation (most of these tests' time) short.
  vocab_size = len((out / "vocab.txt").read_text().splitlines())
  (out / "bert_config.json").write_text(
    json.dumps(
      dict(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
      )
    )
  )
  return dict(
    vocab=str(out / "vocab.txt"),
    seq128=files[128]["train"],
    seq512=files[512]["train"],
    bert_config=str(out / "bert_config.json"),
  )


def _resume_overrides(data):
  return [
    "--config.num_train_steps=8",
    "--config.phase2.fraction=0.5",
    f"--config.input_files={data['seq128']}",
    f"--config.eval_input_files={data['seq128']}",
    f"--config.phase2.input_files={data['seq512']}",
    f"--config.vocab_file={data['vocab']}",
    f"--config.bert_config_file={data['bert_config']}",
    "--config.train_batch_size=4",
    "--config.phase2.train_batch_size=2",
    "--config.eval_batch_size=2",
    "--config.max_eval_steps=1",
    "--config.save_checkpoints_steps=2",
    "--config.eval_every_steps=0",
    "--config.logging.log_every_steps=1",
    "--config.num_warmup_steps=2",
    "--config.checkpoint.keep_checkpoint_max=10",
    "--config.shuffle_buffer_size=50",
  ]


def test_kill_and_resume_is_exact_across_the_phase_change(tmp_path, tfrecords):
  overrides = _resume_overrides(tfrecords)
  ref_dir, cut_dir = str(tmp_path / "uninterrupted"), str(tmp_path / "interrupted")
  run(ref_dir, *overrides)
  reference = losses_by_step(ref_dir)
  assert sorted(reference) == list(range(1, 9))

  # SIGTERM in phase 1 (seq 128): saves the current step, exits 143 (preempted) with one line.
  code, out = run(cut_dir, *overrides, kill_at=3, sig=signal.SIGTERM)
  assert code == 143, out[-3000:]
  assert "Saved step" in out and "after the stop signal" in out
  first_stop = max(int(s) for s in os.listdir(os.path.join(cut_dir, "checkpoints")) if s.isdigit())
  assert first_stop < 8
  assert out.rstrip().splitlines()[-1] == (
    f"pretrain: preempted (SIGTERM): saved step {first_stop}; re-run to resume"
  )
  # Ctrl-C (SIGINT) saves like SIGTERM: the resumed run stops again at step 5, cleanly, with
  # the status a shell shows for an interrupted command (130).
  code, out = run(cut_dir, *overrides, kill_at=5, sig=signal.SIGINT)
  assert code == 130 and "Ctrl-C" in out and "after the stop signal" in out, out[-3000:]
  assert "Traceback" not in out
  second_stop = max(int(s) for s in os.listdir(os.path.join(cut_dir, "checkpoints")) if s.isdigit())
  assert first_stop < second_stop < 8
  assert json.load(open(os.path.join(cut_dir, "summary.json")))["status"] == "preempted"
  # SIGKILL in phase 2 (seq 512), between checkpoints: the restart repeats the lost steps.
  code, out = run(cut_dir, *overrides, kill_at=7, sig=signal.SIGKILL)
  assert code == -signal.SIGKILL and "resumed from" in out and "[seq512]" in out, out[-3000:]
  code, out = run(cut_dir, *overrides)
  assert "resumed from" in out
  resumed = losses_by_step(cut_dir)
  assert sorted(resumed) == list(range(1, 9))
  # Bit-for-bit the same losses, every step, phases 1 and 2.
  assert [resumed[s] for s in range(1, 9)] == [reference[s] for s in range(1, 9)]

  # The result is what fine-tuning loads: params, model config, tokenizer.
  from bert_jax.checkpoint import load_params

  params, config, tokenizer = load_params(cut_dir)
  assert config.num_hidden_layers == 1 and config.vocab_size == tokenizer.vocab_size
  assert params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape == (
    config.vocab_size,
    64,
  )
  for name in (
    "config.json",
    "model_config.json",
    "vocab.txt",
    "tokenizer_config.json",
    "summary.json",
    "head.json",
  ):
    assert os.path.exists(os.path.join(cut_dir, name)), name


def test_bad_config_key_and_bad_batch_are_clear_errors(tmp_path):
  proc = subprocess.run(
    pretrain_cmd(str(tmp_path / "w"), "--config.no_such_key=1"),
    cwd=REPO,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode != 0 and "no_such_key" in proc.stderr
  assert not os.path.exists(tmp_path / "w" / "checkpoints")
  proc = subprocess.run(
    pretrain_cmd(
      str(tmp_path / "w"), "--config.synthetic_data=True", "--config.train_batch_size=7"
    ),
    cwd=REPO,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode != 0
  assert "config.train_batch_size=7 is not divisible by the data-parallel size 2" in proc.stderr


def test_workdir_of_another_model_and_nan_loss(tmp_path):
  from bert_jax.runs.pretraining.runner import run_pretraining
  from bert_jax.train.loop import NonFiniteLossError
  from configs import pretrain as pretrain_config

  def config(mesh_data=-1, **kw):
    c = pretrain_config.get_config("tiny")
    kw = dict(
      dict(
        synthetic_data=True,
        num_train_steps=2,
        train_batch_size=8,
        max_seq_length=32,
        max_predictions_per_seq=4,
        save_checkpoints_steps=1,
        max_eval_steps=1,
        eval_batch_size=8,
      ),
      **kw,
    )
    for k, v in kw.items():
      setattr(c, k, v)
    c.phase2.fraction = 0.0
    c.mesh.data = mesh_data
    return c

  workdir = str(tmp_path / "w")
  summary = run_pretraining(config(), workdir)
  assert summary["status"] == "completed" and summary["last_checkpoint_step"] == 2
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  c = config(model_preset="mini")
  with pytest.raises(
    ValueError,
    match=r"holds another model \(hidden_size: 128 in the "
    r"workdir vs 256 now",
  ):
    run_pretraining(c, workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before

  # A learning rate that blows up: stop naming the step, keep the last good checkpoint.
  nan_dir = str(tmp_path / "nan")
  with pytest.raises(NonFiniteLossError, match=r"at step \d+; stopping"):
    run_pretraining(
      # An infinite learning rate is refused up front (run_config); a huge finite one makes
      # the first update non-finite.
      config(learning_rate=1e38, num_warmup_steps=0, num_train_steps=4),
      nan_dir,
    )
  steps = [int(s) for s in os.listdir(os.path.join(nan_dir, "checkpoints")) if s.isdigit()]
  assert all(s < 1 for s in steps)  # nothing non-finite was saved
  with pytest.raises(ValueError, match=r"config.mesh.*needs 16 devices"):
    run_pretraining(config(mesh_data=16), str(tmp_path / "m"))


def test_two_processes_train_together_like_one(tmp_path, tfrecords):
  """python -m launch, two local processes x 2 devices in one jax.distributed job: the same
  losses as 1 process x 4 devices; each process its coordinates and its log; the launch record."""
  overrides = [
    "--config.synthetic_data=True",
    f"--config.vocab_file={tfrecords['vocab']}",
    f"--config.bert_config_file={tfrecords['bert_config']}",
    "--config.num_train_steps=4",
    "--config.phase2.fraction=0",
    "--config.train_batch_size=8",
    "--config.eval_batch_size=8",
    "--config.max_seq_length=32",
    "--config.max_predictions_per_seq=5",
    "--config.save_checkpoints_steps=2",
    "--config.max_eval_steps=1",
    "--config.logging.log_every_steps=1",
    "--config.mesh.data=2",
    "--config.mesh.fsdp=2",
    "--config.num_warmup_steps=1",
  ]
  single = str(tmp_path / "single")
  code, out = run(single, *overrides, devices=4)
  reference = losses_by_step(single)

  multi = tmp_path / "multi"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "launch",
      "run",
      "--job=pretrain",
      f"--config={REPO}/configs/pretrain.py:tiny",
      f"--workdir={multi}",
      "--target=local",
      "--num_processes=2",
      "--cpu_devices_per_process=2",
      "--",
      *overrides,
    ],
    cwd=REPO,
    env=_env(),  # the launcher replaces the device count with --cpu_devices_per_process
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  logs = [(multi / "logs" / f"process_{i}.log").read_text() for i in range(2)]
  for i, log in enumerate(logs):
    assert f"process {i} of 2" in log, log[-2000:]
  assert "over 4 devices (2 processes)" in logs[0]
  got = losses_by_step(str(multi))
  assert sorted(got) == [1, 2, 3, 4]
  np.testing.assert_allclose(
    [got[s] for s in range(1, 5)], [reference[s] for s in range(1, 5)], rtol=0, atol=1e-5
  )
  steps = sorted(int(p.name) for p in (multi / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [2, 4]
  summary = json.loads((multi / "summary.json").read_text())
  assert summary["status"] == "completed" and summary["step"] == 4
  assert summary["num_processes"] == 2 and summary["num_devices"] == 4
  record = json.loads((multi / "launch.json").read_text())
  assert record["num_processes"] == 2 and record["target"] == "local"
  assert record["config"]["num_train_steps"] == 4  # the resolved config, overrides applied
  head = subprocess.run(
    ["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True
  ).stdout.strip()
  assert record["git"]["commit"] == (head or None)
