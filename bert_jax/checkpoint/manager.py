"""Orbax checkpoints of a bert_jax run, and where a run's parameters come from.

A checkpoint (``<workdir>/checkpoints/<step>/``) holds three items:
  state  the TrainState: params, optimizer state, step, rng (sharded arrays, async save)
  input  the input pipeline's position: ``PretrainInput.get_state()`` (JSON)
  meta   small JSON facts about the run at that step (e.g. the curriculum phase)

  manager = CheckpointManager(workdir, keep=3, async_save=True)
  state, input_state, meta, report = restore_or_initialize(
      manager, abstract_state, init_fn, init_checkpoint=path,
      pretrained_params=lambda: bert_jax.formats.load_pretrained(path).params,
      pretrained_subtrees=("bert",),  # fine-tuning: the encoder only
      with_params=lambda state, params: state_with_params(state, params, tx, shardings))
  manager.save(step, state, input_state={...}, meta={...})
  manager.check_for_errors()  # after every step: a failed background save raises here
  manager.remove_incomplete()  # a run's start, under its workdir lock: an earlier crash's tmp dirs

``restore_or_initialize`` follows one documented order:
  1. resume this run: the latest complete checkpoint in ``workdir/checkpoints``;
  2. else initialise from a pretrained checkpoint (``init_checkpoint``, whose params the caller
     passes or gives a loader for: this package never imports ``bert_jax.formats``): params
     only, fresh optimizer state; it reports exactly which checkpoint tensors were not loaded and
     which params were newly initialised, and refuses a tensor whose shape differs;
  3. else from scratch.
A checkpoint whose arrays do not have the shapes of this run's model is refused with an error
naming them, and left untouched. ``load_params(workdir)`` gives other tools (fine-tuning,
export, feature extraction) the latest params of a bert_jax workdir as numpy arrays.
"""

from __future__ import annotations

import dataclasses
import errno
import logging as std_logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bert_jax.checkpoint.files import read_json
from bert_jax.model.config import BertConfig
from bert_jax.tokenize import load_tokenizer


