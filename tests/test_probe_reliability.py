"""The probe's behaviour on inputs it cannot score: a pre-training workdir (no main task), an
unreadable workdir file, slices where an attribute has no positive or ``require_attribute``
keeps nothing, and its progress lines while it works.

References are independent of the code under test: the pre-training workdir's config.json is
configs/pretrain.py's own, the attributes a slice lacks are recounted from the raw TSV column,
and the progress totals from the row counts and batch sizes."""

import collections
import dataclasses
import json
import logging
import shutil

import jax
import numpy as np
import pytest
from flax import traverse_util
from flax.linen import meta

from bert_jax.model import BertConfig, BertEncoder
from bert_jax.tools import probe
from bert_jax.tools import probe_attacker as probe_attacker
from bert_jax.train import progress as progress_lib
from configs import pretrain as pretrain_config
from configs import probe as probe_config

TINY = BertConfig(
  vocab_size=30522,  # MiniLM's vocabulary, the tokenizer the workdir carries
  hidden_size=32,
  num_hidden_layers=1,
  num_attention_heads=2,
  intermediate_size=64,
  max_position_embeddings=64,
)


def _random_params(shapes, seed=0):
  rng = np.random.default_rng(seed)
  flat = traverse_util.flatten_dict(meta.unbox(shapes))
  return traverse_util.unflatten_dict(
    {
      path: np.ones(s.shape, np.float32)
      if path[-1] == "scale"
      else np.zeros(s.shape, np.float32)
      if path[-1] == "bias"
      else rng.normal(0, 0.02, s.shape).astype(np.float32)
      for path, s in flat.items()
    }
  )


@pytest.fixture(scope="module")
def cola_dir(tmp_path_factory, shared_data):
  """A CoLA folder of every 60th training and every 20th dev sentence."""
  root = tmp_path_factory.mktemp("glue")
  (root / "CoLA").mkdir()
  for name, step in (("train", 60), ("dev", 20)):
    lines = (shared_data / "glue/CoLA" / f"{name}.tsv").read_text().splitlines(keepends=True)
    (root / "CoLA" / f"{name}.tsv").write_text("".join(lines[::step]))
  return root


