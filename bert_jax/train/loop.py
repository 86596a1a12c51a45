"""The training loop of every run: step -> log -> eval -> checkpoint.

``bert_jax.train.trainer`` assembles a job's phases (each with its jitted step and input) and
calls ``train_loop``; nothing here knows a task. The loop saves a checkpoint every
``save_every_steps`` and at the end (asynchronously; state, the current phase's input position
and ``{"phase": name}``), checks after every step that no background save has failed (a
failure is raised at once, naming the step), calls ``before_save`` (the workdir lock's check)
before each save, stops cleanly on SIGTERM or Ctrl-C (SIGINT) after saving (a second Ctrl-C
aborts at once), and stops on a non-finite loss naming the step and the last good checkpoint (a
state is only saved after every loss up to it was checked finite). A progress line is logged
every ``log_every_steps`` and also whenever ``progress_interval_sec`` (30 s) passed since the
last one, so slow steps are never silent; a phase's first step (compiling) and a checkpoint
save log a heartbeat (``bert_jax.train.progress.Heartbeat``) every 30 s while they run. A
resumed run whose evaluation was due at the step it resumed from but is not in the history
(the process died during it) evaluates that step first (``LoopOptions.evaluated``). Throughput
(examples, tokens and steps per second, MFU) covers steady steps: the run's and each phase's
first step, and a later step with a batch shape not run before (it compiles the step again),
are timed apart (``first_step_sec``, ``compile_sec``). It returns the summary dict.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax.checkpoint import CheckpointManager
from bert_jax.parallel.sharding import Rules, make_global_batch
from bert_jax.train.job import Phase
from bert_jax.train.metrics import MetricWriter, progress_line
from bert_jax.train.progress import INTERVAL_SEC, Heartbeat

# Steps dispatched but not waited for (see train_loop): enough to keep the device fed.
MAX_STEPS_IN_FLIGHT = 2


class NonFiniteLossError(FloatingPointError):
  """Training produced a NaN/inf loss; nothing was saved after the last finite step."""


@dataclasses.dataclass
class LoopOptions:
  save_every_steps: int
  log_every_steps: int = 100
  eval_every_steps: int = 0  # 0: only at the end (when eval_fn is given)
  peak_flops_per_device: float = 0.0  # 0: no MFU
  save_on_preemption: bool = True
  eval_fn: Callable[[Any], dict] | None = None
  eval_at_end: bool = True
  before_save: Callable[[], None] | None = None  # e.g. the workdir lock's check
  # Whether a step's evaluation is already in the history: a resumed run whose evaluation was
  # due at its first step and is missing runs it before training on. None: not checked.
  evaluated: Callable[[int], bool] | None = None
  progress_interval_sec: float = INTERVAL_SEC  # a progress line at least this often
  clock: Callable[[], float] = time.monotonic  # for progress_interval_sec


class PreemptionWatcher:
  """Sets a flag on SIGTERM or SIGINT (handlers installed only in the main thread); agreed
  across processes. A second SIGINT (Ctrl-C) raises KeyboardInterrupt at once."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self._flag = False
    self._previous: dict[int, Any] = {}

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._on_signal) for s in self.SIGNALS}
      # A Ctrl-C the entry point's handler took but that did not stop the run (something swallowed
      # its KeyboardInterrupt): honoured here, save after the first step and stop.
      self._flag = bool(getattr(self._previous[signal.SIGINT], "requested", False))
    return self

  def _on_signal(self, signum, frame):
    del frame
    record = getattr(self._previous.get(signum), "record", None)
    if record is not None:  # the entry point's handler (bert_jax.interrupts): exit status 130
      record(signum)
    if signum == signal.SIGINT and self._flag:
      raise KeyboardInterrupt("second Ctrl-C: stopping without saving")
    what = "Ctrl-C (again to abort at once)" if signum == signal.SIGINT else f"signal {signum}"
    logging.warning("Received %s: saving a checkpoint and stopping", what)
    self._flag = True

  def __exit__(self, *exc):
    for s, previous in self._previous.items():
      signal.signal(s, previous)

  def stopped(self, step: int) -> None:
    """The loop saved ``step`` and stops on the signal: the entry point's handler
    (``bert_jax.interrupts``) is told, so that it exits with 143 (130 after a Ctrl-C)."""
    record_stop = getattr(self._previous.get(signal.SIGINT), "record_stop", None)
    if record_stop is not None:
      record_stop(step)

  def requested(self) -> bool:
    if jax.process_count() == 1:
      return self._flag
    flags = multihost_utils.process_allgather(np.asarray(self._flag, np.int32))
    return bool(np.any(flags))


