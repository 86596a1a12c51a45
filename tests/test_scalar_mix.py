"""ELMo's scalar mix: the module, the feature-based tagger's scalar_mix mode, extract_features.

References are independent: numpy sums and softmaxes, hand-computed weights and centres of
gravity, and (for the embeddings hidden state) numpy's word + position + type embeddings and
LayerNorm from the params.
"""

import json
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from float_tolerance import assert_sum_close

from bert_jax.model import BertConfig, BertEncoder, ScalarMix
from bert_jax.model import scalar_mix as scalar_mix_lib
from bert_jax.tools import features

REPO = pathlib.Path(__file__).resolve().parent.parent
TINY = dict(
  vocab_size=64,
  hidden_size=16,
  num_hidden_layers=3,
  num_attention_heads=2,
  intermediate_size=32,
  max_position_embeddings=32,
)


def _hidden(k=5, shape=(2, 3, 4), seed=0):
  rng = np.random.default_rng(seed)
  return [rng.standard_normal(shape).astype(np.float32) for _ in range(k)]


def test_one_hot_weights_and_scale_one_give_that_layer():
  hidden = _hidden()
  for k in range(len(hidden)):
    logits = np.zeros(len(hidden), np.float32)
    logits[k] = 1e4  # softmax: exactly one-hot in float32
    out = ScalarMix().apply(
      {"params": {"weights": jnp.asarray(logits), "gamma": jnp.float32(1.0)}}, hidden
    )
    np.testing.assert_array_equal(np.asarray(out), hidden[k])
    one_hot = np.eye(len(hidden))[k]
    np.testing.assert_array_equal(np.asarray(scalar_mix_lib.mix(hidden, one_hot)), hidden[k])


def test_uniform_weights_and_scale_k_give_the_sum():
  hidden = _hidden(k=7)
  params = ScalarMix().init(jax.random.PRNGKey(0), hidden)["params"]
  assert params["weights"].shape == (7,) and params["weights"].dtype == jnp.float32
  np.testing.assert_array_equal(params["weights"], np.zeros(7))  # init: uniform
  assert params["gamma"].shape == () and float(params["gamma"]) == 1.0
  params = {"weights": params["weights"], "gamma": jnp.float32(7.0)}
  out = ScalarMix().apply({"params": params}, hidden)
  # float32 sums of 7 terms (float_tolerance, rule 2): magnitude the sum of |h_k|.
  h64 = np.asarray(hidden, np.float64)
  assert_sum_close(out, h64.sum(0), np.abs(h64).sum(0), terms=7)
  # The init (gamma 1) is the mean of the layers.
  out = ScalarMix().apply({"params": {**params, "gamma": jnp.float32(1.0)}}, hidden)
  assert_sum_close(out, h64.mean(0), np.abs(h64).mean(0), terms=7)


def test_general_weights_match_numpy_softmax_mix():
  hidden = _hidden(k=4)
  logits = np.array([0.3, -1.2, 2.0, 0.5], np.float32)
  s = np.exp(logits.astype(np.float64)) / np.exp(logits.astype(np.float64)).sum()
  ref = 0.7 * sum(s[k] * hidden[k].astype(np.float64) for k in range(4))
  out = ScalarMix().apply({"params": {"weights": logits, "gamma": np.float32(0.7)}}, hidden)
  # A float32 sum of 4 terms (float_tolerance, rule 2): magnitude 0.7 sum s_k |h_k|.
  magnitude = 0.7 * sum(s[k] * np.abs(hidden[k].astype(np.float64)) for k in range(4))
  assert_sum_close(out, ref, magnitude, terms=4)
  # bfloat16 hidden states: the mix is computed (and returned) in float32.
  out16 = ScalarMix().apply(
    {"params": {"weights": logits, "gamma": np.float32(0.7)}},
    [jnp.asarray(h, jnp.bfloat16) for h in hidden],
  )
  assert out16.dtype == jnp.float32


