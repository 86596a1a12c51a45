"""The privacy probe (Coavoux, Narayan and Cohen 2018): metrics against scikit-learn, r(x) against
the encoder run without batching or length cuts, the attacker on planted and random attributes,
epoch selection, bad input, and ``python -m bert_jax.probe`` end to end on a tiny model."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from flax.linen import meta
from float_tolerance import assert_model_close
from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score

from bert_jax.model import BertConfig, BertEncoder
from bert_jax.tasks.privacy import metrics as pm
from bert_jax.tools import probe
from bert_jax.tools import probe_attacker as probe_attacker
from configs import probe as probe_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = BertConfig(
  vocab_size=64,
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=2,
  intermediate_size=64,
  max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def tiny_params():
  """A random tiny encoder: N(0, 0.02) weights, LayerNorm scales 1 and biases 0 (BERT's init),
  drawn in numpy (no compilation)."""
  shapes = jax.eval_shape(BertEncoder(TINY).init, jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
  return _random_params(shapes["params"])


def _random_params(shapes):
  rng = np.random.default_rng(0)
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


def _rows(n, length, seed, first_token=None):
  """Random token rows [CLS] w... [SEP] of random lengths; ``first_token`` (N,) replaces w_1."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((n, length), np.int32)
  mask = np.zeros((n, length), np.int32)
  for i, real in enumerate(rng.integers(6, length + 1, n)):
    ids[i, :real] = np.r_[2, rng.integers(10, TINY.vocab_size, real - 2), 3]
    mask[i, :real] = 1
  if first_token is not None:
    ids[:, 1] = first_token
  return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}


# --- metrics -----------------------------------------------------------------------------------
Z = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 0], [1, 0, 1], [0, 0, 0]])
P = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 0], [1, 0, 0], [0, 1, 0]])


def test_metrics_match_sklearn():
  for metric in ("accuracy", "f1"):
    m = pm.attack_metrics(Z, P, ["a", "b", "c"], metric)
    for k, name in enumerate("abc"):
      got = m["per_attribute"][name]
      assert got["accuracy"] == pytest.approx(accuracy_score(Z[:, k], P[:, k]))
      assert got["f1"] == pytest.approx(f1_score(Z[:, k], P[:, k], zero_division=0))
      if P[:, k].any():
        assert got["precision"] == pytest.approx(precision_score(Z[:, k], P[:, k]))
      else:  # a ratio over no positive prediction: null, not sklearn's zero_division stand-in
        assert got["precision"] is None
      assert got["recall"] == pytest.approx(recall_score(Z[:, k], P[:, k], zero_division=0))
      assert got["support"] == Z[:, k].sum() and got["rows"] == 6
    mean_acc = np.mean([accuracy_score(Z[:, k], P[:, k]) for k in range(3)])
    micro = f1_score(Z, P, average="micro")  # TP/FP/FN pooled over every (row, attribute) cell
    assert m["mean_accuracy"] == pytest.approx(mean_acc)
    assert m["f1_micro"] == pytest.approx(micro)
    assert m["f1_macro"] == pytest.approx(f1_score(Z, P, average="macro", zero_division=0))
    assert m["privacy"] == pytest.approx(1 - (mean_acc if metric == "accuracy" else micro))
  # by hand: TP 4, FP 2, FN 2 -> F = 8 / 12
  assert pm.attack_metrics(Z, P, "abc", "f1")["privacy"] == pytest.approx(1 - 8 / 12)
  # No gold positive of an attribute: its recall and F1 (and 1 - F = 1) would come from nothing.
  for metric in ("accuracy", "f1"):
    with pytest.raises(ValueError) as e:
      pm.attack_metrics(np.zeros((4, 2), int), np.zeros((4, 2), int), "ab", metric, "dev rows")
    assert str(e.value).startswith(
      "dev rows: none of its 4 rows has private attributes 'a', 'b'; a privacy figure"
    )
  with pytest.raises(ValueError, match=r"the split: none of its 2 rows has private attribute 'b';"):
    pm.attack_metrics(np.array([[1, 0], [0, 0]]), np.ones((2, 2), int), "ab", "f1")


