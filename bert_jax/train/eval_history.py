"""Evaluations during a run: their history, the best checkpoint, and the outputs kept for the end.

``EvalHistory(workdir, resumed_step, higher_is_better, best_manager)`` wraps a job's
``evaluate(params, step) -> EvalResult`` into the loop's ``eval_fn(state)``. Each evaluation is
appended to ``<workdir>/eval_history.json`` (``{"history": [...], "best_value", "best_step"}``,
the history in step order; an entry holds its ``primary`` value when it has one). A resumed run
keeps the entries up to the step it resumed from, and its best is recomputed from them: an
evaluation after that step (written before the process died, its checkpoint lost) selects
nothing. When ``best_manager`` is given (``job.hooks.keep_best``), a state whose ``primary`` value
beats every earlier one is saved there, and it holds that one checkpoint only
(``reconcile_best`` puts it right on resume). The task's outputs (e.g. dev predictions) of the
best and the latest evaluation are kept in memory, so that the end of a run can write them
without predicting again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax
from absl import logging

from bert_jax.checkpoint import CheckpointManager, write_json
from bert_jax.train.job import EvalResult
from bert_jax.train.metrics import json_safe


class EvalHistory:
  def __init__(
    self,
    workdir: str,
    resumed_step: int | None,
    higher_is_better: bool,
    best_manager: CheckpointManager | None,
  ):
    self.path = os.path.join(workdir, "eval_history.json")
    self.higher_is_better = higher_is_better
    self.best_manager = best_manager
    saved = {}
    if resumed_step is not None and os.path.isfile(self.path):
      with open(self.path) as f:
        saved = json.load(f)
    self.history = sorted(
      (h for h in saved.get("history", []) if h["step"] <= (resumed_step or 0)),
      key=lambda h: h["step"],
    )
    self.best_value: float | None = None
    self.best_step: int | None = None
    for h in self.history:
      if h.get("primary") is not None and self._better(h["primary"]):
        self.best_value, self.best_step = float(h["primary"]), int(h["step"])
    kept = saved.get("best_step")
    if self.best_step is None and kept is not None and kept <= (resumed_step or 0):
      # A history written before entries held their primary value: its own best, when kept.
      self.best_value, self.best_step = saved.get("best_value"), kept
    self.seconds = 0.0  # spent evaluating in this process's loop
    self.outputs: dict[int, Any] = {}  # step -> the task's outputs (best and latest only)

  @property
  def steps(self) -> set[int]:
    """The steps evaluated (kept from before a resume, or evaluated since)."""
    return {int(h["step"]) for h in self.history}

  def _better(self, value: float) -> bool:
    if self.best_value is None:
      return True
    return value > self.best_value if self.higher_is_better else value < self.best_value

  def reconcile_best(self, restore_state: Callable[[int], Any] | None = None) -> None:
    """Makes ``best_manager`` hold exactly the checkpoint of ``best_step`` (a resumed run's
    ``best/`` may hold a later step's, from before the process died): others are removed, and a
    missing one is copied from ``restore_state(step)`` (the run's own checkpoint) when given and
    it still exists. When it is gone, the best is chosen among the evaluations from now on (one
    warning)."""
    if self.best_manager is None:
      return
    for step in self.best_manager.all_steps():
      if step != self.best_step:
        logging.info("Removing best checkpoint %d: not the best of the kept history", step)
        self.best_manager.delete(step)
    if self.best_step is None or self.best_step in self.best_manager.all_steps():
      return
    state = restore_state(self.best_step) if restore_state is not None else None
    if state is not None:
      self.best_manager.save(self.best_step, state, meta={"best_value": self.best_value})
      return
    logging.warning(
      "The checkpoint of the best evaluation (step %d, %s) is gone: the best is chosen among "
      "the evaluations from now on",
      self.best_step,
      self.best_value,
    )
    self.best_value = self.best_step = None

  def evaluator(self, evaluate: Callable[[Any, int], EvalResult]) -> Callable[[Any], dict]:
    """The loop's ``eval_fn(state) -> {name: float}`` from ``evaluate(params, step)``."""

    def eval_fn(state) -> dict[str, float]:
      step = int(jax.device_get(state.step))
      t0 = time.time()
      result = evaluate(state.params, step)
      self.seconds += time.time() - t0
      entry = {"step": step, **result.record}
      if result.primary is not None:
        entry["primary"] = float(result.primary)
      self.history = sorted(
        [h for h in self.history if h["step"] != step] + [json_safe(entry)],
        key=lambda h: h["step"],
      )
      if result.primary is not None and self._better(result.primary):
        self.best_value, self.best_step = float(result.primary), step
        if self.best_manager is not None:
          for later in self.best_manager.all_steps():
            if later > step:  # it keeps one checkpoint: the step saved would be pruned as oldest
              self.best_manager.delete(later)
          self.best_manager.save(step, state, meta={"best_value": self.best_value})
      self.outputs[step] = result.outputs
      self.outputs = {s: o for s, o in self.outputs.items() if s in (step, self.best_step)}
      if jax.process_index() == 0:
        write_json(
          self.path,
          {"history": self.history, "best_value": self.best_value, "best_step": self.best_step},
        )
      return dict(result.metrics)

    return eval_fn