def test_summary_weights_gamma_and_centre_of_gravity():
  # softmax(log p) = p: weights 0.1, 0.2, 0.3, 0.4; centre 0*.1 + 1*.2 + 2*.3 + 3*.4 = 2.0
  report = scalar_mix_lib.summary({"weights": np.log([1.0, 2.0, 3.0, 4.0]), "gamma": 1.5})
  np.testing.assert_allclose(report["weights"], [0.1, 0.2, 0.3, 0.4], rtol=1e-12)
  assert report["gamma"] == 1.5 and report["centre_of_gravity"] == pytest.approx(2.0)
  assert all(isinstance(w, float) for w in report["weights"])
  uniform = scalar_mix_lib.summary({"weights": np.zeros(7), "gamma": 1.0})
  assert uniform["centre_of_gravity"] == pytest.approx(3.0)
  boxed = {  # as a model initialised under logical axis rules holds them
    "weights": nn.LogicallyPartitioned(np.log([1.0, 2.0, 3.0, 4.0]), (None,)),
    "gamma": nn.LogicallyPartitioned(np.float32(1.5), ()),
  }
  assert scalar_mix_lib.summary(boxed) == report
  with pytest.raises(ValueError, match=r"lack \['gamma'\]"):
    scalar_mix_lib.summary({"weights": np.zeros(3)})


def test_mix_refuses_mismatched_weights_and_shapes():
  hidden = _hidden(k=3)
  with pytest.raises(ValueError, match="2 weights for 3 hidden states"):
    scalar_mix_lib.mix(hidden, [0.5, 0.5])
  with pytest.raises(ValueError, match="differ in shape"):
    scalar_mix_lib.mix([hidden[0], hidden[1][:, :1]], [0.5, 0.5])


# --- the feature-based tagger ------------------------------------------------------------------


def _fb_config(mode="scalar_mix"):
  from configs import ner_feature_based

  c = ner_feature_based.get_config(mode)
  c.unlock()
  c.labels = "O,B-PER,I-PER"
  c.lstm_hidden_size = 8
  c.lstm_num_layers = 1
  return c


def _fb_task(mode="scalar_mix"):
  from bert_jax.tasks.ner.feature_based import FeatureBasedNerTask

  return FeatureBasedNerTask(_fb_config(mode), tokenizer=None)


def test_frozen_encoder_only_the_mix_and_tagger_get_gradient():
  task = _fb_task()
  config = BertConfig(**TINY)
  model = task.build_model(config)
  rng = np.random.default_rng(1)
  ids = rng.integers(1, TINY["vocab_size"], (8, 6)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[3, 4:] = 0
  params = model.init(jax.random.PRNGKey(0), ids, mask, np.zeros_like(ids))["params"]
  assert params["scalar_mix"]["weights"].shape == (TINY["num_hidden_layers"] + 1,)
  target = rng.standard_normal((8, 6, task.num_labels)).astype(np.float32)

  def loss(p):
    return jnp.sum(model.apply({"params": p}, ids, mask, np.zeros_like(ids))["logits"] * target)

  grads = jax.jit(jax.grad(loss))(params)
  for path, g in jax.tree_util.tree_leaves_with_path(grads["bert"]):
    np.testing.assert_array_equal(g, np.zeros_like(g), err_msg=jax.tree_util.keystr(path))
  assert np.all(np.abs(grads["scalar_mix"]["weights"]) > 0)
  assert abs(float(grads["scalar_mix"]["gamma"])) > 0
  assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree_util.tree_leaves(grads["tagger"]))
  # The optimizer's groups: the encoder frozen, the mix and the tagger trained.
  assert not task.trainable(("bert", "embeddings", "word_embeddings", "embedding"))
  assert task.trainable(("scalar_mix", "weights")) and task.trainable(("scalar_mix", "gamma"))
  assert task.trainable(("tagger", "classifier", "kernel"))