def test_majority_baseline_by_hand():
  z = np.array([[1, 0, 1], [1, 0, 0], [0, 1, 1], [1, 0, 0]])
  assert pm.majority_values(z).tolist() == [1, 0, 0]  # the last column ties: 0
  pred = pm.majority_predictions(z, 5)
  assert pred.shape == (5, 3) and (pred == [1, 0, 0]).all()
  test = np.array([[1, 1, 0], [0, 0, 1]])
  m = pm.attack_metrics(test, pm.majority_predictions(z, 2), "xyz", "accuracy")
  assert m["mean_accuracy"] == pytest.approx((1 / 2 + 1 / 2 + 1 / 2) / 3)
  with pytest.raises(ValueError, match="0/1"):
    pm.attack_metrics(np.array([[2]]), np.array([[1]]), "x", "accuracy")
  with pytest.raises(ValueError, match="privacy metric"):
    pm.attack_metrics(Z, P, "abc", "auc")


def test_select_epoch_takes_the_earliest_dev_worst_privacy():
  assert pm.select_epoch([0.5, 0.3, 0.4, 0.3]) == 1
  assert pm.select_epoch([0.2]) == 0
  with pytest.raises(ValueError):
    pm.select_epoch([])


# --- representations ---------------------------------------------------------------------------
def test_representations_match_the_unbatched_encoder(tiny_params):
  arrays = _rows(13, 40, seed=1)  # 13 rows, batches of 4: padding and length cuts to 32 / 40
  apply = jax.jit(BertEncoder(TINY).apply, static_argnames="output_hidden_states")
  out = apply(
    {"params": tiny_params},
    *(arrays[k] for k in probe_attacker.INPUT_KEYS),
    output_hidden_states=True,
  )
  hidden = [np.asarray(h) for h in out["hidden_states"]]
  m = arrays["input_mask"][..., None].astype(np.float64)
  mean_k = [(h * m).sum(1) / m.sum(1) for h in hidden]

  def reps(mode, layer=-1, pooling="mean"):
    return probe_attacker.compute_representations(
      TINY, tiny_params, arrays, mode, layer, pooling, batch_size=4
    )

  # Other batches, other float32 orders (float_tolerance, rule 2; the mean adds L terms).
  length = arrays["input_mask"].shape[1]
  assert_model_close(reps("pooled"), out["pooled_output"], TINY, length)
  cls_k = reps("scalar_mix", pooling="cls")  # [CLS] of every hidden state, the embeddings first
  assert_model_close(cls_k, np.stack([h[:, 0] for h in hidden], 1), TINY, length)
  mixed = reps("scalar_mix")
  assert mixed.shape == (13, 3, 32)
  assert_model_close(mixed, np.stack(mean_k, 1), TINY, 2 * length)
  # The attacker's mix of the pooled layers equals pooling the mixed token states (linearity).
  attacker = probe_attacker.Attacker(2, 8, scalar_mix=True)
  params = jax.jit(attacker.init)(jax.random.PRNGKey(1), mixed[:1])["params"]
  params["scalar_mix"] = {"weights": jnp.array([0.3, -1.0, 2.0]), "gamma": jnp.array(1.7)}
  s = np.exp([0.3, -1.0, 2.0]) / np.exp([0.3, -1.0, 2.0]).sum()
  token_mix = 1.7 * sum(s[k] * hidden[k] for k in range(3))
  ref_r = (token_mix * m).sum(1) / m.sum(1)
  ref = np.maximum(ref_r @ params["hidden"]["kernel"] + params["hidden"]["bias"], 0)
  ref = ref @ params["output"]["kernel"] + params["output"]["bias"]
  np.testing.assert_allclose(jax.jit(attacker.apply)({"params": params}, mixed), ref, atol=1e-4)


def _config(**kw):
  config = probe_config.get_config("cola_source")
  config.unlock()
  for k, v in kw.items():
    config[k] = v
  return config


def test_bad_input_errors_name_the_key():
  with pytest.raises(ValueError, match="config.representation"):
    probe.check_config(_config(representation="last"), 2)
  with pytest.raises(ValueError, match="config.layer=3 is out of range"):
    probe.check_config(_config(representation="mean", layer=3), 2)
  with pytest.raises(ValueError, match="config.layer=-4"):
    probe.check_config(_config(representation="cls", layer=-4), 2)
  assert probe.check_config(_config(representation="cls", layer=-3), 2) == 0  # the embeddings
  with pytest.raises(ValueError, match="config.scalar_mix_pooling"):
    probe.check_config(_config(scalar_mix_pooling="max"), 2)
  with pytest.raises(ValueError, match="config.dev_fraction"):
    probe.check_config(_config(dev_fraction=1.0), 2)
  with pytest.raises(ValueError, match="config.init_checkpoint is empty"):
    probe.load_encoder(_config())
  with pytest.raises(ValueError, match="config.dev_fraction=0.01 of 20"):
    probe.split_rows(20, 0.01, 0)
  with pytest.raises(ValueError, match="config.private_attributes"):
    probe.task_splits(probe_config.get_config("rte"), tokenizer=None)