def _path_str(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _flat(tree: Any) -> dict[str, Any]:
  return {_path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


# The module of the thread class that runs each of an Orbax save's writes (its commit futures;
# orbax-checkpoint 0.12.8: ``orbax.checkpoint._src.futures.future._SignalingThread``). A private
# module, read here only: Orbax has no public way to wait for the writes still running after one
# failed (``wait_until_finished`` returns at the first error), and the other threads a save starts
# (its asyncio and metadata thread pools) live on, so "the threads the save started" cannot be
# joined instead. tests/test_checkpoint_manager.py fails when an Orbax release moves this class.
_ORBAX_WRITER_MODULE = "orbax.checkpoint._src.futures"
_ORBAX_SOURCE = os.path.join("orbax", "checkpoint")
_WRITER_TIMEOUT_SECS = 600.0
_TMP_GLOB = "*.orbax-checkpoint-tmp*"


class CheckpointSaveError(RuntimeError):
  """A checkpoint save failed (disk full, permissions, ...), in the foreground or background."""


class _CondenseWriterErrors(std_logging.Filter):
  """Orbax's background threads log each failed write with its traceback (``logging.exception``):
  a full disk gave hundreds of lines, one traceback per thread, before the save's own error.
  These records keep their one-line message, without the traceback, at INFO (the console of an
  entry point shows no library INFO); the error reaches the caller, who reports it once."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.exc_info and _ORBAX_SOURCE in record.pathname:
      record.exc_info, record.exc_text, record.stack_info = None, None, None
      record.levelno, record.levelname = std_logging.INFO, "INFO"
    return True


def _condense_orbax_writer_errors() -> None:
  logger = std_logging.getLogger("absl")  # Orbax logs through absl.logging
  if not any(isinstance(f, _CondenseWriterErrors) for f in logger.filters):
    logger.addFilter(_CondenseWriterErrors())


def _describe_error(error: BaseException) -> str:
  """'ENOSPC: No space left on device' for an OSError (also one wrapped by Orbax), else
  'Type: message'."""
  seen, e = set(), error
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in errno.errorcode:
      return f"{errno.errorcode[e.errno]}: {e.strerror or e}"
    e = e.__cause__ or e.__context__
  return f"{type(error).__name__}: {error}"


class CheckpointManager:
  """An Orbax CheckpointManager over ``<workdir>/checkpoints`` keeping the last ``keep`` (and,
  with ``keep_period``, every multiple of it).

  A save that fails is a CheckpointSaveError naming the step, the directory and the cause
  (``ENOSPC: No space left on device``): a synchronous one raises it from ``save``, an
  asynchronous one from the first ``check_for_errors()`` (cheap, never blocks: the training
  loop calls it after every step) or ``wait()`` after it ended, or the next ``save``. Its
  temporary directory (``<step>.orbax-checkpoint-tmp*``) is removed then, so nothing
  half-written is left behind, and Orbax's writer threads' tracebacks of the failure are
  condensed to one INFO line each (``_CondenseWriterErrors``). ``remove_incomplete()`` removes
  the temporary directories an earlier process left when it died during a save.
  """

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True, keep_period: int = 0):
    """``keep_period`` > 0 also keeps every checkpoint whose step is a multiple of it."""
    workdir = workdir if "://" in str(workdir) else os.path.abspath(workdir)
    self.directory = str(epath.Path(workdir) / "checkpoints")
    options = ocp.CheckpointManagerOptions(
      max_to_keep=keep,
      keep_period=keep_period or None,
      create=True,
      enable_async_checkpointing=async_save,
    )
    handlers = dict(
      state=ocp.PyTreeCheckpointHandler(),
      input=ocp.JsonCheckpointHandler(),
      meta=ocp.JsonCheckpointHandler(),
    )
    self._mngr = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)
    _condense_orbax_writer_errors()
    self._async = async_save
    self._pending: int | None = None  # the step of an asynchronous save not yet checked

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._mngr.all_steps())

  def save(
    self, step: int, state: Any, input_state: dict | None = None, meta: dict | None = None
  ) -> None:
    """Saves (asynchronously when configured); a step already saved is skipped. Waits for the
    previous asynchronous save first, raising its error if it failed."""
    self.wait()
    if step in self._mngr.all_steps():
      return
    self._pending = step if self._async else None
    try:
      self._mngr.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.PyTreeSave(state),
          input=ocp.args.JsonSave(input_state or {}),
          meta=ocp.args.JsonSave(meta or {}),
        ),
        force=True,
      )
    except Exception as e:
      self._pending = None
      raise self._save_failed(step, e) from e

  def delete(self, step: int) -> None:
    """Removes checkpoint ``step`` (nothing when there is none)."""
    self.wait()
    if step in self._mngr.all_steps():
      self._mngr.delete(step)

  def remove_incomplete(self) -> list[str]:
    """Removes the temporary directories (``<step>.orbax-checkpoint-tmp*``) that a process which
    died during a save left, logging each; returns their paths. Only for the run that holds the
    workdir (its lock): another run's save in progress has such a directory too."""
    self.wait()
    removed = []
    if jax.process_index() == 0:
      for tmp in sorted(epath.Path(self.directory).glob(_TMP_GLOB)):
        logging.warning("Removing %s, left by an interrupted save of an earlier run", tmp)
        tmp.rmtree(missing_ok=True)
        removed.append(str(tmp))
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("bert_jax_remove_incomplete")
    self._mngr.reload()
    return removed

  def _save_failed(self, step: int, error: Exception) -> CheckpointSaveError:
    """Removes what the failed save of ``step`` left; the error to raise."""
    self._remove_partial(step)
    return CheckpointSaveError(
      f"saving the checkpoint of step {step} to {self.directory} failed: "
      f"{_describe_error(error)} (its temporary directory was removed)"
    )

  def check_compatible(self, step: int, abstract_state: Any) -> None:
    """ValueError (naming the arrays) when checkpoint ``step`` does not fit ``abstract_state``."""
    saved = _flat(self._mngr.item_metadata(step)["state"])
    wanted = _flat(abstract_state)
    problems = []
    for name, x in wanted.items():
      m = saved.get(name)
      if m is None:
        problems.append(f"{name}: missing from the checkpoint")
      elif tuple(m.shape) != tuple(x.shape):
        problems.append(f"{name}: checkpoint {tuple(m.shape)} vs model {tuple(x.shape)}")
    problems += [
      f"{name}: in the checkpoint, not in the model" for name in saved if name not in wanted
    ]
    if problems:
      shown = "\n  ".join(problems[:10]) + ("\n  ..." if len(problems) > 10 else "")
      raise ValueError(
        f"{self.directory}/{step} holds a checkpoint of another model or optimizer "
        f"({len(problems)} array(s) differ):\n  {shown}\nUse another --workdir, or move "
        "the old checkpoints away; nothing was changed."
      )

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict, dict]:
    """(state placed as in ``abstract_state``'s shardings, input position, meta)."""
    self.check_compatible(step, abstract_state)
    out = self._mngr.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
          abstract_state, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state)
        ),
        input=ocp.args.JsonRestore(),
        meta=ocp.args.JsonRestore(),
      ),
    )
    return out["state"], dict(out["input"] or {}), dict(out["meta"] or {})

  def restore_params(self, step: int | None = None) -> Any:
    """The params of checkpoint ``step`` (default: latest) as numpy arrays on the host."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    meta = self._mngr.item_metadata(step)["state"]
    params_meta = meta["params"]
    restore_args = jax.tree_util.tree_map(
      lambda _: ocp.RestoreArgs(restore_type=np.ndarray), params_meta
    )
    item = jax.tree_util.tree_map(lambda m: np.zeros(m.shape, m.dtype), params_meta)
    out = self._mngr.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
          item={"params": item}, restore_args={"params": restore_args}, partial_restore=True
        )
      ),
    )
    return out["state"]["params"]

  def check_for_errors(self) -> None:
    """Raises CheckpointSaveError if an asynchronous save has ended with an error; returns at
    once otherwise (also while a save is still running)."""
    if self._pending is not None and not self._mngr.is_saving_in_progress():
      self.wait()  # the save has ended: this returns at once, raising its error if any

  def wait(self) -> None:
    """Blocks until any asynchronous save has finished; CheckpointSaveError if it failed."""
    step, self._pending = self._pending, None
    try:
      self._mngr.wait_until_finished()
    except Exception as e:
      if step is None:
        raise
      raise self._save_failed(step, e) from e

  def _remove_partial(self, step: int) -> None:
    """Removes what a failed save of ``step`` left: Orbax's temporary directory.

    Orbax reports the first failed write while the save's other writes may still be running
    in their own threads (its commit futures, found by ``_ORBAX_WRITER_MODULE``); they are
    waited for first, or they would write into the directory again after it was removed.
    """
    for t in threading.enumerate():
      if type(t).__module__.startswith(_ORBAX_WRITER_MODULE):
        threading.Thread.join(t, timeout=_WRITER_TIMEOUT_SECS)  # never raises its error
    if jax.process_index() != 0:
      return
    for tmp in epath.Path(self.directory).glob(f"{step}.orbax-checkpoint-tmp*"):
      logging.info("Removing %s, left by the failed save of step %d", tmp, step)
      tmp.rmtree(missing_ok=True)

  def close(self) -> None:
    """Waits for an asynchronous save (CheckpointSaveError if it failed), then closes."""
    try:
      self.wait()
    finally:
      self._mngr.close()


@dataclasses.dataclass
class InitReport:
  """How a run's parameters were obtained."""

  source: str  # "resumed" | "pretrained" | "scratch"
  step: int = 0
  path: str = ""
  loaded: list[str] = dataclasses.field(default_factory=list)
  not_loaded: list[str] = dataclasses.field(default_factory=list)  # in checkpoint, unused
  newly_initialized: list[str] = dataclasses.field(default_factory=list)  # in model, not loaded

  def describe(self) -> str:
    if self.source == "resumed":
      return f"resumed from {self.path} at step {self.step}"
    if self.source == "scratch":
      return "initialised from scratch"
    return (
      f"initialised from {self.path}: {len(self.loaded)} tensors loaded; not loaded "
      f"(in the checkpoint, unused): {self.not_loaded or 'none'}; newly initialised: "
      f"{self.newly_initialized or 'none'}"
    )