@pytest.fixture(scope="module")
def pretrain_workdir(tmp_path_factory, minilm_dir):
  """A pre-training workdir as ``bert_jax.pretrain`` leaves it, small: the encoder's weights (a
  parameters-only export with MiniLM's vocabulary), head.json {"task": "pretraining"}, and
  configs/pretrain.py:tiny's config.json (which has no 'task' key)."""
  from bert_jax.formats.params_only import export_params_only
  from bert_jax.tokenize import load_tokenizer

  shapes = jax.eval_shape(BertEncoder(TINY).init, jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
  params = {"bert": _random_params(shapes["params"])}
  out = tmp_path_factory.mktemp("pretrain") / "tiny"
  head = {"task": "pretraining", "objective": "mlm"}
  export_params_only(str(out), params, TINY, head, load_tokenizer(minilm_dir))
  run_config = pretrain_config.get_config("tiny")
  assert "task" not in run_config  # what makes it a pre-training run's config
  (out / "config.json").write_text(run_config.to_json_best_effort())
  return out


def _config(init_checkpoint, data_dir, **kw):
  config = probe_config.get_config("cola_source")
  config.unlock()
  config.init_checkpoint = str(init_checkpoint)
  config.data_dir = str(data_dir)
  config.max_seq_length = 32
  config.eval_batch_size = 16
  config.attacker_epochs = 2
  config.direct_baseline = False
  config.require_attribute = True
  config.dev_fraction = 0.2  # 0.1 of this small slice holds out no 'l-93' sentence
  for k, v in kw.items():
    config[k] = v
  return config


def _fail_if_called(name):
  def fail(*args, **kwargs):
    raise AssertionError(f"{name} ran: the error should have come before any training")

  return fail


def test_pretraining_workdir_probes_with_main_task_null(
  tmp_path, cola_dir, pretrain_workdir, caplog
):
  caplog.set_level(logging.INFO)
  workdir = tmp_path / "probe"
  result = probe.run_probe(_config(pretrain_workdir, cola_dir), str(workdir))
  written = json.loads((workdir / "probe.json").read_text())
  assert written["main_task"] is None and result["main_task"] is None
  note = written["main_task_note"]
  assert note == (
    f"{pretrain_workdir} is a pre-training workdir ({pretrain_workdir / 'config.json'} names no "
    "'task'): there is no main task to score"
  )
  # Said in the log, and decided before the attacker trained (its result is logged after).
  messages = [r.getMessage() for r in caplog.records]
  said = [i for i, m in enumerate(messages) if m == f"probe: main_task is null: {note}"]
  trained = [i for i, m in enumerate(messages) if m.startswith("Attacker: epoch")]
  assert said and trained and said[0] < trained[0]
  # Each phase says when it starts (so no two silent phases add up), in order.
  starts = [
    "probe: loading the encoder ",
    "probe: reading cola and fitting its private attributes",
    "probe: representations (pooled) of attacker train ",
    "probe: attacker: training on ",
  ]
  found = [next(i for i, m in enumerate(messages) if m.startswith(s)) for s in starts]
  assert found == sorted(found)
  assert 0 <= written["test"]["privacy"] <= 1


def test_an_unreadable_workdir_file_fails_before_training_and_leaves_no_workdir(
  tmp_path, cola_dir, pretrain_workdir, monkeypatch
):
  broken = tmp_path / "broken"
  shutil.copytree(pretrain_workdir, broken)
  (broken / "config.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")  # not a JSON text file
  monkeypatch.setattr(probe, "compute_representations", _fail_if_called("the encoder"))
  monkeypatch.setattr(probe, "train_attacker", _fail_if_called("the attacker"))
  workdir = tmp_path / "probe"
  with pytest.raises(ValueError) as e:
    probe.run_probe(_config(broken, cola_dir), str(workdir))
  assert str(e.value).startswith(
    f"{broken / 'config.json'}: not UTF-8 text (byte 0x89 at offset 0)"
  )
  assert not workdir.exists()  # created by the probe, removed when it failed
  existing = tmp_path / "existing"
  existing.mkdir()
  with pytest.raises(ValueError, match="not UTF-8 text"):
    probe.run_probe(_config(broken, cola_dir), str(existing))
  assert existing.is_dir()  # the user's own folder is kept


def test_an_attribute_without_positives_is_refused_naming_it_and_the_split(
  tmp_path, cola_dir, pretrain_workdir, monkeypatch
):
  monkeypatch.setattr(probe, "compute_representations", _fail_if_called("the encoder"))
  monkeypatch.setattr(probe, "train_attacker", _fail_if_called("the attacker"))
  # CoLA's dev file is ordered by source: its first 12 rows (of this slice) lack some of the
  # five most frequent training sources.
  train_sources = [line.split("\t")[0] for line in (cola_dir / "CoLA/train.tsv").open()]
  counts = collections.Counter(train_sources)
  top5 = [s for s, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]]
  dev_sources = [line.split("\t")[0] for line in (cola_dir / "CoLA/dev.tsv").open()][:12]
  missing = [s for s in top5 if s not in dev_sources]
  assert missing and any(s in dev_sources for s in top5)
  config = _config(pretrain_workdir, cola_dir, max_eval_examples=12, require_attribute=False)
  workdir = tmp_path / "probe"
  with pytest.raises(ValueError) as e:
    probe.run_probe(config, str(workdir))
  listed = ", ".join(repr(s) for s in missing)
  attrs = "attribute" if len(missing) == 1 else "attributes"
  assert str(e.value) == (
    f"the test rows (CoLA dev): none of its 12 rows has private {attrs} {listed}; a privacy "
    "figure computed from zero positives is meaningless: use more rows (config.max_eval_examples "
    "takes the first rows of a file; 0 reads it all) or fewer attributes "
    "(config.num_private_attributes)"
  )
  assert "\n" not in str(e.value) and not workdir.exists()