def test_split_rows_is_seeded_and_disjoint():
  a_train, a_dev = probe.split_rows(100, 0.1, 3)
  b_train, b_dev = probe.split_rows(100, 0.1, 3)
  assert (a_dev == b_dev).all() and len(a_dev) == 10 and len(a_train) == 90
  assert sorted(np.r_[a_train, a_dev].tolist()) == list(range(100))
  assert not (probe.split_rows(100, 0.1, 4)[1] == a_dev).all()
  # The seed's filtering of presence attributes: only rows with at least one attribute.
  rng = np.random.default_rng(0)
  z_train, z_test = ((rng.random((n, 3)) < 0.2).astype(int) for n in (200, 50))
  train, dev, test = probe.select_rows(z_train, z_test, 0.1, 3, require_attribute=True)
  with_attr = np.flatnonzero(z_train.any(1))
  assert sorted(np.r_[train, dev].tolist()) == with_attr.tolist()
  assert (
    len(dev) == round(0.1 * len(with_attr))
    and test.tolist() == np.flatnonzero(z_test.any(1)).tolist()
  )
  train, dev, test = probe.select_rows(z_train, z_test, 0.1, 3)
  assert (dev == probe.split_rows(200, 0.1, 3)[1]).all() and len(test) == 50


# --- the attacker ------------------------------------------------------------------------------
def test_attacker_finds_a_planted_token_and_not_a_random_attribute(tiny_params):
  """+DEMO: attribute 0 is a token prepended to the text; attribute 1 is random (p = 0.7)."""
  rng = np.random.default_rng(0)
  splits, z = {}, {}
  for name, n in (("train", 480), ("dev", 160), ("test", 400)):
    z[name] = np.stack([rng.integers(0, 2, n), rng.random(n) < 0.7], 1).astype(np.int32)
    splits[name] = _rows(n, 12, seed=len(name) + n, first_token=np.where(z[name][:, 0], 5, 6))
  r = {
    s: probe_attacker.compute_representations(
      TINY, tiny_params, splits[s], "mean", 2, batch_size=64
    )
    for s in splits
  }
  attrs = probe_attacker.Attributes(("demo", "random"), "accuracy")
  out = probe_attacker.train_attacker(r, z, attrs, epochs=12, learning_rate=1e-2, seed=0)
  test = out["test"]["per_attribute"]
  majority = pm.attack_metrics(
    z["test"], pm.majority_predictions(z["train"], 400), ("demo", "random"), "accuracy"
  )["per_attribute"]
  assert majority["demo"]["accuracy"] < 0.56 and test["demo"]["accuracy"] > 0.85
  assert abs(test["random"]["accuracy"] - majority["random"]["accuracy"]) < 0.06
  # The kept epoch is the one with the worst dev privacy, and its dev metrics are reported.
  dev_privacy = [e["dev_privacy"] for e in out["epochs"]]
  assert len(dev_privacy) == 12
  assert out["selected_epoch"] == int(np.argmin(dev_privacy)) + 1
  assert out["dev"]["privacy"] == pytest.approx(min(dev_privacy))
  # Training is deterministic: stopping at the selected epoch gives the reported test metrics.
  again = probe_attacker.train_attacker(
    r, z, attrs, epochs=out["selected_epoch"], learning_rate=1e-2, seed=0
  )
  assert again["test"] == out["test"]


