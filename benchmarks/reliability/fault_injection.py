r"""Fault injection: kill -9 a tiny pre-training run at random moments, resume it, compare.

  python -m benchmarks.reliability.fault_injection --kills 20 --out /tmp/fault_injection

Makes a small WordPiece vocabulary and seq-128 TFRecords from the original BERT demo text
(../shared/data/pretrain/bert_sample_text.txt) and a one-layer BERT config, then

1. runs ``python -m bert_jax.pretrain --config configs/pretrain.py:tiny`` uninterrupted for
   ``--steps`` steps, saving every ``--save_every`` steps (the reference);
2. runs the same command on another workdir and SIGKILLs it ``--kills`` times at random
   moments (once it logs a random step 1 to 2*save_every past its latest checkpoint, plus a
   random delay of up to ``--max_delay`` seconds, so kills land before, during and after
   asynchronous checkpoint writes), restarting it each time, then lets it finish;
3. reports: whether every restart after the first checkpoint resumed (its init line says
   "resumed ... at step N", N never going back), the train/loss of every step (TensorBoard
   events; a step logged by a killed run and its restart keeps the value written last) compared
   with the reference (identical, bit for bit, is expected: the input position is checkpointed),
   the final parameters compared with the reference's, and orphan temporary files in the
   workdir (``*.orbax-checkpoint-tmp*``, ``*.tmp*``).

Exit status 0 when every check passes. Runs on the CPU (JAX_PLATFORMS=cpu unless set).

Result, ``--kills 20`` (defaults: 100 steps, a save every 2 steps, delays up to 0.5 s; seed 0)
on this shared 2-core machine, 959 s: 20 kills in 20 attempts; 20 restarts with a checkpoint on
disk, all 20 resumed (from steps 2, 4, 6 and 8: on the loaded machine an asynchronous save
often took longer than the kill delay, so most kills landed while a checkpoint was being
written and the run went back to the previous complete one); train/loss at all 100 steps
identical to the uninterrupted run (0 differ, 0 missing); final params max |diff| 0.0; orphan
temporary files: 0. ``--kills 3 --steps 40``: the same, 309 s.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import signal
import sys
import threading
import time

import numpy as np

from benchmarks.common import REPO, SHARED_DATA
from benchmarks.common.process import run
from bert_jax.data import generate
from bert_jax.tokenize.vocab import build_wordpiece_vocab

SAMPLE_TEXT = str(SHARED_DATA / "pretrain" / "bert_sample_text.txt")
ORPHAN_PATTERNS = ("*.orbax-checkpoint-tmp*", "*.tmp*")


def make_data(out: str) -> dict[str, str]:
  """Vocabulary, seq-128 TFRecords and a one-layer BERT config under ``out`` (kept if there)."""
  os.makedirs(out, exist_ok=True)
  vocab = os.path.join(out, "vocab.txt")
  if not os.path.exists(vocab):
    build_wordpiece_vocab([SAMPLE_TEXT], vocab, 600, do_lower_case=True)
  config = generate.GenerationConfig(
    tokenizer_path=vocab, do_lower_case=True, max_seq_lengths=(128,),
    max_predictions_per_seq=(20,), dupe_factor=4,
  )  # fmt: skip
  files = generate.generate([SAMPLE_TEXT], out, config, num_workers=1, progress=False)["files"]
  bert_config = os.path.join(out, "bert_config.json")
  vocab_size = len(open(vocab, encoding="utf-8").read().splitlines())
  with open(bert_config, "w") as f:
    json.dump(
      dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
           intermediate_size=128, max_position_embeddings=128),
      f,
    )  # fmt: skip
  return {"vocab": vocab, "train": files[128]["train"], "bert_config": bert_config}


def command(workdir: str, data: dict[str, str], steps: int, save_every: int) -> list[str]:
  return [
    sys.executable, "-m", "bert_jax.pretrain",
    f"--config={REPO}/configs/pretrain.py:tiny", f"--workdir={workdir}",
    f"--config.input_files={data['train']}", f"--config.vocab_file={data['vocab']}",
    f"--config.bert_config_file={data['bert_config']}",
    f"--config.num_train_steps={steps}", "--config.phase2.fraction=0",
    "--config.train_batch_size=4", "--config.eval_batch_size=4", "--config.max_eval_steps=1",
    f"--config.save_checkpoints_steps={save_every}", "--config.eval_every_steps=0",
    "--config.logging.log_every_steps=1", "--config.num_warmup_steps=2",
    "--config.checkpoint.keep_checkpoint_max=3", "--config.shuffle_buffer_size=50",
  ]  # fmt: skip


def environment() -> dict[str, str]:
  return {
    k: os.environ.get(k, v) for k, v in (("JAX_PLATFORMS", "cpu"), ("TF_CPP_MIN_LOG_LEVEL", "2"))
  }


_STEP = re.compile(r"\] step (\d+)/")
_RESUMED = re.compile(r"resumed from .* at step (\d+)")


def run_once(cmd, kill_step=None, delay=0.0, log=None):
  """Runs ``cmd``; with ``kill_step`` SIGKILLs it ``delay`` s after it logs that step (or a later
  one). Returns (returncode, output, killed, resumed step or None, last step logged)."""
  last, resumed, timer = 0, None, None

  def on_line(line, proc):
    nonlocal last, resumed, timer
    if log is not None:
      log.write(line)
    m = _RESUMED.search(line)
    if m:
      resumed = int(m.group(1))
    m = _STEP.search(line)
    if m:
      last = int(m.group(1))
      if kill_step is not None and timer is None and last >= kill_step:
        timer = threading.Timer(delay, lambda: proc.poll() is None and proc.kill())
        timer.start()

  done = run(cmd, cwd=REPO, env=environment(), on_line=on_line, check=False)
  killed = False
  if timer is not None:
    timer.cancel()
    killed = done.returncode == -signal.SIGKILL
  return done.returncode, done.stdout, killed, resumed, last


def losses_by_step(workdir: str) -> dict[int, float]:
  import tensorflow as tf  # heavy

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


def final_params(workdir: str):
  import jax  # after main() sets JAX_PLATFORMS (jax reads it when imported)

  from bert_jax.checkpoint import load_params  # imports jax: after main() sets JAX_PLATFORMS

  params, _, _ = load_params(workdir)
  return jax.tree_util.tree_leaves_with_path(params)


def orphans(workdir: str) -> list[str]:
  found = set()
  for pattern in ORPHAN_PATTERNS:
    found.update(glob.glob(os.path.join(workdir, "**", pattern), recursive=True))
    found.update(glob.glob(os.path.join(workdir, "**", "." + pattern), recursive=True))
  return sorted(found)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--kills", type=int, default=20)
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--save_every", type=int, default=2)
  parser.add_argument("--max_delay", type=float, default=0.5)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default="/tmp/bert_jax_fault_injection")
  args = parser.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # this process reads the final params
  rng = random.Random(args.seed)
  t0 = time.time()
  data = make_data(os.path.join(args.out, "data"))
  ref_dir, cut_dir = os.path.join(args.out, "reference"), os.path.join(args.out, "killed")
  for d in (ref_dir, cut_dir):
    if os.path.exists(d):
      raise SystemExit(f"fault_injection: error: {d} exists; use another --out")
  log = open(os.path.join(args.out, "runs.log"), "a")
  cmd_ref = command(ref_dir, data, args.steps, args.save_every)
  print("reference:", " ".join(cmd_ref), flush=True)
  code, out, _, _, _ = run_once(cmd_ref, log=log)
  if code != 0:
    print(out[-3000:])
    raise SystemExit("fault_injection: error: the reference run failed")

  cmd = command(cut_dir, data, args.steps, args.save_every)
  kills, attempts, problems, resumes = 0, 0, [], []
  last_resumed = -1
  while kills < args.kills:
    attempts += 1
    if attempts > 3 * args.kills:
      problems.append(f"only {kills} kills landed in {attempts - 1} attempts")
      break
    saved = latest_step(cut_dir)
    # A few steps past the checkpoint it resumes from, plus a random delay.
    target = (saved or 0) + rng.randint(1, 2 * args.save_every)
    delay = rng.uniform(0.0, args.max_delay)
    code, out, killed, resumed, last = run_once(cmd, kill_step=target, delay=delay, log=log)
    if saved is not None:
      resumes.append((saved, resumed))
      if resumed is None or resumed < last_resumed:
        problems.append(f"restart {attempts}: checkpoint at {saved} but resumed={resumed}")
      last_resumed = resumed if resumed is not None else last_resumed
    if killed:
      kills += 1
      print(f"kill {kills}: at step {last} (+{delay:.2f}s); resumed from {resumed}", flush=True)
    elif code == 0:
      print(f"attempt {attempts}: finished before the kill (resumed from {resumed})", flush=True)
      if latest_step(cut_dir) == args.steps:  # done: start the next cycle on a fresh workdir
        problems.append(f"run finished after {kills} kills: raise --steps for more kills")
        break
    else:
      problems.append(f"attempt {attempts}: exit status {code} without a kill:\n{out[-2000:]}")
      break
  saved = latest_step(cut_dir)
  code, out, _, resumed, _ = run_once(cmd, log=log)
  if code != 0:
    problems.append(f"final resume failed (status {code}):\n{out[-2000:]}")
  if saved is not None:
    resumes.append((saved, resumed))
    if resumed is None:
      problems.append(f"final run: checkpoint at {saved} but it did not resume")

  ref_losses, cut_losses = losses_by_step(ref_dir), losses_by_step(cut_dir)
  differing = [s for s in ref_losses if cut_losses.get(s) != ref_losses[s]]
  missing = sorted(set(ref_losses) - set(cut_losses))
  if differing or missing:
    problems.append(f"losses differ at steps {differing[:10]} (missing {missing[:10]})")
  ref_params, cut_params = final_params(ref_dir), final_params(cut_dir)
  param_diff = max(
    float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    for (_, a), (_, b) in zip(ref_params, cut_params)
  )
  if param_diff != 0.0 or len(ref_params) != len(cut_params):
    problems.append(f"final params differ (max |diff| {param_diff})")
  left = orphans(cut_dir)
  if left:
    problems.append(f"orphan temporary files: {left[:10]}")

  print("\n== fault injection report ==")
  print(f"kills: {kills} (attempts {attempts}), steps {args.steps}, save every {args.save_every}")
  resumed_ok = sum(1 for saved, r in resumes if r is not None)
  print(f"restarts with a checkpoint on disk: {len(resumes)}; resumed: {resumed_ok}")
  print(
    f"losses: {len(ref_losses)} steps compared, {len(differing)} differ, {len(missing)} missing"
  )
  print(f"final params: max |diff| {param_diff}")
  print(f"orphan temporary files: {len(left)}")
  print(f"time: {time.time() - t0:.0f}s")
  for p in problems:
    print("PROBLEM:", p)
  print("OK" if not problems else "FAILED")
  return 0 if not problems else 1


def latest_step(workdir: str) -> int | None:
  """The highest finished checkpoint step in ``workdir`` (numeric directory names)."""
  steps = []
  for root in (workdir, os.path.join(workdir, "checkpoints")):
    if os.path.isdir(root):
      steps += [int(n) for n in os.listdir(root) if n.isdigit()]
  return max(steps) if steps else None


if __name__ == "__main__":
  sys.exit(main())
