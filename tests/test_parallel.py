"""Mesh / sharding: the same loss trajectory on 1 device and on 8 fake CPU devices under data
parallelism, FSDP, tensor parallelism and a mixed mesh, with params really sharded; bad meshes
and batch sizes are clear errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bert_jax import parallel
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.tasks.pretraining.loss import make_pretraining_loss
from bert_jax.tasks.pretraining.synthetic_input import SyntheticPretrainInput
from bert_jax.train import optimizers
from bert_jax.train.state import init_train_state
from bert_jax.train.train_step import jit_train_step, make_train_step
from configs import common

VOCAB, L, P_, B, STEPS = 512, 32, 5, 16, 5


def _trajectory(mesh_sizes, devices, grad_accum=1):
  """Losses of STEPS train steps of a tiny BERT (dropout on) on the given mesh."""
  bert = BertConfig(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=64,
  )
  model = BertForPreTraining(bert)
  mesh = parallel.create_mesh(mesh_sizes, devices)
  rules = parallel.normalize_rules(common.logical_axis_rules())
  schedule = optimizers.warmup_linear_decay(3e-3, 1, STEPS)
  tx = optimizers.create_optimizer(common.optimizer_config(), schedule)

  def init_params(rng):
    ids = jnp.zeros((1, L), jnp.int32)
    return model.init(rng, ids, ids, ids, jnp.zeros((1, P_), jnp.int32))["params"]

  state = init_train_state(init_params, tx, mesh, rules, seed=0)
  step = jit_train_step(
    make_train_step(make_pretraining_loss(model), tx, schedule, grad_accum, mesh),
    jax.tree_util.tree_map(lambda x: x.sharding, state),
    mesh,
    rules,
  )
  batch = next(SyntheticPretrainInput(B, L, P_, VOCAB, seed=1))  # one batch, learnt again
  losses = []
  for _ in range(STEPS):
    state, metrics = step(state, parallel.make_global_batch(batch, mesh, rules))
    losses.append(float(metrics["loss"]))
  return np.array(losses), state


@pytest.fixture(scope="module")
def reference():
  return _trajectory({"data": 1}, jax.devices()[:1])[0]


def _spec(x):
  """The array's partition spec, padded to its rank, with size-1 mesh axes left out."""
  mesh = x.sharding.mesh
  spec = tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec))
  return tuple(a if a is not None and mesh.shape[a] > 1 else None for a in spec)


@pytest.mark.parametrize(
  "sizes,expect",
  [
    ({"data": 8}, {"word": (None, None), "mlp_in": (None, None), "query": (None, None, None)}),
    (
      {"data": 1, "fsdp": 8},
      {"word": (None, "fsdp"), "mlp_in": ("fsdp", None), "query": ("fsdp", None, None)},
    ),
    (
      {"data": 4, "tensor": 2},
      {"word": ("tensor", None), "mlp_in": (None, "tensor"), "query": (None, "tensor", None)},
    ),
    (
      {"data": 2, "fsdp": 2, "tensor": 2},
      {"word": ("tensor", "fsdp"), "mlp_in": ("fsdp", "tensor"), "query": ("fsdp", "tensor", None)},
    ),
  ],
  ids=["data", "fsdp", "tensor", "mixed"],
)
def test_same_trajectory_and_real_sharding(reference, sizes, expect):
  assert jax.device_count() == 8
  losses, state = _trajectory(sizes, jax.devices())
  np.testing.assert_allclose(losses, reference, rtol=0, atol=1e-5)
  assert losses[-1] < losses[0]
  p = state.params["bert"]
  got = {
    "word": _spec(p["embeddings"]["word_embeddings"]["embedding"]),
    "mlp_in": _spec(p["layer_0"]["intermediate"]["kernel"]),
    "query": _spec(p["layer_0"]["attention"]["query"]["kernel"]),
  }
  assert got == expect
  # The optimizer's moments are sharded exactly like the params they belong to.
  mu = state.opt_state[1][0].mu["bert"]["layer_0"]["intermediate"]["kernel"]
  assert _spec(mu) == expect["mlp_in"]
  # Every shard of an fsdp/tensor-sharded weight holds only its slice.
  w = p["layer_0"]["intermediate"]["kernel"]
  n_shards = np.prod(
    [
      dict(data=1, fsdp=sizes.get("fsdp", 1), tensor=sizes.get("tensor", 1))[a]
      for a in expect["mlp_in"]
      if a
    ]
  )
  assert w.addressable_shards[0].data.size == w.size // n_shards


