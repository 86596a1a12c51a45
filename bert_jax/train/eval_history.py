"""Evaluations during a run: their history, the best checkpoint, and the outputs kept for the end.

``EvalHistory(workdir, resumed_step, higher_is_better, best_manager)`` wraps a job's
``evaluate(params, step) -> EvalResult`` into the loop's ``eval_fn(state)``. Each evaluation is
appended to ``<workdir>/eval_history.json`` (``{"history": [...], "best_value", "best_step"}``);
a resumed run keeps the entries up to the step it resumed from. When ``best_manager`` is given
(``job.keep_best``), a state whose ``primary`` value beats every earlier one is saved there.
The task's outputs (e.g. dev predictions) of the best and the latest evaluation are kept in
memory, so that the end of a run can write them without predicting again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax

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
    self.history = [h for h in saved.get("history", []) if h["step"] <= (resumed_step or 0)]
    self.best_value = saved.get("best_value")
    self.best_step = saved.get("best_step")
    self.seconds = 0.0  # spent evaluating in this process's loop
    self.outputs: dict[int, Any] = {}  # step -> the task's outputs (best and latest only)

  def _better(self, value: float) -> bool:
    if self.best_value is None:
      return True
    return value > self.best_value if self.higher_is_better else value < self.best_value

  def evaluator(self, evaluate: Callable[[Any, int], EvalResult]) -> Callable[[Any], dict]:
    """The loop's ``eval_fn(state) -> {name: float}`` from ``evaluate(params, step)``."""

    def eval_fn(state) -> dict[str, float]:
      step = int(jax.device_get(state.step))
      t0 = time.time()
      result = evaluate(state.params, step)
      self.seconds += time.time() - t0
      self.history.append(json_safe({"step": step, **result.record}))
      if result.primary is not None and self._better(result.primary):
        self.best_value, self.best_step = float(result.primary), step
        if self.best_manager is not None:
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