def test_direct_baseline_trains_the_encoder_on_a_planted_token():
  """The seed's upper bound: encoder and attacker trained together on z (one layer, to compile
  quickly); the planted attribute is learnt, the random one stays at its majority rate."""
  config = dataclasses.replace(TINY, num_hidden_layers=1, hidden_dropout_prob=0.0)
  shapes = jax.eval_shape(
    BertEncoder(config).init, jax.random.PRNGKey(0), np.zeros((1, 8), np.int32)
  )
  params = _random_params(shapes["params"])
  rng = np.random.default_rng(1)
  splits, z = {}, {}
  for name, n in (("train", 256), ("dev", 64), ("test", 128)):
    z[name] = np.stack([rng.integers(0, 2, n), rng.random(n) < 0.7], 1).astype(np.int32)
    splits[name] = _rows(n, 8, seed=n + 7, first_token=np.where(z[name][:, 0], 5, 6))
  attrs = probe_attacker.Attributes(("demo", "random"), "accuracy")
  out = probe_attacker.train_direct(
    config,
    params,
    splits,
    z,
    attrs,
    "pooled",
    -1,
    "mean",
    epochs=6,
    learning_rate=1e-2,
    batch_size=32,
    warmup_proportion=0.0,
    eval_batch_size=64,
  )
  test = out["test"]["per_attribute"]
  assert test["demo"]["accuracy"] > 0.9
  assert test["random"]["accuracy"] == pytest.approx(z["test"][:, 1].mean(), abs=0.1)
  dev_privacy = [e["dev_privacy"] for e in out["epochs"]]
  assert out["selected_epoch"] == int(np.argmin(dev_privacy)) + 1 and "params" not in out


# --- end to end ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cola_dir(tmp_path_factory, shared_data):
  """A CoLA folder of every 60th training and every 20th dev sentence (all sources present)."""
  root = tmp_path_factory.mktemp("glue")
  (root / "CoLA").mkdir()
  for name, step in (("train", 60), ("dev", 20)):
    lines = (shared_data / "glue/CoLA" / f"{name}.tsv").read_text().splitlines(keepends=True)
    (root / "CoLA" / f"{name}.tsv").write_text("".join(lines[::step]))
  return root