class StepClock:
  """The loop's time: steady steps' rates over an interval, and when a progress line is due.

  An interval runs from one flush to the next. Steps that compiled the step function for a new
  batch shape are timed apart (``compiled``) and left out of the interval's rates, as is time
  the loop spends outside steps (``exclude_since``: an evaluation). ``clock`` (monotonic by
  default) decides when a line is due; rates use wall time.
  """

  def __init__(self, step: int, clock: Callable[[], float] = time.monotonic):
    self.clock = clock
    self.started = time.time()
    self.start_interval(step)
    self.last_line = clock()

  def start_interval(self, step: int) -> None:
    self.t0, self.step0, self.tokens = time.time(), step, 0
    self.compile_sec, self.compile_steps = 0.0, 0

  def steady_step(self, tokens: int) -> None:
    self.tokens += tokens  # input_ids elements fed (bucketed batches are shorter)

  def compiled(self, seconds: float) -> None:
    self.compile_sec, self.compile_steps = self.compile_sec + seconds, self.compile_steps + 1

  def exclude_since(self, t: float) -> None:
    """Time since ``t`` (time.time()) is not charged to the interval's steps."""
    self.t0 += time.time() - t

  def line_due(self, interval_sec: float) -> bool:
    return self.clock() - self.last_line >= interval_sec

  def end_interval(self, step: int, phase_first_step: bool, global_batch: int) -> dict:
    """The interval's timings (``first_step_sec``, ``compile_sec``, or the steady rates);
    starts the next interval."""
    elapsed = time.time() - self.t0 - self.compile_sec
    n_steps = step - self.step0 - self.compile_steps
    out: dict[str, float] = {}
    if self.compile_steps:
      out["compile_sec"] = self.compile_sec
    if phase_first_step and n_steps == 1:
      out["first_step_sec"] = elapsed  # a phase's first step compiles: not throughput
    elif elapsed > 0 and n_steps > 0:
      out.update(
        examples_per_sec=n_steps * global_batch / elapsed,
        tokens_per_sec=self.tokens / elapsed,
        steps_per_sec=n_steps / elapsed,
        seconds_per_step=elapsed / n_steps,
      )
    self.start_interval(step)
    self.last_line = self.clock()
    return out

  def wall_sec(self) -> float:
    return time.time() - self.started


def phase_index(phases: Sequence[Phase], step: int) -> int:
  for i, phase in enumerate(phases):
    if step < phase.end_step:
      return i
  return len(phases) - 1


def _to_float(metrics: dict) -> dict[str, float]:
  return {k: float(v) for k, v in jax.device_get(metrics).items()}