def test_require_attribute_on_a_slice_without_attributes_names_the_real_cause():
  names = ("ks08", "l-93", "r-67")
  z_train, z_test = np.zeros((20, 3), int), np.eye(3, dtype=int)
  with pytest.raises(ValueError) as e:
    probe.select_rows(z_train, z_test, 0.1, 0, True, names, ("CoLA train", "CoLA dev"))
  message = str(e.value)
  assert message.startswith(
    "config.require_attribute keeps 0 of the 20 rows of CoLA train: only those with one of the "
    "private attributes ('ks08', 'l-93', 'r-67'), and the probe needs at least 2 there"
  )
  assert "dev_fraction" not in message
  with pytest.raises(ValueError, match=r"keeps 0 of the 4 rows of the test split: "):
    probe.select_rows(np.eye(3, dtype=int), np.zeros((4, 3), int), 0.5, 0, True, names)
  # Rows left, but too few for the held-out fraction: both keys named.
  z_train[:5, 0] = 1
  with pytest.raises(ValueError) as e:
    probe.select_rows(z_train, z_test, 0.05, 0, True, names)
  assert str(e.value).startswith(
    "config.dev_fraction=0.05 of 5 training rows with a private attribute "
    "(config.require_attribute) leaves 0 attacker-dev and 5 attacker-train rows"
  )


def test_representations_and_attacker_training_log_progress(monkeypatch):
  """Every batch and training step drives a ``Progress`` (a line at least every
  ``INTERVAL_SEC``; here every update) and the compilations run under a ``Heartbeat``."""
  lines, beats = [], []

  class EveryUpdate(progress_lib.Progress):
    def __init__(self, what, total=None, unit="batches", interval_sec=30.0, **kw):
      assert interval_sec == progress_lib.INTERVAL_SEC
      super().__init__(what, total, unit, interval_sec=0.0, log=lines.append)

  class Beat(progress_lib.Heartbeat):
    def __init__(self, what, interval_sec=30.0, **kw):
      beats.append(what)
      super().__init__(what, interval_sec)

  monkeypatch.setattr(probe_attacker, "Progress", EveryUpdate)
  monkeypatch.setattr(probe_attacker, "Heartbeat", Beat)
  config = dataclasses.replace(TINY, vocab_size=64)
  shapes = jax.eval_shape(
    BertEncoder(config).init, jax.random.PRNGKey(0), np.zeros((1, 8), np.int32)
  )
  params = _random_params(shapes["params"])
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 64, (10, 8)).astype(np.int32)
  arrays = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)}
  r = probe_attacker.compute_representations(config, params, arrays, "pooled", -1, "mean", 4, "x")
  assert r.shape == (10, 32)
  assert [line.split(",")[0] for line in lines] == [
    "probe: representations of x (10 rows): 1/3 batches (33%)",
    "probe: representations of x (10 rows): 2/3 batches (67%)",
    "probe: representations of x (10 rows): 3/3 batches (100%)",
    "probe: representations of x (10 rows): 3/3 batches (100%)",  # the closing line
  ]
  assert lines[-1].endswith("(done)")
  assert beats == ["probe: representations of x (10 rows): first batch of 8 tokens (compiling)"]
  lines.clear()
  z = np.array([[1, 0], [0, 1]] * 5)
  attrs = probe_attacker.Attributes(("a", "b"), "f1")
  split = {"train": r, "dev": r[:4], "test": r[4:]}
  zs = {"train": z, "dev": z[:4], "test": z[4:]}
  out = probe_attacker.train_attacker(split, zs, attrs, 8, epochs=2, batch_size=4)
  assert len(out["epochs"]) == 2
  steps = [line.split(",")[0] for line in lines]
  assert steps[:6] == [
    f"probe: attacker: training: {k}/6 steps ({100 * k / 6:.0f}%)" for k in range(1, 7)
  ]
  assert lines[-1].endswith("(done)")
  assert "probe: attacker: first training step (compiling)" in beats
  assert "probe: attacker: scoring epoch 2 on the dev rows" in beats