@pytest.fixture(scope="module")
def cola_model(tmp_path_factory, cola_dir, minilm_dir):
  """A random tiny CoLA classifier as a bert_jax workdir: a parameters-only export (encoder and
  classifier, head.json, MiniLM's vocabulary) with a fine-tuning run's config.json beside it.
  Its bias splits the dev sentences' logit differences at their median, so both classes are
  predicted. Returns (directory, dev labels, the model's dev predictions), the predictions
  from the logits of all dev rows at once (no batching, no padding rows)."""
  from bert_jax.formats.params_only import export_params_only
  from bert_jax.model import BertForSequenceClassification
  from bert_jax.tasks.glue.features import encode_texts
  from bert_jax.tokenize import load_tokenizer
  from configs import glue

  config = dataclasses.replace(TINY, vocab_size=30522, max_position_embeddings=128)
  model = BertForSequenceClassification(config, num_labels=2)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))
  params = _random_params(shapes["params"])
  params["classifier"]["kernel"] = np.random.default_rng(5).normal(0, 1, (32, 2)).astype(np.float32)
  tokenizer = load_tokenizer(minilm_dir)
  rows = [line.split("\t") for line in (cola_dir / "CoLA/dev.tsv").read_text().splitlines()]
  arrays, _ = encode_texts(tokenizer, [r[3] for r in rows], None, 32)
  logits = jax.jit(model.apply)({"params": params}, *(arrays[k] for k in probe_attacker.INPUT_KEYS))
  diff = np.sort(np.diff(np.asarray(logits["logits"]), axis=-1)[:, 0])
  shift = -(diff[len(diff) // 2 - 1] + diff[len(diff) // 2]) / 2
  params["classifier"]["bias"][1] += shift
  out = tmp_path_factory.mktemp("cola_model") / "model"
  head = {"task": "sequence_classification", "num_labels": 2, "labels": ["0", "1"], "name": "cola"}
  export_params_only(str(out), params, config, head, tokenizer)
  run_config = glue.get_config("cola")
  (out / "config.json").write_text(json.dumps(run_config.to_dict(), default=str))
  preds = (np.diff(np.asarray(logits["logits"]), axis=-1)[:, 0] + shift > 0).astype(int)
  return out, np.array([int(r[1]) for r in rows]), preds


def _column(path, k=0):
  return [line.split("\t")[k] for line in path.read_text().splitlines()]


def test_probe_entry_point_writes_probe_json(tmp_path, cola_dir, cola_model, subprocess_env):
  import collections

  from sklearn.metrics import matthews_corrcoef

  finetuned, labels, preds = cola_model
  workdir = tmp_path / "probe"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.probe",
      "--config=configs/probe.py:cola_source",
      f"--workdir={workdir}",
      f"--config.init_checkpoint={finetuned}",
      f"--config.data_dir={cola_dir}",
      "--config.max_seq_length=32",
      "--config.eval_batch_size=16",
      "--config.attacker_epochs=3",
      "--config.direct_baseline=false",  # compiling its training step is slow: tested below
      "--config.representation=scalar_mix",
      "--config.require_attribute=true",  # only sentences of the five sources
      "--config.dev_fraction=0.2",  # 0.1 holds out no 'l-93' sentence: refused (no positive)
    ],
    cwd=REPO,
    env=subprocess_env(1),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  out = json.loads((workdir / "probe.json").read_text())
  assert json.loads((workdir / "metrics.json").read_text()) == out  # what launch sweep collects
  assert summary["privacy"] == out["test"]["privacy"] and out["primary_metric"] == "test.privacy"
  # The attributes: CoLA's five most frequent sources of the training file, presence -> F.
  sources = collections.Counter(_column(cola_dir / "CoLA/train.tsv"))
  top5 = [s for s, _ in sorted(sources.items(), key=lambda kv: (-kv[1], kv[0]))[:5]]
  attrs = out["private_attributes"]
  assert attrs["names"] == top5 and attrs["privacy_metric"] == "f1"
  kept = np.isin(_column(cola_dir / "CoLA/dev.tsv"), top5)
  dev_sources = [s for s, k in zip(_column(cola_dir / "CoLA/dev.tsv"), kept) if k]
  n_train, n_test = sum(sources[s] for s in top5), len(dev_sources)
  assert 0 < n_test < len(kept) and out["rows"] == {
    "attacker_train": n_train - round(0.2 * n_train),
    "attacker_dev": round(0.2 * n_train),
    "test": n_test,
  }
  test = out["test"]
  for name in top5:
    assert test["per_attribute"][name]["support"] == dev_sources.count(name)
  assert test["privacy"] == pytest.approx(1 - test["f1_micro"])
  # No source covers half the sentences: the majority attacker predicts no source, F = 0.
  majority = out["baselines"]["majority"]
  assert set(majority["values"].values()) == {0} and majority["test"]["privacy"] == 1.0
  assert out["baselines"]["direct"] is None
  assert 1 <= out["attacker"]["selected_epoch"] <= 3 and len(out["attacker"]["epochs"]) == 3
  mix = out["scalar_mix"]  # tiny: embeddings + 2 layers
  assert len(mix["weights"]) == 3 and sum(mix["weights"]) == pytest.approx(1.0)
  assert 0 <= mix["centre_of_gravity"] <= 2
  # The main task: the classifier's own MCC / accuracy on the test rows (sklearn, on predictions
  # from all rows at once).
  main = out["main_task"]
  assert main["metric"] == "mcc" and main["split"] == "dev" and out["main_task_note"] is None
  assert 0 < preds[kept].mean() < 1  # both classes predicted: MCC is not trivially 0
  labels, preds = labels[kept], preds[kept]  # scored on the probe's test rows
  assert main["value"] == pytest.approx(matthews_corrcoef(labels, preds))
  assert main["metrics"]["accuracy"] == pytest.approx(np.mean(labels == preds))
  assert out["config"]["representation"] == "scalar_mix"


def test_main_task_is_null_unless_a_fine_tuned_workdir_of_the_task(cola_model, minilm_dir):
  finetuned, _, _ = cola_model
  config = probe_config.get_config("cola_source")
  config.init_checkpoint = str(minilm_dir)
  main, why = probe.main_task_metric(config, None, None, None, None)
  assert main is None and why.endswith(
    "is not a bert_jax fine-tuning workdir (no head.json + config.json)"
  )
  config = probe_config.get_config("rte")
  config.init_checkpoint = str(finetuned)
  main, why = probe.main_task_metric(config, None, None, None, None)
  assert main is None and "fine-tuned on 'cola', not 'rte'" in why
  assert probe_config.get_config("stsb_genre").num_private_attributes == 3  # three genres


def test_entry_point_reports_bad_input_in_one_line(tmp_path, cola_dir, subprocess_env):
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.probe",
      "--config=configs/probe.py:cola_source",
      f"--workdir={tmp_path / 'probe'}",
      "--config.init_checkpoint=/nonexistent",
      f"--config.data_dir={cola_dir}",
      "--config.representation=last",  # refused before the checkpoint is read
    ],
    cwd=REPO,
    env=subprocess_env(1),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1
  last = proc.stderr.strip().splitlines()[-1]
  assert last == (
    "probe: error: config.representation='last' is not one of "
    "('pooled', 'cls', 'mean', 'scalar_mix')"
  )
  assert not (tmp_path / "probe").exists()  # nothing left behind, not even an empty workdir
