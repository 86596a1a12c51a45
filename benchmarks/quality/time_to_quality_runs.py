"""The time-to-quality benchmark's runs: one recipe's budgeted, resumable pre-training run.

``run_bert_jax(recipe, ...)`` runs ``python -m bert_jax.pretrain`` (the library has no
wall-clock limit key: the run is stopped with SIGTERM, on which the trainer saves and exits):

1. a probe (``--probe_steps`` steps in ``<run>/probe``, not timed against the budget) measures
   the recipe's steps per second and its rows' real-token share (summary.json);
2. the run proper evaluates and saves every E steps, E = the probe's steps per
   ``--eval_every_seconds``; this process reads the child's log lines as they come: the
   progress line of an evaluation step to its ``eval at step`` line is evaluation and
   checkpoint time, left out of the training clock; the clock starts at the child's launch
   (interpreter, imports, data, compilation counted: a user pays them). When the clock reaches
   the budget the child gets SIGTERM (not before its first progress line: a budget shorter than
   the start-up trains up to the first evaluation, and the clock says so);
3. a last short child (``num_train_steps`` = the step reached; the schedule is constant after
   warmup, so that changes nothing) evaluates that step, completing the run.

The learning rate is ``config.optimizer.schedule="constant"`` (linear warmup, then constant) for
every recipe: the budget, not a step count, ends each run. Real tokens seen: steps x rows x
seq x the probe's real-token share. ``<run>/ttq_state.json`` holds the clock at each evaluation
and at each checkpoint: a rerun resumes from the trainer's latest checkpoint with the clock it
had there (the steps after it are redone, their time not counted twice).

``run_torch(recipe, ...)`` runs ``benchmarks.common.torch_pretrain``, which keeps its own clock,
evaluations and checkpoints the same way.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time

from benchmarks.common.process import ChildFailed, run
from bert_jax.interrupts import PREEMPTED_EXIT

_EVAL_LINE = re.compile(r"eval at step (\d+):")
_PROGRESS_LINE = re.compile(r"step (\d+)/\d+")
_SAVED_LINE = re.compile(r"Saved step (\d+) after the stop signal")
# Recipe -> its bert_jax config overrides (besides the shared ones).
BERT_JAX_RECIPES = {
  "bert_jax_paper": dict(
    attention_kernel="reference", attention_probs_dropout_prob=0.1, **{"packing.enabled": False}
  ),
  "bert_jax_fast": dict(
    attention_kernel="auto", attention_probs_dropout_prob=0.0, **{"packing.enabled": True}
  ),
}
TORCH_RECIPES = {"pytorch_sdpa": "all", "pytorch_sdpa_masked": "masked"}


def _read_json(path: str, default=None):
  if not os.path.exists(path):
    return default
  with open(path) as f:
    return json.load(f)


def _write_json(path: str, value) -> None:
  with open(path + ".tmp", "w") as f:
    json.dump(value, f, indent=1)
  os.replace(path + ".tmp", path)


def bert_jax_command(recipe: str, workdir: str, data, args, steps: int, every: int) -> list[str]:
  """The recipe's command; JAX's compilation cache is the run's own (``<workdir>_jax_cache``),
  so the timed run compiles cold and the probe warms nothing for it."""
  overrides = dict(
    input_files=data.train_files,
    eval_input_files=data.heldout_files,
    vocab_file=data.vocab_file,
    num_train_steps=steps,
    num_warmup_steps=min(args.warmup_steps, steps),  # the probe's and the last evaluation's
    train_batch_size=args.batch_size,
    eval_batch_size=args.eval_batch_size,
    max_eval_steps=data.eval_records // args.eval_batch_size,
    eval_every_steps=every,
    save_checkpoints_steps=every,
    seed=args.seed,
    dtype=args.dtype,
    **{
      "optimizer.schedule": "constant",
      "phase2.fraction": 0,
      "logging.log_every_steps": every,
      "compilation_cache.dir": workdir.rstrip("/") + "_jax_cache",
    },
    **BERT_JAX_RECIPES[recipe],
  )
  return [
    sys.executable,
    "-m",
    "bert_jax.pretrain",
    f"--config=configs/pretrain.py:{args.size}",
    f"--workdir={workdir}",
    *[f"--config.{k}={v}" for k, v in overrides.items()],
  ]


def _probe(recipe: str, run_dir: str, data, args, log) -> dict:
  path = os.path.join(run_dir, "probe.json")
  done = _read_json(path)
  if done is not None:
    return done
  workdir = os.path.join(run_dir, "probe")
  steps = max(args.probe_steps, 4)
  cmd = bert_jax_command(recipe, workdir, data, args, steps, steps)
  log(f"{recipe}: probing {steps} steps")
  run(cmd, log=os.path.join(run_dir, "probe.log"))
  summary = _read_json(os.path.join(workdir, "summary.json"))
  share = next(iter(summary.get("input_token_share", {}).values()), {})
  probe = dict(
    steps_per_sec=float(summary["train"]["steps_per_sec"]),
    real_token_share=float(share.get("real_token_share", 1.0)),
    sequences_per_row=float(share.get("sequences_per_row", 1.0)),
  )
  _write_json(path, probe)
  return probe


def _latest_checkpoint(workdir: str) -> int:
  root = os.path.join(workdir, "checkpoints")
  steps = [int(d) for d in os.listdir(root) if d.isdigit()] if os.path.isdir(root) else []
  return max(steps, default=0)


class _Clock:
  """The training clock of one child: launch to now, less the evaluations' spans."""

  def __init__(self, carried: float):
    self.carried = carried
    self.t0 = time.time()
    self.excluded, self.paused_at = 0.0, None
    self.lock = threading.Lock()

  def seconds(self, now: float | None = None) -> float:
    now = time.time() if now is None else now
    with self.lock:
      paused = now - self.paused_at if self.paused_at is not None else 0.0
      return self.carried + now - self.t0 - self.excluded - paused

  def pause(self, now: float) -> None:
    with self.lock:
      if self.paused_at is None:
        self.paused_at = now

  def resume(self, now: float) -> float:
    with self.lock:
      span = now - self.paused_at if self.paused_at is not None else 0.0
      self.excluded += span
      self.paused_at = None
      return span