def train_loop(
  state: Any,
  phases: Sequence[Phase],
  steps: Sequence[Callable[[Any, dict], tuple[Any, dict]]],
  manager: CheckpointManager,
  options: LoopOptions,
  writer: MetricWriter,
  mesh: jax.sharding.Mesh,
  rules: Rules,
  input_state: dict | None = None,
  input_phase: str | None = None,
) -> dict[str, Any]:
  """Runs ``state`` to ``phases[-1].end_step``, phase ``i`` with the jitted step ``steps[i]``
  (``(state, batch) -> (state, metrics)``); returns the summary (see module docstring).

  ``input_state``/``input_phase``: the input position and phase name saved in the checkpoint
  resumed from (its ``input`` item and ``meta["phase"]``); the position is applied only to that
  phase's input (a checkpoint taken at a phase boundary starts the next phase's input afresh).
  """
  total = phases[-1].end_step
  step = int(jax.device_get(state.step))
  start_step = step
  current, inputs = -1, None
  phase_start = step  # the step this process started the current phase at
  pending: list[tuple[int, dict]] = []
  last_train: dict[str, float] = {}
  last_eval: dict[str, float] = {}
  timer = StepClock(step, options.clock)
  shapes_seen: set = set()  # (phase, the batch's shapes) the steps have run with
  status = "completed"

  def flush(now_step: int) -> None:
    """Fetches pending metrics; stops on a non-finite loss; logs the last one."""
    nonlocal pending, last_train
    if not pending:
      return
    fetched = [(s, _to_float(m)) for s, m in pending]
    pending = []
    for s, m in fetched:
      bad = [k for k in ("loss", "update_norm") if k in m and not math.isfinite(m[k])]
      if bad:
        manager.wait()
        good = manager.latest_step()
        what = ", ".join(f"{k} is {m[k]}" for k in bad)
        raise NonFiniteLossError(
          f"{what} at step {s}; stopping without saving. The last good checkpoint is step "
          f"{good} in {manager.directory}"
          if good is not None
          else f"{what} at step {s}; stopping. No checkpoint was saved yet"
        )
    last_train = dict(fetched[-1][1])
    phase = phases[phase_index(phases, now_step - 1)]
    timings = timer.end_interval(now_step, now_step == phase_start + 1, phase.global_batch_size)
    if "seconds_per_step" in timings:
      timings["eta_sec"] = (total - now_step) * timings.pop("seconds_per_step")
      if options.peak_flops_per_device > 0 and phase.flops_per_example > 0:
        timings["mfu"] = (
          timings["examples_per_sec"]
          * phase.flops_per_example
          / (options.peak_flops_per_device * jax.device_count())
        )
    last_train.update(timings)
    writer.scalars(now_step, {f"train/{k}": v for k, v in last_train.items()})
    logging.info(progress_line(now_step, total, last_train, phase.name))

  def save(now_step: int) -> None:
    flush(now_step)
    if options.before_save is not None:
      options.before_save()
    input_pos = inputs.get_state() if inputs is not None and hasattr(inputs, "get_state") else {}
    with Heartbeat(f"saving the checkpoint of step {now_step}"):  # a synchronous save blocks
      manager.save(
        now_step,
        state,
        input_state=input_pos,
        meta={"phase": phases[current].name if current >= 0 else phases[0].name, "step": now_step},
      )

  def eval_due(now_step: int) -> bool:
    return options.eval_fn is not None and (
      (bool(options.eval_every_steps) and now_step % options.eval_every_steps == 0)
      or (now_step == total and options.eval_at_end)
    )

  def run_eval(now_step: int) -> None:
    nonlocal last_eval
    flush(now_step)
    t_eval = time.time()
    with Heartbeat(f"evaluating at step {now_step}"):  # a line every 30 s (the first compiles)
      last_eval = dict(options.eval_fn(state))
    timer.exclude_since(t_eval)  # the evaluation's time is not charged to the next steps' rates
    writer.scalars(now_step, {f"eval/{k}": v for k, v in last_eval.items()})
    logging.info(
      "eval at step %d: %s",
      now_step,
      ", ".join(f"{k} {v:.4f}" for k, v in sorted(last_eval.items())),
    )

  if step > 0 and options.evaluated is not None and eval_due(step) and not options.evaluated(step):
    logging.warning(
      "The evaluation of step %d is missing from the history (the run ended during it): "
      "evaluating step %d before going on",
      step,
      step,
    )
    run_eval(step)
  with PreemptionWatcher() as preemption:
    while step < total:
      idx = phase_index(phases, step)
      if idx != current:
        if current >= 0:
          flush(step)
          logging.info("Phase %s -> %s at step %d", phases[current].name, phases[idx].name, step)
        inputs = phases[idx].make_input()
        if (
          input_state
          and current < 0
          and hasattr(inputs, "set_state")
          and input_phase in (None, phases[idx].name)
        ):
          inputs.set_state(input_state)  # resumed mid-phase: continue where the checkpoint was
        current, phase_start = idx, step
        timer.start_interval(step)
      batch = make_global_batch(next(inputs), mesh, rules)
      tokens = (
        batch["input_ids"].size
        if "input_ids" in batch
        else phases[idx].global_batch_size * phases[idx].seq_len
      )
      shapes = (idx, tuple(sorted((k, tuple(v.shape)) for k, v in batch.items())))
      if step == phase_start:
        # The phase's first step compiles its step function: minutes for a large model.
        with Heartbeat(f"step {step + 1}/{total} [{phases[idx].name}] (compiling the step)"):
          state, metrics = steps[idx](state, batch)
          jax.block_until_ready(metrics)
      elif shapes not in shapes_seen:
        # A new batch shape later in a phase compiles the step again: timed on its own (after
        # the steps before it have run) and left out of the interval's rates.
        jax.block_until_ready(state)
        t_compile = time.time()
        state, metrics = steps[idx](state, batch)
        jax.block_until_ready(metrics)
        timer.compiled(time.time() - t_compile)
      else:
        state, metrics = steps[idx](state, batch)
        timer.steady_step(tokens)
      shapes_seen.add(shapes)
      step += 1
      manager.check_for_errors()  # a failed background save surfaces within one step
      pending.append((step, metrics))
      if len(pending) > MAX_STEPS_IN_FLIGHT:
        # JAX dispatches steps asynchronously: without this the loop would run minutes ahead of
        # the device, and its clock (progress lines, the interval's rates) would measure
        # dispatch, not steps done. A step or two queued keeps the device busy.
        jax.block_until_ready(pending[-1 - MAX_STEPS_IN_FLIGHT][1])
      if step - phase_start == 1:
        flush(step)  # each phase's first step (compilation) is timed apart from the rest
      elif step % options.log_every_steps == 0 or step == total:
        flush(step)
      elif timer.line_due(options.progress_interval_sec):
        flush(step)  # slow steps: a line at least every progress_interval_sec
      if step == total or step % options.save_every_steps == 0:
        save(step)
      if eval_due(step):
        run_eval(step)
      if options.save_on_preemption and step < total and preemption.requested():
        save(step)
        preemption.stopped(step)
        status = "preempted"
        logging.warning("Saved step %d after the stop signal; exiting", step)
        break
    flush(step)
  with Heartbeat("waiting for the last checkpoint to be written"):
    manager.wait()
  return dict(
    status=status,
    step=step,
    start_step=start_step,
    num_train_steps=total,
    train=last_train,
    eval=last_eval,
    wall_time_sec=timer.wall_sec(),
    last_checkpoint_step=manager.latest_step(),
  )
