"""Private attributes read from the shared data, and the defences' gradients and signs.

References are independent of the code under test: the attribute sets are recomputed here from
the raw files with the csv module and a plain CoNLL scan; gradient isolation is checked on the
exact gradient tree; the declustering sign on a toy pair; Adam's first step is lr * sign(g).
"""

import collections
import csv
import gzip
import logging
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from float_tolerance import assert_sum_close

from bert_jax.model import BertConfig, BertForSequenceClassification
from bert_jax.tasks.base import SplitData, Task
from bert_jax.tasks.glue.task import GlueTask
from bert_jax.tasks.privacy import attributes as PA
from bert_jax.tasks.privacy import defences as D
from bert_jax.tasks.privacy.defended import PrivacyDefended
from bert_jax.tokenize import load_tokenizer
from bert_jax.train import optimizers as O
from configs import glue
from configs import probe as probe_config


def _config(shared_data, task="cola", **kw):
  c = glue.get_config(task)
  c.data_dir = str(shared_data / "glue")
  c.max_seq_length = 32
  for k, v in kw.items():
    if "." in k:
      section, key = k.split(".")
      setattr(c[section], key, v)
    else:
      setattr(c, k, v)
  return c


def _column(path, index, header):
  with open(path, encoding="utf-8") as f:
    rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  return [r[index] for r in (rows[1:] if header else rows)]


def _top(values, k):
  return [
    v for v, _ in sorted(collections.Counter(values).items(), key=lambda kv: (-kv[1], kv[0]))
  ][:k]


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
  return load_tokenizer(str(minilm_dir / "vocab.txt"), do_lower_case=True)


def test_cola_source_attributes_match_the_raw_column(shared_data, tokenizer):
  task = GlueTask(_config(shared_data, private_attributes="cola_source"), tokenizer)
  sources = _column(shared_data / "glue/CoLA/train.tsv", 0, header=False)
  top = _top(sources, 5)
  assert task.private_attributes.names == tuple(top)
  assert task.private_attributes.privacy_metric == "f1"
  for split, file in (("train", "train.tsv"), ("dev", "dev.tsv")):
    z = task.load_split(split).arrays["private"]
    expected = np.array(
      [[s == t for t in top] for s in _column(shared_data / "glue/CoLA" / file, 0, False)], np.int32
    )
    np.testing.assert_array_equal(z, expected)
    assert z.dtype == np.int32 and z.shape[1] == 5


def test_stsb_genre_is_one_genre_per_pair(shared_data, tokenizer):
  task = GlueTask(
    _config(shared_data, "stsb", private_attributes="stsb_genre", num_private_attributes=3),
    tokenizer,
  )
  genres = _column(shared_data / "glue/STS-B/train.tsv", 1, header=True)
  assert set(task.private_attributes.names) == set(genres) and len(set(genres)) == 3
  assert task.private_attributes.privacy_metric == "accuracy"
  z = task.load_split("dev").arrays["private"]
  dev = _column(shared_data / "glue/STS-B/dev.tsv", 1, header=True)
  np.testing.assert_array_equal(z.sum(1), np.ones(len(dev)))
  names = task.private_attributes.names
  # The official dev file spells the train file's "main-forum" genre "main-forums".
  assert [names[i] for i in z.argmax(1)] == [g.replace("forums", "forum") for g in dev]


def _conll_persons(path):
  counts, current = collections.Counter(), []
  for line in list(open(path, encoding="utf-8")) + [""]:
    parts = line.split()
    tag = parts[-1] if parts and not line.startswith("-DOCSTART-") else "O"
    if current and (not tag.endswith("PER") or tag == "B-PER"):
      counts[" ".join(current)] += 1
      current = []
    if tag.endswith("PER"):
      current.append(parts[0])
  return counts


def test_conll_person_presence(shared_data):
  path = str(shared_data / "conll2003/train.txt")
  attrs = PA.fit("conll_per", 3, conll_file=path)
  assert list(attrs.names) == _top(list(_conll_persons(path).elements()), 3)
  a, b, c = attrs.names
  texts = [(f"Yesterday {a} said so.", None), ("Nobody here.", f"But {c}, twice."), (a + "x", "")]
  z = PA.matrix(attrs, texts=texts)
  np.testing.assert_array_equal(z, [[1, 0, 0], [0, 0, 1], [0, 0, 0]])