def merge_pretrained_params(
  params: Any, pretrained: Any, path: str = "pretrained"
) -> tuple[Any, InitReport]:
  """``params`` (a nested dict of arrays) with every tensor of ``pretrained`` that the model
  has, by name. Shape mismatches raise ValueError; the report lists the rest."""
  target = _flat(params)
  source = _flat(pretrained)
  mismatched = [
    f"{k}: checkpoint {tuple(np.shape(source[k]))} vs model {tuple(target[k].shape)}"
    for k in target
    if k in source and tuple(np.shape(source[k])) != tuple(target[k].shape)
  ]
  if mismatched:
    raise ValueError(
      f"{path}: tensors whose shapes differ from the model's:\n  " + "\n  ".join(mismatched)
    )
  report = InitReport(
    "pretrained",
    path=path,
    loaded=sorted(k for k in target if k in source),
    not_loaded=sorted(k for k in source if k not in target),
    newly_initialized=sorted(k for k in target if k not in source),
  )

  def pick(p, x):
    name = _path_str(p)
    return np.asarray(source[name]) if name in source else x

  return jax.tree_util.tree_map_with_path(pick, params), report


def restore_or_initialize(
  manager: CheckpointManager,
  abstract_state: Any,
  init_fn: Callable[[], Any],
  *,
  init_checkpoint: str = "",
  pretrained_params: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
  pretrained_subtrees: Sequence[str] | None = None,
  with_params: Callable[[Any, Any], Any] | None = None,
) -> tuple[Any, dict, dict, InitReport]:
  """(state, input position, meta, report) by the order in the module docstring. Logs nothing:
  the caller reports ``report.describe()`` (once).

  Args:
    manager: the run's checkpoints (resumed from when it holds one).
    abstract_state: the run's state as ``jax.ShapeDtypeStruct`` with shardings.
    init_fn: ``init_fn()`` makes a fresh sharded state.
    init_checkpoint: the pretrained checkpoint's path, for the report and errors; empty: none
      (from scratch).
    pretrained_params: its params (a nested dict of host arrays), already loaded, or a
      zero-argument loader of them, e.g. ``lambda: bert_jax.formats.load_pretrained(path).params``,
      called only when there is nothing to resume (a resumed run never reads the pretrained
      checkpoint). Required with ``init_checkpoint``: this package reads only its own run state
      and never imports the formats (``bert_jax.formats`` imports it).
    pretrained_subtrees: take only these top-level subtrees of the pretrained params (e.g.
      ``("bert",)``, the encoder, for fine-tuning); every tensor of the others is listed in the
      report's ``not_loaded``. A requested subtree the checkpoint lacks is a ValueError. None:
      take every tensor the model has.
    with_params: ``with_params(state, host_params)`` returns the state with new params and a
      fresh optimizer state (``bert_jax.train.state.state_with_params``).
  """
  step = manager.latest_step()
  if step is not None:
    state, input_state, meta = manager.restore(step, abstract_state)
    return state, input_state, meta, InitReport("resumed", step=step, path=manager.directory)
  state = init_fn()
  if not init_checkpoint:
    return state, {}, {}, InitReport("scratch")
  if pretrained_params is None or with_params is None:
    raise ValueError(
      f"init_checkpoint={init_checkpoint!r} needs pretrained_params= (its params or a loader, "
      "e.g. lambda: bert_jax.formats.load_pretrained(path).params) and with_params="
    )
  pretrained = dict(pretrained_params() if callable(pretrained_params) else pretrained_params)
  unused = []
  if pretrained_subtrees is not None:
    missing = [k for k in pretrained_subtrees if k not in pretrained]
    if missing:
      raise ValueError(
        f"{init_checkpoint}: no {' / '.join(map(repr, missing))} parameters found (it has: "
        f"{', '.join(sorted(pretrained)) or 'none'})"
      )
    unused = sorted(_flat({k: v for k, v in pretrained.items() if k not in pretrained_subtrees}))
    pretrained = {k: pretrained[k] for k in pretrained_subtrees}
  host_params = (
    jax.tree_util.tree_map(np.asarray, jax.device_get(state.params))
    if jax.process_count() == 1
    else multihost_utils.process_allgather(state.params, tiled=True)
  )
  merged, report = merge_pretrained_params(host_params, pretrained, init_checkpoint)
  report.not_loaded = sorted(report.not_loaded + unused)
  return with_params(state, merged), {}, {}, report


def load_params(workdir: str, step: int | None = None):
  """(params as numpy, BertConfig, tokenizer) from the latest checkpoint of a bert_jax workdir.

  The tokenizer is None when the workdir holds no tokenizer files.
  """
  config_path = epath.Path(workdir) / "model_config.json"
  if not config_path.exists():
    raise FileNotFoundError(f"{workdir} is not a bert_jax workdir: no model_config.json")
  config = BertConfig.from_dict(read_json(config_path), source=str(config_path))
  manager = CheckpointManager(workdir, async_save=False)
  try:
    params = manager.restore_params(step)
  finally:
    manager.close()
  tokenizer = None
  if any((epath.Path(workdir) / n).exists() for n in ("vocab.txt", "sentencepiece.model")):
    tokenizer = load_tokenizer(workdir)
  return params, config, tokenizer
