"""The trainer's state init (Assembled.init_state): one compiled program for every seed, same
values as with the mesh given."""

import jax
import numpy as np


def test_init_train_state_takes_the_seed_as_an_argument(minilm_dir, tmp_path):
  from bert_jax import parallel
  from bert_jax.model import BertConfig
  from bert_jax.tasks import create_task
  from bert_jax.tokenize import load_tokenizer
  from bert_jax.train import optimizers
  from bert_jax.train import state as state_lib
  from configs import glue

  tok = load_tokenizer(str(minilm_dir / "vocab.txt"))
  c = glue.get_config("rte")
  c.max_seq_length = 16
  task = create_task(c, tok)
  model = task.build_model(BertConfig.from_preset("tiny", vocab_size=tok.vocab_size))
  mesh = parallel.create_mesh(c.mesh)
  rules = parallel.normalize_rules(c.logical_axis_rules)
  tx = optimizers.create_optimizer(c.optimizer, optimizers.warmup_linear_decay(1e-4, 1, 10))
  init_params = lambda rng: task.init_variables(model, rng, 1)["params"]
  _, shardings = state_lib.abstract_train_state(init_params, tx, mesh, rules, 0)
  from jax.experimental.compilation_cache import compilation_cache

  from bert_jax.parallel.compilation_cache import enable_compilation_cache

  saved = (
    jax.config.jax_compilation_cache_dir,
    jax.config.jax_persistent_cache_min_compile_time_secs,
  )
  hits = []
  jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None
  )
  try:
    enable_compilation_cache(
      {"dir": str(tmp_path / "cache"), "min_compile_time_secs": 0.0, "max_size_bytes": -1}
    )
    counts, states = [], []
    for seed in (3, 4):
      before = len(hits)
      states.append(state_lib.init_train_state(init_params, tx, None, None, seed, shardings))
      counts.append(len(hits) - before)
    ref = state_lib.init_train_state(init_params, tx, mesh, rules, 3, shardings)
    for a, b in zip(
      jax.tree_util.tree_leaves(states[0]), jax.tree_util.tree_leaves(ref), strict=True
    ):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    kernel = lambda st: np.asarray(st.params["classifier"]["kernel"])
    assert not np.array_equal(kernel(states[0]), kernel(states[1]))  # the seed is used
  finally:
    jax.config.update("jax_compilation_cache_dir", saved[0])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])
    compilation_cache.reset_cache()
  # Seed 4's init program is seed 3's: loaded from the persistent cache, not compiled.
  assert counts[0] == 0 and counts[1] >= 1, counts


def test_new_head_kernels_follow_the_configured_distribution():
  """config.head_init: HF's N(0, 0.02^2) or google-research/bert's 2-sigma truncated normal."""
  import pytest
  import scipy.stats

  from bert_jax.model import BertConfig
  from bert_jax.model.heads import BertForQuestionAnswering, BertForSequenceClassification

  bert = BertConfig(
    vocab_size=50,
    hidden_size=256,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
  )
  ids = np.zeros((1, 8), np.int32)

  def kernel(module, name, seed=0):
    params = jax.jit(lambda r: module.init(r, ids))(jax.random.PRNGKey(seed))["params"]
    return np.asarray(jax.device_get(params[name]["kernel"].unbox()).ravel())

  normal = np.concatenate(
    [kernel(BertForSequenceClassification(bert, 8), "classifier", s) for s in range(4)]
  )  # 8,192 draws
  truncated = np.concatenate(
    [
      kernel(BertForSequenceClassification(bert, 8, head_init="truncated_normal"), "classifier", s)
      for s in range(4)
    ]
  )
  assert scipy.stats.kstest(normal, scipy.stats.norm(0, 0.02).cdf).pvalue > 1e-3
  assert scipy.stats.kstest(truncated, scipy.stats.truncnorm(-2, 2, scale=0.02).cdf).pvalue > 1e-3
  assert np.abs(truncated).max() <= 0.04 < np.abs(normal).max()
  assert kernel(BertForQuestionAnswering(bert), "qa_outputs").std() == pytest.approx(0.02, rel=0.15)
  with pytest.raises(ValueError, match="config.head_init must be one of"):
    kernel(BertForQuestionAnswering(bert, head_init="xavier"), "qa_outputs")