@pytest.mark.parametrize(
  "overrides, words",
  [
    ({"private_attributes": "gender"}, ["config.private_attributes", "gender"]),
    ({"defence.name": "multidetasking"}, ["config.defence.name", "private_attributes"]),
    (
      {"private_attributes": "cola_source", "defence.name": "dp"},
      ["config.defence.name", "'dp'"],
    ),
  ],
)
def test_bad_settings_name_the_key(shared_data, tokenizer, overrides, words):
  with pytest.raises(ValueError) as e:
    GlueTask(_config(shared_data, **overrides), tokenizer)
  assert all(w in str(e.value) for w in words), str(e.value)


def test_missing_column_and_too_many_attributes_name_the_key(shared_data, tokenizer):
  task = GlueTask(_config(shared_data, "sst2", private_attributes="cola_source"), tokenizer)
  with pytest.raises(ValueError, match="config.private_attributes='cola_source' reads the column"):
    task.load_split("dev")
  task = GlueTask(_config(shared_data, "stsb", private_attributes="stsb_genre"), tokenizer)
  with pytest.raises(ValueError, match="config.num_private_attributes=5.*only 3"):
    task.load_split("dev")


def _defended(shared_data, tokenizer, name):
  task = GlueTask(
    _config(shared_data, private_attributes="cola_source", **{"defence.name": name}), tokenizer
  )
  bert_config = BertConfig.from_preset("tiny").replace(vocab_size=tokenizer.vocab_size)
  model = task.build_model(bert_config)
  init = jax.jit(lambda rng: nn.meta.unbox(task.init_variables(model, rng, 8)["params"]))
  params = init(jax.random.PRNGKey(0))
  data = task.load_split("dev")
  batch = {k: jnp.asarray(v[:8]) for k, v in data.arrays.items()}
  return task, model, params, batch


def _norms(tree):
  norms = jax.jit(lambda t: {k: optax.global_norm(v) for k, v in t.items()})(tree)
  return {k: float(v) for k, v in norms.items()}


def test_multidetasking_gradients_reach_only_their_own_side(shared_data, tokenizer):
  task, model, params, batch = _defended(shared_data, tokenizer, "multidetasking")
  assert set(params) == {"bert", "classifier", D.ADVERSARY}

  def term(name):
    def f(p):
      outputs = task.apply(model, p, batch, deterministic=True)
      return D.defence_terms(task.config.defence, outputs, batch["private"])[name]

    return _norms(jax.jit(jax.grad(f))(params))

  adversary = term("adversary")  # the adversary's own loss
  assert adversary["bert"] == 0.0 and adversary["classifier"] == 0.0 and adversary["adversary"] > 0
  encoder = term("encoder")  # the encoder's "not z" term
  assert encoder["adversary"] == 0.0 and encoder["bert"] > 0
  # The encoder's term is -sum_k log P(not z_k), computed here from the adversary's logits.
  outputs = jax.jit(lambda p, b: task.apply(model, p, b, deterministic=True))(params, batch)
  p = jax.nn.sigmoid(np.asarray(outputs["encoder_adversary_logits"], np.float64))
  z = np.asarray(batch["private"])
  expected = np.mean(np.sum(-(1 - z) * np.log(p) - z * np.log(1 - p), -1))
  got = D.defence_terms(task.config.defence, outputs, batch["private"])["encoder"]
  np.testing.assert_allclose(float(got), expected, rtol=1e-5)


def test_declustering_pushes_same_attributes_apart_and_pulls_different_together():
  cfg = {"name": "declustering", "alpha": 1.0, "declustering_lambda": 0.1}
  r = jnp.array([[0.1, 0.2], [0.3, -0.1]])

  def distance_after_step(z):
    z = jnp.asarray(z)
    grad = jax.grad(lambda r: D.defence_terms(cfg, {"pooled_output": r}, z)["declustering"])(r)
    moved = r - 0.5 * grad
    return float(jnp.linalg.norm(moved[0] - moved[1])), float(jnp.linalg.norm(r[0] - r[1]))

  after, before = distance_after_step([[1, 0], [1, 0]])  # same attributes: pushed apart
  assert after > before
  after, before = distance_after_step([[1, 0], [0, 1]])  # different attributes: pulled together
  assert after < before