@pytest.mark.slow
def test_grad_accumulation_keeps_trajectory_close(reference):
  losses, _ = _trajectory({"data": 2, "fsdp": 2, "tensor": 2}, jax.devices(), grad_accum=2)
  # Two micro-batches average their (per-micro-batch normalised) losses: close, not identical.
  np.testing.assert_allclose(losses, reference, atol=0.05)


def test_mesh_errors():
  assert parallel.resolve_mesh_shape({"data": -1, "fsdp": 2}, 8) == (4, 2, 1)
  with pytest.raises(ValueError, match=r"needs 16 devices but only 8"):
    parallel.resolve_mesh_shape({"data": 16}, 8)
  with pytest.raises(ValueError, match=r"config.mesh"):
    parallel.resolve_mesh_shape({"data": -1, "fsdp": 3}, 8)
  with pytest.raises(ValueError, match=r"has 4 devices but 8"):
    parallel.resolve_mesh_shape({"data": 2, "fsdp": 2}, 8)
  with pytest.raises(ValueError, match=r"unknown mesh axes"):
    parallel.resolve_mesh_shape({"model": 2}, 8)
  with pytest.raises(ValueError, match=r"config.mesh"):
    parallel.create_mesh({"data": 16})


def test_batch_not_divisible_by_data_parallel_size():
  mesh = parallel.create_mesh({"data": 4, "fsdp": 2})
  parallel.check_batch_size(16, mesh)
  with pytest.raises(
    ValueError,
    match=r"config.train_batch_size=12 is not divisible by the "
    r"data-parallel size 8",
  ):
    parallel.check_batch_size(12, mesh)


def test_vocab_not_divisible_by_tensor_axis_is_left_unsharded():
  bert = BertConfig.from_preset("tiny", vocab_size=1001)
  model = BertForPreTraining(bert)
  mesh = parallel.create_mesh({"data": 2, "tensor": 4})
  rules = parallel.normalize_rules(common.logical_axis_rules())
  ids = jnp.zeros((1, 8), jnp.int32)
  abstract = jax.eval_shape(
    lambda: model.init(jax.random.PRNGKey(0), ids, ids, ids, ids[:, :2])["params"]
  )
  shardings = parallel.logical_shardings(abstract, mesh, rules)
  # 1001 % 4 != 0: the vocab dimension stays whole; everything else is sharded as configured.
  assert tuple(shardings["bert"]["embeddings"]["word_embeddings"]["embedding"].spec)[0] is None
  assert tuple(shardings["mlm_output_bias"].spec) == (None,)
  assert tuple(shardings["bert"]["layer_0"]["intermediate"]["kernel"].spec)[1] == "tensor"
  params = jax.jit(
    lambda: nn.meta.unbox(model.init(jax.random.PRNGKey(0), ids, ids, ids, ids[:, :2])["params"]),
    out_shardings=shardings,
  )()
  assert params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape == (1001, 128)


def test_rules_from_config_are_normalised():
  rules = parallel.normalize_rules([["batch", ["data", "fsdp"]], ["vocab", "tensor"], ["kv", None]])
  assert rules == (("batch", ("data", "fsdp")), ("vocab", "tensor"), ("kv", None))
  with pytest.raises(ValueError, match=r"logical_axis_rules\[0\]"):
    parallel.normalize_rules([("batch",)])
  mesh = parallel.create_mesh({"data": 4, "fsdp": 2})
  assert parallel.batch_spec(2, rules) == P(("data", "fsdp"), None)
  del mesh