def run_bert_jax(recipe: str, run_dir: str, data, args, log) -> dict:
  """Runs (or resumes, or reads the finished) recipe; returns its state (see module docstring)."""
  os.makedirs(run_dir, exist_ok=True)
  state_path = os.path.join(run_dir, "ttq_state.json")
  st = _read_json(state_path, dict(recipe=recipe, evals=[], checkpoints={}, completed=False))
  if st["completed"]:
    return st
  probe = st.setdefault("probe", _probe(recipe, run_dir, data, args, log))
  every = max(1, round(args.eval_every_seconds * probe["steps_per_sec"]))
  st["eval_every_steps"] = st.get("eval_every_steps", every)
  every = st["eval_every_steps"]
  workdir = os.path.join(run_dir, "workdir")
  budget = 60.0 * args.budget_minutes
  resumed = _latest_checkpoint(workdir)
  carried = st["checkpoints"].get(str(resumed), 0.0) if resumed else 0.0
  st["evals"] = [e for e in st["evals"] if e["step"] <= resumed]
  clock = _Clock(carried)
  stopped, training = threading.Event(), threading.Event()

  def on_line(line: str, proc) -> None:
    now = time.time()
    if _PROGRESS_LINE.search(line) or _EVAL_LINE.search(line):
      training.set()
    m = _PROGRESS_LINE.search(line)
    if m and int(m.group(1)) % every == 0 and "eval at" not in line:
      clock.pause(now)  # the checkpoint and evaluation of this step follow
      return
    m = _EVAL_LINE.search(line)
    if m:
      span = clock.resume(now)
      step, seconds = int(m.group(1)), clock.seconds(now)
      st["evals"] = [e for e in st["evals"] if e["step"] != step]
      st["evals"].append(dict(step=step, train_seconds=seconds, eval_seconds=span))
      st["checkpoints"][str(step)] = seconds
      _write_json(state_path, st)
      return
    m = _SAVED_LINE.search(line)
    if m:
      st["checkpoints"][m.group(1)] = clock.seconds(now)  # the step under way when signalled
      _write_json(state_path, st)

  def watch(proc_holder: list) -> None:
    # The stop signal waits for the trainer's first progress line: before it, the trainer's
    # handler (save, then exit 143) may not be installed yet, and there is nothing to save.
    while not stopped.wait(0.5):
      if clock.seconds() >= budget and proc_holder and training.is_set():
        proc_holder[0].send_signal(signal.SIGTERM)
        return

  train_cmd = bert_jax_command(recipe, workdir, data, args, 10**8, every)
  if carried < budget:
    log(f"{recipe}: training from step {resumed} ({carried:.0f} s of {budget:.0f} s done)")
    holder: list = []

    def on_line_first(line, proc):
      if not holder:
        holder.append(proc)
        threading.Thread(target=watch, args=(holder,), daemon=True).start()
      on_line(line, proc)

    log_path = os.path.join(run_dir, "train.log")
    try:
      done = run(train_cmd, log=log_path, append=True, on_line=on_line_first, check=False)
    finally:
      stopped.set()
    if done.returncode not in (0, PREEMPTED_EXIT):  # 143: stopped at the budget, saved
      raise ChildFailed(f"{recipe}: training failed (status {done.returncode}); see {log_path}")
  final = _latest_checkpoint(workdir)
  if not st["evals"] or st["evals"][-1]["step"] != final:
    log(f"{recipe}: evaluating step {final}")
    cmd = bert_jax_command(recipe, workdir, data, args, final, every)
    t = time.time()
    run(cmd, log=os.path.join(run_dir, "final_eval.log"))
    seconds = st["checkpoints"].get(str(final), budget)
    st["evals"].append(dict(step=final, train_seconds=seconds, eval_seconds=time.time() - t))
  history = {
    h["step"]: h for h in _read_json(os.path.join(workdir, "eval_history.json"))["history"]
  }
  tokens_per_step = args.batch_size * 128 * probe["real_token_share"]
  for e in st["evals"]:
    e.update({k: v for k, v in history.get(e["step"], {}).items() if k != "step"})
    e["tokens"] = round(e["step"] * tokens_per_step)
  st.update(completed=True, checkpoint=workdir, command=" ".join(train_cmd[1:]))
  _write_json(state_path, st)
  return st