def test_the_adversary_has_its_own_optimizer():
  params = {"bert": {"w": jnp.ones(3)}, D.ADVERSARY: {"w": jnp.ones(3)}}
  grads = {"bert": {"w": jnp.array([1.0, -2.0, 3.0])}, D.ADVERSARY: {"w": jnp.array([0.5, -4, 1])}}
  main = optax.adamw(0.0)  # the main schedule at 0: only the group moves
  tx = O.with_optimizer_groups(main, {D.ADVERSARY: O.OptimizerGroup(D.is_adversary, 0.01)})
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_array_equal(updates["bert"]["w"], np.zeros(3))
  # Adam's first step is -lr * g / (|g| + eps): -lr * sign(g).
  np.testing.assert_allclose(updates[D.ADVERSARY]["w"], [-0.01, 0.01, -0.01], rtol=1e-5)


def test_train_sample_seed_draws_a_uniform_sample_in_file_order(shared_data, tokenizer):
  sources = _column(shared_data / "glue/CoLA/train.tsv", 0, header=False)
  first = GlueTask(
    _config(shared_data, private_attributes="cola_source", max_train_examples=800), tokenizer
  )
  z_first = first.load_split("train").arrays["private"]
  # The file is sorted by source: its first rows hold few of the five most frequent sources.
  assert (z_first.sum(0) > 0).sum() < 5
  sampled = _config(shared_data, private_attributes="cola_source", max_train_examples=800)
  sampled.train_sample_seed = 3
  z = GlueTask(sampled, tokenizer).load_split("train").arrays["private"]
  keep = np.sort(np.random.default_rng(3).choice(len(sources), 800, replace=False))
  top = first.private_attributes.names
  expected = np.array([[sources[i] == t for t in top] for i in keep], np.int32)
  np.testing.assert_array_equal(z, expected)
  assert (z.sum(0) > 0).all()


def test_an_attributes_file_that_is_not_text_is_named(tmp_path):
  path = tmp_path / "train.txt.gz"  # a compressed CoNLL file given as the attributes file
  path.write_bytes(gzip.compress(b"Bill B-PER\nClinton I-PER\n"))
  with pytest.raises(ValueError) as e:
    PA.fit("conll_per", 1, conll_file=str(path))
  assert str(e.value).startswith(f"{path}:1: not UTF-8 text (byte 0x8b); a CoNLL file is UTF-8")


def test_a_malformed_attributes_file_advises_only_keys_that_exist(tmp_path):
  path = tmp_path / "names.txt"
  path.write_text("Bill B-PER\nClinton I-PER\nsaid\n")
  with pytest.raises(ValueError) as e:
    PA.fit("conll_per", 1, conll_file=str(path))
  message = str(e.value)
  assert message.startswith(f"{path}:3: token 'said' has no tag (expected 'word TAG'); ")
  # Every key the advice names is one of the config that reads the file (configs/probe.py's
  # conll_per preset, GLUE's keys plus the probe's).
  keys = re.findall(r"config\.(\w+)", message)
  assert keys and set(keys) <= set(probe_config.get_config("conll_per").keys()), keys


def test_a_defence_slice_without_an_attribute_is_refused(shared_data, tokenizer, caplog):
  """CoLA's train file is ordered by source: its first 800 rows lack some of the five most
  frequent sources. A defence would train against those blindly: refused, naming them; without
  a defence (the attributes only recorded) the same slice is a warning."""
  caplog.set_level(logging.WARNING)
  sources = _column(shared_data / "glue/CoLA/train.tsv", 0, header=False)
  top = _top(sources, 5)
  missing = [s for s in top if s not in sources[:800]]
  attrs = "attribute" if len(missing) == 1 else "attributes"
  none_of = f"CoLA train: none of its 800 rows has private {attrs} " + ", ".join(
    repr(s) for s in missing
  )
  assert missing
  config = _config(
    shared_data,
    private_attributes="cola_source",
    max_train_examples=800,
    **{"defence.name": "multidetasking"},
  )
  with pytest.raises(ValueError, match=re.escape(none_of) + ".*config.train_sample_seed"):
    GlueTask(config, tokenizer).load_split("train")
  config = _config(shared_data, private_attributes="cola_source", max_train_examples=800)
  z = GlueTask(config, tokenizer).load_split("train").arrays["private"]
  assert z.shape == (800, 5)
  expected = none_of + "; a defence or a probe learns nothing of it from these rows"
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert any(w.startswith(expected) for w in warnings), warnings


