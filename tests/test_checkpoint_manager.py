"""The Orbax checkpoint manager: round trip of state + input position + meta, keep-last-k,
refusing another model's checkpoint without touching it, the resume > pretrained > scratch
order with an exact report (the encoder alone for fine-tuning), load_params, and a failed
asynchronous save surfacing at the next check with nothing left behind."""

import asyncio
import errno
import json
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from bert_jax import parallel
from bert_jax.checkpoint import (
  CheckpointManager,
  CheckpointSaveError,
  atomic_write,
  load_params,
  merge_pretrained_params,
  read_json,
  replace_dir,
  restore_or_initialize,
  write_json,
)
from bert_jax.checkpoint import manager as manager_lib
from bert_jax.model import BertConfig, BertForPreTraining, BertForSequenceClassification
from bert_jax.train import optimizers
from bert_jax.train.state import abstract_train_state, init_train_state, state_with_params
from configs import common


def _setup(hidden=32, model_cls=BertForPreTraining, **kw):
  bert = BertConfig(
    vocab_size=100,
    hidden_size=hidden,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=2 * hidden,
    max_position_embeddings=16,
  )
  model = model_cls(bert, **kw)
  mesh = parallel.create_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  rules = parallel.normalize_rules(common.logical_axis_rules())
  tx = optimizers.create_optimizer(common.optimizer_config(), 1e-3)
  ids = jnp.zeros((1, 8), jnp.int32)
  if model_cls is BertForPreTraining:
    init = lambda rng: model.init(rng, ids, ids, ids, ids[:, :2])["params"]
  else:
    init = lambda rng: model.init(rng, ids, ids, ids)["params"]
  abstract, shardings = abstract_train_state(init, tx, mesh, rules, 0)
  make = lambda: init_train_state(init, tx, mesh, rules, 0, shardings)
  return bert, tx, abstract, shardings, make


def _listing(directory):
  out = {}
  for root, _, files in os.walk(directory):
    for f in files:
      p = os.path.join(root, f)
      out[p] = (os.path.getsize(p), os.path.getmtime(p))
  return out


def test_round_trip_keep_last_k_and_load_params(tmp_path):
  bert, _, abstract, shardings, make = _setup()
  state = make()
  manager = CheckpointManager(str(tmp_path), keep=2, async_save=True)
  for step in (1, 2, 3):
    state = state.replace(step=jnp.asarray(step, jnp.int32))
    manager.save(
      step, state, input_state={"epoch": 0, "position": step * 8}, meta={"phase": "seq128"}
    )
  manager.wait()
  assert manager.all_steps() == [2, 3]
  restored, input_state, meta = manager.restore(3, abstract)
  assert input_state == {"epoch": 0, "position": 24} and meta == {"phase": "seq128"}
  assert int(restored.step) == 3
  for a, b, s in zip(
    jax.tree_util.tree_leaves(restored),
    jax.tree_util.tree_leaves(state),
    jax.tree_util.tree_leaves(shardings),
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert a.sharding == s  # placed straight into the run's shardings
  manager.close()

  with open(tmp_path / "model_config.json", "w") as f:
    json.dump(bert.to_dict(), f)
  params, config, tokenizer = load_params(str(tmp_path))
  assert config == BertConfig.from_dict(bert.to_dict()) and tokenizer is None
  np.testing.assert_array_equal(
    params["bert"]["embeddings"]["word_embeddings"]["embedding"],
    np.asarray(state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]),
  )
  assert isinstance(params["mlm_output_bias"], np.ndarray)


def test_checkpoint_of_another_model_is_refused_and_left_untouched(tmp_path):
  _, _, _, _, make = _setup(hidden=32)
  manager = CheckpointManager(str(tmp_path), keep=2, async_save=False)
  manager.save(5, make(), input_state={}, meta={})
  manager.close()
  before = _listing(tmp_path)
  _, tx, abstract, shardings, make_other = _setup(hidden=64)
  manager = CheckpointManager(str(tmp_path), keep=2, async_save=False)
  with pytest.raises(
    ValueError,
    match=r"(?s)another model.*bert/embeddings/word_embeddings/"
    r"embedding: checkpoint \(100, 32\) vs model \(100, 64\)",
  ):
    restore_or_initialize(manager, abstract, make_other)
  manager.close()
  assert _listing(tmp_path) == before