def finished(recipe: str, run_dir: str) -> dict | None:
  """The state of a finished run of ``recipe`` (as its runner returns it), None if unfinished;
  reads only."""
  if recipe in TORCH_RECIPES:
    workdir = os.path.join(run_dir, "workdir")
    st = _read_json(os.path.join(workdir, "history.json"), {})
    if not st.get("completed"):
      return None
    return dict(
      recipe=recipe, evals=st["history"], completed=True, checkpoint=os.path.join(workdir, "hf")
    )
  st = _read_json(os.path.join(run_dir, "ttq_state.json"), {})
  return st if st.get("completed") else None


def run_torch(recipe: str, run_dir: str, data, args, log) -> dict:
  """Runs (or resumes) the PyTorch reference; returns its state in the same form."""
  workdir = os.path.join(run_dir, "workdir")
  cmd = [
    sys.executable,
    "-m",
    "benchmarks.common.torch_pretrain",
    f"--workdir={workdir}",
    f"--train_files={data.train_files}",
    f"--eval_files={data.heldout_files}",
    f"--eval_records={data.eval_records}",
    f"--vocab_file={data.vocab_file}",
    f"--size={args.size}",
    f"--batch_size={args.batch_size}",
    f"--eval_batch_size={args.eval_batch_size}",
    f"--learning_rate={args.learning_rate}",
    f"--warmup_steps={args.warmup_steps}",
    f"--budget_seconds={60.0 * args.budget_minutes}",
    f"--eval_every_seconds={args.eval_every_seconds}",
    f"--mlm_head={TORCH_RECIPES[recipe]}",
    f"--seed={args.seed}",
    f"--dtype={args.dtype}",
  ]
  os.makedirs(run_dir, exist_ok=True)
  st = _read_json(os.path.join(workdir, "history.json"), {})
  if not st.get("completed"):
    log(f"{recipe}: training ({st.get('train_seconds', 0.0):.0f} s done)")
    run(cmd, log=os.path.join(run_dir, "train.log"), append=True)
    st = _read_json(os.path.join(workdir, "history.json"))
  return dict(
    recipe=recipe,
    evals=st["history"],
    completed=st.get("completed", False),
    checkpoint=os.path.join(workdir, "hf"),
    command=" ".join(cmd[1:]),
  )