class _Topics(Task):
  """A classification task that is not GLUE: 3 topics, K=2 private attributes, random rows."""

  name, head, primary_metric = "topics", "sequence_classification", "accuracy"
  labels = ["a", "b", "c"]
  private_attributes = PA.PrivateAttributes("topics", ("x", "y"), "f1", "two flags")

  def describe_split(self, split):
    return f"topics {split}"

  def build_model(self, bert_config):
    return BertForSequenceClassification(bert_config, num_labels=3)

  def load_split(self, split):
    rng = np.random.default_rng(0)
    private = rng.integers(0, 2, (8, 2)).astype(np.int32)
    private[:, 1] = 0 if split == "train" else private[:, 1]  # no train row has "y"
    arrays = {
      "input_ids": rng.integers(1, 30, (8, 6)).astype(np.int32),
      "input_mask": np.ones((8, 6), np.int32),
      "segment_ids": np.zeros((8, 6), np.int32),
      "label": rng.integers(0, 3, 8).astype(np.int32),
      "private": private,
    }
    return SplitData(split, arrays)

  def target_spec(self, batch_size):
    return {"label": jax.ShapeDtypeStruct((batch_size,), np.int32)}

  def loss(self, outputs, batch):
    ce = optax.softmax_cross_entropy_with_integer_labels(outputs["logits"], batch["label"])
    return jnp.mean(ce), {"topics_ce": jnp.mean(ce)}

  def predict(self, outputs):
    return {"logits": outputs["logits"]}

  def evaluate(self, data, predictions):
    return {}, None

  def write_predictions(self, data, predictions, out_dir):
    return []


class _DefendedTopics(PrivacyDefended, _Topics):
  pass


def _topics_config(defence):
  return ml_collections.ConfigDict(
    {
      "max_seq_length": 6,
      "private_attributes": "topics",
      "num_private_attributes": 2,
      "defence": {
        "name": defence,
        "alpha": 0.5,
        "beta": 2.0,
        "declustering_lambda": 0.1,
        "adversary_hidden_size": 4,
        "adversary_learning_rate": 3e-3,
      },
    }
  )


def _np_bce_sum(logits, z):
  p = 1 / (1 + np.exp(-np.asarray(logits, np.float64)))
  return np.mean(np.sum(-z * np.log(p) - (1 - z) * np.log(1 - p), -1))