def test_restore_order_resume_then_pretrained_then_scratch(tmp_path):
  _, tx, abstract, shardings, make = _setup(model_cls=BertForSequenceClassification, num_labels=3)
  with_params = lambda s, p: state_with_params(s, p, tx, shardings)
  manager = CheckpointManager(str(tmp_path / "run"), keep=2, async_save=False)
  state, inp, meta, report = restore_or_initialize(manager, abstract, make)
  assert report.source == "scratch" and inp == {} and meta == {}

  # A pre-trained checkpoint: encoder + MLM/NSP heads, no classifier.
  _, _, _, _, make_pre = _setup()
  pre_params = jax.tree_util.tree_map(np.asarray, jax.device_get(make_pre().params))
  pre_params = jax.tree_util.tree_map(lambda x: x + 1.0, pre_params)

  state, _, _, report = restore_or_initialize(
    manager,
    abstract,
    make,
    init_checkpoint="PRE",
    pretrained_params=lambda: pre_params,
    with_params=with_params,
  )
  assert report.source == "pretrained"
  assert report.not_loaded == [
    "mlm_LayerNorm/bias",
    "mlm_LayerNorm/scale",
    "mlm_output_bias",
    "mlm_transform/bias",
    "mlm_transform/kernel",
    "nsp/bias",
    "nsp/kernel",
  ]
  assert report.newly_initialized == ["classifier/bias", "classifier/kernel"]
  np.testing.assert_allclose(
    np.asarray(state.params["bert"]["pooler"]["kernel"]), pre_params["bert"]["pooler"]["kernel"]
  )
  assert (
    state.params["bert"]["pooler"]["kernel"].sharding
    == shardings.params["bert"]["pooler"]["kernel"]
  )
  assert int(state.opt_state[1][0].count) == 0  # a fresh optimizer state

  manager.save(7, state, input_state={"position": 3}, meta={"phase": "train"})
  manager.wait()
  state2, inp, meta, report = restore_or_initialize(
    manager,
    abstract,
    make,
    init_checkpoint="PRE",
    pretrained_params=lambda: pytest.fail("a resumed run reads no pretrained checkpoint"),
    with_params=with_params,
  )
  assert report.source == "resumed" and report.step == 7 and inp == {"position": 3}
  manager.close()


def test_merge_refuses_shape_mismatch():
  params = {"bert": {"w": np.zeros((2, 3))}, "head": np.zeros(2)}
  merged, report = merge_pretrained_params(
    params, {"bert": {"w": np.ones((2, 3))}, "extra": np.ones(1)}
  )
  assert report.loaded == ["bert/w"] and report.not_loaded == ["extra"]
  assert report.newly_initialized == ["head"]
  np.testing.assert_array_equal(merged["bert"]["w"], 1.0)
  with pytest.raises(ValueError, match=r"bert/w: checkpoint \(3, 3\) vs model \(2, 3\)"):
    merge_pretrained_params(params, {"bert": {"w": np.ones((3, 3))}}, "some/ckpt")


def test_pretrained_subtrees_take_the_encoder_only(tmp_path):
  """Fine-tuning from a fine-tuned checkpoint of the same shape: only "bert" is taken; its
  classifier (which would fit) is reported as not loaded and the new one is freshly drawn."""
  _, tx, abstract, shardings, make = _setup(model_cls=BertForSequenceClassification, num_labels=3)
  with_params = lambda s, p: state_with_params(s, p, tx, shardings)
  pre_params = jax.tree_util.tree_map(lambda x: np.asarray(x) + 1.0, jax.device_get(make().params))
  manager = CheckpointManager(str(tmp_path / "run"), keep=2, async_save=False)
  state, _, _, report = restore_or_initialize(
    manager,
    abstract,
    make,
    init_checkpoint="FT",
    pretrained_params=pre_params,  # already loaded
    pretrained_subtrees=("bert",),
    with_params=with_params,
  )
  assert report.source == "pretrained"
  assert report.not_loaded == ["classifier/bias", "classifier/kernel"]
  assert report.newly_initialized == ["classifier/bias", "classifier/kernel"]
  fresh = make().params
  np.testing.assert_array_equal(
    np.asarray(state.params["classifier"]["kernel"]), np.asarray(fresh["classifier"]["kernel"])
  )
  np.testing.assert_array_equal(
    np.asarray(state.params["bert"]["pooler"]["kernel"]), pre_params["bert"]["pooler"]["kernel"]
  )
  with pytest.raises(ValueError, match=r"^NOENC: no 'bert' parameters found"):
    restore_or_initialize(
      manager,
      abstract,
      make,
      init_checkpoint="NOENC",
      pretrained_params={"classifier": pre_params["classifier"]},
      pretrained_subtrees=("bert",),
      with_params=with_params,
    )
  manager.close()