def test_param_report_gives_the_learned_mix():
  task = _fb_task()
  logits = np.log([1.0, 1.0, 2.0, 4.0])  # weights 1/8, 1/8, 2/8, 4/8
  params = {
    "bert": {},
    "scalar_mix": {"weights": jnp.asarray(logits, jnp.float32), "gamma": jnp.float32(2.5)},
    "tagger": {},
  }
  report = task.param_report(params)
  assert set(report) == {"scalar_mix"}
  np.testing.assert_allclose(report["scalar_mix"]["weights"], [0.125, 0.125, 0.25, 0.5], rtol=1e-6)
  assert report["scalar_mix"]["gamma"] == 2.5
  assert report["scalar_mix"]["centre_of_gravity"] == pytest.approx(0.125 + 0.5 + 1.5, rel=1e-6)
  json.dumps(report)  # plain floats: ready for metrics.json
  assert _fb_task("sum_all").param_report(params) == {}
  with pytest.raises(ValueError, match="no 'scalar_mix' entry"):
    task.param_report({"bert": {}, "tagger": {}})


def test_scalar_mix_mode_is_a_feature_mode_and_needs_no_four_layers():
  from bert_jax.tasks.ner.feature_based import FEATURE_MODES

  assert "scalar_mix" in FEATURE_MODES
  small = BertConfig(**{**TINY, "num_hidden_layers": 2})
  _fb_task().build_model(small)  # 2 layers are fine (last_four modes need 4)
  with pytest.raises(ValueError, match="needs at least 4 layers"):
    _fb_task("sum_last_four").build_model(small)
  assert isinstance(_fb_config(), ml_collections.ConfigDict)


# --- extract_features ----------------------------------------------------------------------------