def test_the_defence_mixin_defends_another_classification_task():
  """PrivacyDefended on a task that is not GLUE: without a defence it is the plain task; with
  multidetasking it adds the adversary (its own params, optimizer and rng), the loss terms, the
  metrics, the private target and the refusals, checked against a numpy reference."""
  bert_config = BertConfig(
    vocab_size=32,
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
  )
  rng = jax.random.PRNGKey(3)
  plain, undefended = _Topics(_topics_config(""), None), _DefendedTopics(_topics_config(""), None)
  task = _DefendedTopics(_topics_config("multidetasking"), None)
  model = plain.build_model(bert_config)
  batch = {k: jnp.asarray(v[:4]) for k, v in plain.load_split("dev").arrays.items()}

  def step(task):  # params, outputs, (loss, metrics)
    params = nn.meta.unbox(task.init_variables(model, rng, 4)["params"])
    outputs = task.apply(model, params, batch, True)
    return params, outputs, task.loss(outputs, batch)

  # No defence: the plain task's computation (the same jaxpr), groups, targets, packing answer
  # and splits.
  assert undefended.adversary is None
  assert str(jax.make_jaxpr(lambda: step(undefended))()) == str(
    jax.make_jaxpr(lambda: step(plain))()
  )
  assert undefended.optimizer_groups() == {} and undefended.target_spec(4) == plain.target_spec(4)
  assert undefended.packing_unsupported() == "task 'topics' cannot be packed (GLUE and NER can)"
  undefended.load_split("train")  # a missing attribute is not refused without a defence

  # The adversary: Dense(4) -> ReLU -> Dense(2) of the pooled output, initialised from
  # fold_in(rng, 1), its logits computed here in numpy; the rest as the plain task's.
  r0 = jnp.zeros((1, bert_config.hidden_size))
  params, outputs, (total, metrics), plain_params, expected = jax.jit(
    lambda: (
      *step(task),
      nn.meta.unbox(plain.init_variables(model, rng, 4)["params"]),
      nn.meta.unbox(D.Adversary(2, 4).init(jax.random.fold_in(rng, 1), r0)["params"]),
    )
  )()
  assert set(params) == {"bert", "classifier", "adversary"}
  jax.tree.map(np.testing.assert_array_equal, {k: params[k] for k in plain_params}, plain_params)
  jax.tree.map(np.testing.assert_array_equal, params["adversary"], expected)
  adv = jax.tree.map(lambda a: np.asarray(a, np.float64), params["adversary"])
  r = np.asarray(outputs["pooled_output"], np.float64)
  h = np.maximum(r @ adv["hidden"]["kernel"] + adv["hidden"]["bias"], 0)
  logits = h @ adv["output"]["kernel"] + adv["output"]["bias"]
  # Two float32 products (float_tolerance, rule 2): magnitude the same products of |values|.
  hidden_terms = np.abs(r) @ np.abs(adv["hidden"]["kernel"]) + np.abs(adv["hidden"]["bias"])
  magnitude = hidden_terms @ np.abs(adv["output"]["kernel"]) + np.abs(adv["output"]["bias"])
  n = r.shape[-1] + h.shape[-1]
  assert_sum_close(outputs["adversary_logits"], logits, magnitude, n)
  assert_sum_close(outputs["encoder_adversary_logits"], logits, magnitude, n)
  # alpha * the task's cross-entropy + the adversary's loss + beta * the encoder's "not z" term.
  y = np.asarray(outputs["logits"], np.float64)
  log_p = y - y.max(-1, keepdims=True)
  log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
  main = -np.mean(log_p[np.arange(4), np.asarray(batch["label"])])
  z = np.asarray(batch["private"], np.float64)
  adversary, encoder = _np_bce_sum(logits, z), _np_bce_sum(logits, 1 - z)
  np.testing.assert_allclose(float(total), 0.5 * main + adversary + 2.0 * encoder, rtol=1e-5)
  assert set(metrics) == {
    "topics_ce",
    "main_loss",
    "defence_adversary",
    "defence_encoder",
    "defence_adversary_accuracy",
  }
  np.testing.assert_allclose(float(metrics["main_loss"]), main, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["defence_adversary"]), adversary, rtol=1e-5)
  assert float(metrics["defence_adversary_accuracy"]) == np.mean((logits > 0) == z)
  groups = task.optimizer_groups()
  assert list(groups) == ["adversary"] and groups["adversary"].learning_rate == 3e-3
  assert task.target_spec(4)["private"] == jax.ShapeDtypeStruct((4, 2), np.int32)
  assert task.packing_unsupported() == (
    "config.defence.name='multidetasking' cannot be packed (use config.packing.enabled=False)"
  )
  with pytest.raises(
    ValueError, match=r"^topics train: none of its 8 rows has private attribute 'y'"
  ):
    task.load_split("train")


def test_glue_without_a_defence_has_no_adversary(shared_data, tokenizer):
  task = GlueTask(_config(shared_data, private_attributes="cola_source"), tokenizer)
  bert_config = BertConfig.from_preset("tiny").replace(vocab_size=tokenizer.vocab_size)
  model = task.build_model(bert_config)
  assert task.adversary is None and task.defence == ""
  params = jax.eval_shape(lambda: task.init_variables(model, jax.random.PRNGKey(0), 2))["params"]
  assert set(params) == {"bert", "classifier"}
  assert task.optimizer_groups() == {} and set(task.target_spec(2)) == {"label"}
  assert task.packing_unsupported() == ""