def _wait_for_save_threads():
  """Until Orbax's background threads of an asynchronous save (commit, finalize) have ended.
  Polled, not joined: Orbax's finalize thread re-raises its error in a thread that joins it."""
  names = ("async_save", "save_finalize")
  while any(t.name in names for t in threading.enumerate()):
    time.sleep(0.01)


def _failing_json_save(release: threading.Event):
  """A JSON item writer that fails like a full disk once ``release`` is set (in Orbax's
  background thread, after ``save`` returned)."""

  async def save(self, x, directory):
    while not release.is_set():
      await asyncio.sleep(0.01)
    raise OSError(errno.ENOSPC, "No space left on device")

  return save


def test_failed_async_save_is_raised_by_the_next_check_and_leaves_nothing(tmp_path, monkeypatch):
  _, _, _, _, make = _setup()
  state = make()
  release = threading.Event()
  monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", _failing_json_save(release))
  manager = CheckpointManager(str(tmp_path), keep=2, async_save=True)
  manager.save(5, state, input_state={"position": 5}, meta={})
  for _ in range(3):  # steps while the save is still being written: nothing to report
    manager.check_for_errors()
  release.set()
  _wait_for_save_threads()
  tmp_dirs = lambda: list((tmp_path / "checkpoints").glob("5.orbax-checkpoint-tmp*"))
  assert tmp_dirs()  # what the failed save left, before the check
  with pytest.raises(CheckpointSaveError, match=r"step 5 .*No space left on device"):
    manager.check_for_errors()  # the first check after the save ended
  assert tmp_dirs() == [] and manager.all_steps() == []
  manager.check_for_errors()  # reported once
  monkeypatch.undo()  # the disk has room again: the next save works
  manager.save(6, state, input_state={"position": 6}, meta={})
  manager.wait()
  assert manager.all_steps() == [6]
  manager.close()


def test_orbax_writer_threads_are_found_by_their_module(tmp_path, monkeypatch):
  # A failed save's other writes are joined by the module of Orbax's writer thread class
  # (manager._ORBAX_WRITER_MODULE, a private Orbax module): this fails when a release moves it.
  _, _, _, _, make = _setup()
  release = threading.Event()
  monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", _failing_json_save(release))
  manager = CheckpointManager(str(tmp_path), keep=2, async_save=True)
  manager.save(4, make(), input_state={}, meta={})
  writers = lambda: [
    t
    for t in threading.enumerate()
    if type(t).__module__.startswith(manager_lib._ORBAX_WRITER_MODULE)
  ]
  assert writers(), (
    f"no thread of {manager_lib._ORBAX_WRITER_MODULE} during an async save: Orbax moved its "
    "writer threads; update _ORBAX_WRITER_MODULE in bert_jax/checkpoint/manager.py. Threads: "
    f"{[(t.name, type(t).__module__) for t in threading.enumerate()]}"
  )
  release.set()
  with pytest.raises(CheckpointSaveError, match=r"step 4 .*No space left on device"):
    manager.wait()
  assert writers() == []  # all joined before the temporary directory was removed
  assert os.listdir(tmp_path / "checkpoints") == []
  manager.close()


def test_failed_async_save_is_raised_by_wait(tmp_path, monkeypatch):
  _, _, _, _, make = _setup()
  release = threading.Event()
  release.set()
  monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", _failing_json_save(release))
  manager = CheckpointManager(str(tmp_path), keep=2, async_save=True)
  manager.save(3, make(), input_state={}, meta={})
  with pytest.raises(CheckpointSaveError, match=r"step 3 .*No space left on device"):
    manager.wait()
  assert os.listdir(tmp_path / "checkpoints") == []
  manager.close()