def _layer_norm(x, scale, bias, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * scale + bias


def _numpy_embeddings(params, config, ids, segments):
  e = {k: np.asarray(v, np.float64) for k, v in _flat(params["embeddings"]).items()}
  x = (
    e["word_embeddings/embedding"][ids]
    + e["position_embeddings/embedding"][np.arange(len(ids))]
    + e["token_type_embeddings/embedding"][segments]
  )
  return _layer_norm(x, e["LayerNorm/scale"], e["LayerNorm/bias"], config.layer_norm_eps)


def _flat(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}/"))
    else:
      out[f"{prefix}{k}"] = v
  return out


@pytest.fixture(scope="module")
def tiny_encoder():
  config = BertConfig(**TINY)
  ids = np.ones((1, 8), np.int32)
  params = BertEncoder(config).init(jax.random.PRNGKey(3), ids)["params"]
  params = jax.tree_util.tree_map(np.asarray, nn.unbox(params))
  # Non-trivial LayerNorm parameters, so the embeddings reference checks them too.
  rng = np.random.default_rng(4)
  ln = params["embeddings"]["LayerNorm"]
  ln["scale"] = (1 + 0.3 * rng.standard_normal(ln["scale"].shape)).astype(np.float32)
  ln["bias"] = (0.2 * rng.standard_normal(ln["bias"].shape)).astype(np.float32)
  return config, params


def _tiny_feats():
  rng = np.random.default_rng(5)
  out = []
  for i, n in enumerate([5, 9, 3, 12]):
    ids = [2, *rng.integers(5, TINY["vocab_size"], n - 2).tolist(), 3]
    segs = [0] * (n // 2) + [1] * (n - n // 2)
    out.append(features.InputFeatures(i, [f"t{j}" for j in range(n)], ids, segs))
  return out


def test_extractor_mix_equals_numpy_mix_of_the_output_layers(tiny_encoder):
  config, params = tiny_encoder
  n = TINY["num_hidden_layers"]
  layers = tuple(range(-1, -n - 1, -1))  # all layers: -1 .. -n
  weights = [0.0, 1.0, 3.0, 4.0]  # embeddings 0: the mix of the output layers alone
  extractor = features.FeatureExtractor(
    params,
    config,
    layers=layers,
    max_seq_length=16,
    batch_size=8,
    scalar_mix_weights=weights,
    scalar_mix_gamma=2.0,
  )
  assert extractor.output_indices == (*layers, "mix")
  s = np.asarray(weights) / np.sum(weights)
  for f, values in extractor(_tiny_feats()):
    assert values.shape == (n + 1, len(f.tokens), TINY["hidden_size"])
    by_layer = {layers[j]: values[j].astype(np.float64) for j in range(n)}  # -1 last
    ref = 2.0 * sum(s[k] * by_layer[k - 1 - n] for k in range(1, n + 1))  # k = j + 1
    # A float32 sum of n terms (float_tolerance, rule 2): magnitude 2 sum s_k |h_k|.
    magnitude = 2.0 * sum(s[k] * np.abs(by_layer[k - 1 - n]) for k in range(1, n + 1))
    assert_sum_close(values[-1], ref, magnitude, terms=n)


def test_extractor_mix_includes_the_embeddings(tiny_encoder):
  config, params = tiny_encoder
  n = TINY["num_hidden_layers"]
  weights = [2.0, 0.0, 1.0, 1.0]  # embeddings, layer 0, layer 1, layer 2 (last)
  extractor = features.FeatureExtractor(
    params, config, layers=(), max_seq_length=16, batch_size=8, scalar_mix_weights=weights
  )
  only_mix = {f.unique_id: v for f, v in extractor(_tiny_feats())}
  extractor_layers = features.FeatureExtractor(
    params, config, layers=(1, 2), max_seq_length=16, batch_size=8
  )
  for f, layer_values in extractor_layers(_tiny_feats()):
    mixed = only_mix[f.unique_id]
    assert extractor.output_indices == ("mix",) and mixed.shape[0] == 1
    emb = _numpy_embeddings(params, config, f.input_ids, f.segment_ids)
    ref = 0.5 * emb + 0.25 * layer_values[0] + 0.25 * layer_values[1]
    np.testing.assert_allclose(mixed[0], ref, rtol=1e-4, atol=1e-4)
  assert n == 3


@pytest.mark.parametrize(
  "weights, gamma, message",
  [
    ([0.5, 0.5], 1.0, r"has 2 values; a model of 3 layers needs 4"),
    ([0.5, -0.1, 0.3, 0.3], 1.0, r"\[-0\.1\] not finite numbers >= 0"),
    ([0.5, float("nan"), 0.3, 0.3], 1.0, r"not finite numbers >= 0"),
    ([0.0, 0.0, 0.0, 0.0], 1.0, r"are all 0"),
    ([0.25] * 4, float("inf"), r"scalar_mix_gamma \(--scalar_mix_gamma\) must be finite"),
    (["a", 1, 1, 1], 1.0, r"must be numbers"),
  ],
)
def test_bad_mix_weights_are_named(tiny_encoder, weights, gamma, message):
  config, params = tiny_encoder
  with pytest.raises(ValueError, match=message) as e:
    features.FeatureExtractor(
      params,
      config,
      layers=(-1,),
      max_seq_length=16,
      scalar_mix_weights=weights,
      scalar_mix_gamma=gamma,
    )
  assert "scalar_mix" in str(e.value)
  with pytest.raises(ValueError, match="layers is empty"):
    features.FeatureExtractor(params, config, layers=(), max_seq_length=16)


def test_cli_mix_flag_errors(tmp_path, subprocess_env):
  inp = tmp_path / "in.txt"
  inp.write_text("hello world\n")
  base = [
    sys.executable,
    "-m",
    "bert_jax.extract_features",
    f"--input_file={inp}",
    f"--output_file={tmp_path / 'out.jsonl'}",
    f"--checkpoint={tmp_path / 'no_model'}",  # never loaded: the flags fail first
  ]
  env = subprocess_env(1)
  for extra, status, message in [
    (["--scalar_mix_weights=a,b"], 2, "--scalar_mix_weights must be numbers, got a,b"),
    (["--scalar_mix_gamma=2"], 2, "--scalar_mix_gamma needs --scalar_mix_weights"),
    (["--scalar_mix_weights=1,-1"], 1, "scalar_mix_weights (--scalar_mix_weights): [-1.0]"),
  ]:
    proc = subprocess.run(
      base + extra, capture_output=True, text=True, env=env, cwd=REPO, timeout=120
    )
    assert proc.returncode == status, proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out.jsonl").exists()