def test_file_primitives_leave_nothing_half_written(tmp_path, monkeypatch):
  path = tmp_path / "a.json"
  write_json(path, {"b": 1, "a": [1, 2]})
  assert json.loads(path.read_text()) == {"a": [1, 2], "b": 1} and read_json(path)["b"] == 1

  def full_disk(self, target):
    raise OSError(errno.ENOSPC, "No space left on device")

  with monkeypatch.context() as m:  # the temp file is written, then the rename fails
    m.setattr(type(epath.Path(tmp_path)), "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
      write_json(path, {"b": 2})
  assert os.listdir(tmp_path) == ["a.json"] and read_json(path)["b"] == 1  # old file kept
  (tmp_path / "bad.json").write_text('{"a": 1,}')
  with pytest.raises(ValueError, match=r"bad\.json: not valid JSON"):
    read_json(tmp_path / "bad.json")
  with pytest.raises(FileNotFoundError, match=r"absent\.json"):
    read_json(tmp_path / "absent.json")
  binary = tmp_path / "sub" / "binary.json"
  binary.parent.mkdir()
  binary.write_bytes(b"\x1f\x8b\x08\x00")  # gzip, say
  with pytest.raises(ValueError, match=r"binary\.json: not UTF-8 text \(byte 0x8b at offset 1\)"):
    read_json(binary)

  def failing(tmp):
    with open(tmp, "w") as f:
      f.write("partial")
    raise OSError(errno.ENOSPC, "No space left on device")

  with pytest.raises(OSError):
    atomic_write(tmp_path / "a.json", failing)
  assert sorted(os.listdir(tmp_path)) == ["a.json", "bad.json", "sub"]

  out = tmp_path / "out"
  with replace_dir(out) as tmp:
    open(os.path.join(tmp, "one"), "w").close()
  with pytest.raises(FileExistsError, match="not empty"):
    with replace_dir(out):
      pass
  with pytest.raises(RuntimeError):
    with replace_dir(out, overwrite=True) as tmp:
      open(os.path.join(tmp, "two"), "w").close()
      raise RuntimeError("the export failed")
  assert os.listdir(out) == ["one"]  # left as it was
  with replace_dir(out, overwrite=True) as tmp:
    open(os.path.join(tmp, "two"), "w").close()
  assert os.listdir(out) == ["two"]  # replaced whole: nothing of before survives
  assert sorted(os.listdir(tmp_path)) == ["a.json", "bad.json", "out", "sub"]  # no temp left


def _orbax_tracebacks(records):
  return [r for r in records if r.exc_info and "orbax" in r.pathname and r.levelno >= 30]


def test_disk_full_during_a_save_is_one_clear_error_and_leaves_no_tmp(
  tmp_path, monkeypatch, caplog, capfd
):
  """Synchronous (fine-tuning's default) and asynchronous saves on a full disk: one error naming
  the step, the directory and ENOSPC; Orbax's writer threads' tracebacks condensed; nothing of
  the save left behind."""
  import logging as std_logging

  _, _, _, _, make = _setup()
  state = make()
  release = threading.Event()
  release.set()
  monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", _failing_json_save(release))
  for async_save in (False, True):
    workdir = tmp_path / f"async_{async_save}"
    manager = CheckpointManager(str(workdir), keep=2, async_save=async_save)
    with caplog.at_level(std_logging.INFO):
      with pytest.raises(CheckpointSaveError) as e:
        manager.save(5, state, input_state={}, meta={})
        manager.wait()
      _wait_for_save_threads()
    message = str(e.value)
    assert message == (
      f"saving the checkpoint of step 5 to {workdir / 'checkpoints'} failed: ENOSPC: No space "
      "left on device (its temporary directory was removed)"
    )
    assert os.listdir(workdir / "checkpoints") == []
    assert _orbax_tracebacks(caplog.records) == [], caplog.text
    assert "Traceback" not in capfd.readouterr().err
    caplog.clear()
    manager.close()


def test_an_interrupted_saves_tmp_dir_is_removed_when_the_next_run_starts(tmp_path, caplog):
  import logging as std_logging

  _, _, _, _, make = _setup()
  manager = CheckpointManager(str(tmp_path), keep=2, async_save=False)
  manager.save(3, make(), input_state={}, meta={})
  manager.close()
  stale = tmp_path / "checkpoints" / "6.orbax-checkpoint-tmp-1234"
  (stale / "state").mkdir(parents=True)
  (stale / "state" / "half_written").write_bytes(b"x" * 10)
  manager = CheckpointManager(str(tmp_path), keep=2, async_save=False)
  assert (
    stale.exists()
  )  # opening a workdir (e.g. load_params beside a running save) removes nothing
  with caplog.at_level(std_logging.INFO):
    assert manager.remove_incomplete() == [str(stale)]
  assert not stale.exists() and manager.all_steps() == [3]
  assert "6.orbax-checkpoint-tmp-1234, left by an interrupted save" in caplog.text
  manager.close()
