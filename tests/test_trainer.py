"""The one trainer: a task it has never heard of runs through it; parameter groups; the range
checks of run configs; abstract jobs (for compiling) have exactly the batches real runs feed."""

import json
import logging as std_logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import parallel
from bert_jax.runs.jobs import build_job
from bert_jax.runs.rules import check_run_config
from bert_jax.train import optimizers, trainer
from bert_jax.train.job import EvalResult, Job, Phase, Program, RunHooks
from configs import glue, pretrain


class _Linear(nn.Module):
  @nn.compact
  def __call__(self, x_BxF):
    kernel = self.param(
      "kernel", nn.with_logical_partitioning(nn.initializers.zeros, ("embed", "mlp")), (4, 1)
    )
    return (x_BxF @ kernel)[:, 0]


class _Regression:
  """y = x . w_true; batches depend only on their index, so resume is checkable."""

  w_true = np.array([1.0, -2.0, 0.5, 3.0], np.float32)

  def __init__(self, batch: int):
    self.batch, self.position = batch, 0

  def __iter__(self):
    return self

  def __next__(self):
    rng = np.random.default_rng(self.position)
    self.position += 1
    x = rng.normal(size=(self.batch, 4)).astype(np.float32)
    return {"x": x, "y": x @ self.w_true}

  def get_state(self):
    return {"position": self.position}

  def set_state(self, state):
    self.position = int(state["position"])


def _toy_job(config, evaluate=True) -> Job:
  model = _Linear()
  loss = lambda params, batch, rng, det: (
    jnp.mean(jnp.square(model.apply({"params": params}, batch["x"]) - batch["y"])),
    {},
  )

  def evaluate_fn(params, step, eval_step):
    del eval_step
    err = np.abs(np.asarray(jax.device_get(params["kernel"]))[:, 0] - _Regression.w_true).max()
    return EvalResult({"max_weight_error": float(err)}, {"max_weight_error": float(err)}, -err)

  steps = int(config.num_train_steps)
  spec = {
    "x": jax.ShapeDtypeStruct((8, 4), np.float32),
    "y": jax.ShapeDtypeStruct((8,), np.float32),
  }
  return Job(
    name="toy_regression",
    program=Program(
      init_params=lambda rng: model.init(rng, jnp.zeros((1, 4)))["params"],
      loss_fn=loss,
      schedule=optax.constant_schedule(float(config.learning_rate)),
      phases=[Phase("toy", steps, 8, 4, spec, make_input=lambda: _Regression(8))],
    ),
    hooks=RunHooks(
      evaluate=evaluate_fn if evaluate else None,
      keep_best=evaluate,
      eval_every_steps=steps // 2,
      save_every_steps=steps // 2,
    ),
  )


def _toy_config(steps=40, lr=0.1):
  c = pretrain.get_config("tiny")
  c.unlock()
  c.num_train_steps, c.learning_rate = steps, lr
  c.num_warmup_steps = 0
  c.optimizer.weight_decay = 0.0
  c.compilation_cache.dir = ""
  c.mesh.data, c.mesh.fsdp = 4, 2
  c.lock()
  return c


def test_a_task_the_trainer_does_not_know_trains_evaluates_and_keeps_the_best(tmp_path):
  c = _toy_config()
  summary = trainer.run(c, str(tmp_path), lambda config, workdir, mesh: _toy_job(config))
  assert summary["status"] == "completed" and summary["step"] == 40
  assert summary["task"] == "toy_regression" and summary["init"] == "scratch"
  # Adam at lr 0.1 for 40 steps on a noiseless regression gets close to the true weights.
  assert summary["eval"]["max_weight_error"] < 0.5
  history = json.loads((tmp_path / "eval_history.json").read_text())
  assert [h["step"] for h in history["history"]] == [20, 40]
  assert history["best_step"] == 40  # the later evaluation is the better one
  assert (tmp_path / "best" / "checkpoints" / "40").is_dir()
  written = json.loads((tmp_path / "summary.json").read_text())
  assert written["step"] == 40 and written["num_params"] == 4
  # Resuming a finished run trains nothing more and keeps the history.
  again = trainer.run(c, str(tmp_path), lambda config, workdir, mesh: _toy_job(config))
  assert again["init"] == "resumed" and again["start_step"] == 40


def test_no_evaluation_configured_is_said_once_and_not_logged_as_an_empty_eval(tmp_path, caplog):
  c = _toy_config(steps=4)
  with caplog.at_level(std_logging.INFO):
    summary = trainer.run(
      c, str(tmp_path), lambda config, workdir, mesh: _toy_job(config, evaluate=False)
    )
  assert summary["eval"] == {} and summary["status"] == "completed"
  text = caplog.text
  assert "No evaluation data configured" in text and "eval at step" not in text


def test_parameter_groups_scale_each_update_and_freeze_exactly():
  params = {
    "bert": {"w": jnp.ones((3,))},
    "head": {"w": jnp.ones((3,))},
    "lr2": {"w": jnp.ones((3,))},
  }
  grads = jax.tree_util.tree_map(lambda p: jnp.array([0.5, -1.0, 2.0]), params)
  base = optax.adamw(1e-2, weight_decay=0.01)
  scale = {"bert": 0.0, "head": 1.0, "lr2": 2.0}
  tx = optimizers.with_param_groups(base, lambda path: scale[path[0]])
  updates, _ = tx.update(grads, tx.init(params), params)
  # The reference: AdamW's own update for one parameter group, times the group's factor.
  ref, _ = base.update(grads, base.init(params), params)
  np.testing.assert_array_equal(updates["bert"]["w"], np.zeros(3))
  np.testing.assert_array_equal(updates["head"]["w"], ref["head"]["w"])
  np.testing.assert_allclose(updates["lr2"]["w"], 2.0 * np.asarray(ref["lr2"]["w"]), rtol=1e-7)
  # The state's tree is the plain optimizer's: checkpoints and shardings do not change.
  assert jax.tree_util.tree_structure(tx.init(params)[0]) == jax.tree_util.tree_structure(
    base.init(params)
  )


@pytest.mark.parametrize(
  "key, value, words",
  [
    ("learning_rate", -1e-4, "config.learning_rate=-0.0001 (must be a positive number)"),
    ("learning_rate", 0.0, "config.learning_rate=0.0"),
    ("learning_rate", float("inf"), "config.learning_rate=inf"),
    ("num_warmup_steps", -5, "config.num_warmup_steps=-5 (must be >= 0)"),
    ("train_batch_size", 0, "config.train_batch_size=0"),
  ],
)
def test_numbers_out_of_range_are_refused_naming_the_key(key, value, words):
  c = pretrain.get_config("tiny")
  c.unlock()
  c[key] = value
  with pytest.raises(ValueError, match="invalid config") as e:
    check_run_config(c)
  assert words in str(e.value)


def test_fine_tuning_keeps_its_documented_sentinels():
  c = glue.get_config("mrpc")  # num_warmup_steps=-1 (from the proportion), num_train_steps=0
  check_run_config(c)
  c.unlock()
  c.num_warmup_steps = -2
  with pytest.raises(ValueError, match=r"num_warmup_steps=-2 \(must be >= -1\)"):
    check_run_config(c)


def _spec(batch):
  return {k: (tuple(np.shape(v)), np.asarray(v).dtype) for k, v in batch.items()}


def test_abstract_pretraining_job_has_the_batches_a_run_feeds(tmp_path):
  c = pretrain.get_config("tiny")
  c.unlock()
  c.synthetic_data = True
  c.train_batch_size, c.phase2.train_batch_size = 16, 8
  mesh = parallel.create_mesh({"data": 1}, jax.devices()[:1])
  real = build_job(c, str(tmp_path), mesh)
  abstract = build_job(c, abstract=True)
  assert [p.name for p in abstract.program.phases] == ["seq128", "seq512"]
  for a, r in zip(abstract.program.phases, real.program.phases, strict=True):
    assert a.make_input is None
    fed = _spec(next(iter(r.make_input())))
    assert {k: (s.shape, s.dtype) for k, s in a.batch_spec.items()} == fed
  assert not any(tmp_path.iterdir())  # building a job writes nothing


def test_abstract_glue_job_has_the_batches_a_run_feeds(tmp_path, shared_data, minilm_dir):
  c = glue.get_config("stsb")
  c.unlock()
  c.data_dir = str(shared_data / "glue" / "STS-B")
  c.init_checkpoint = str(minilm_dir)
  c.max_train_examples, c.length_buckets, c.train_batch_size = 64, "", 16
  mesh = parallel.create_mesh({"data": 1}, jax.devices()[:1])
  real = build_job(c, str(tmp_path), mesh)
  abstract = build_job(c, abstract=True)
  fed = _spec(next(iter(real.program.phases[0].make_input())))
  assert {k: (s.shape, s.dtype) for k, s in abstract.program.phases[0].batch_spec.items()} == fed
  assert abstract.pretrained.subtrees is None and real.pretrained.subtrees == ("bert",)


def test_the_abstract_steps_compile_on_the_run_mesh():
  c = pretrain.get_config("tiny")
  c.unlock()
  c.train_batch_size, c.eval_batch_size, c.phase2.fraction = 16, 16, 0.0
  c.mesh.data, c.mesh.fsdp = 4, 2
  mesh = parallel.create_mesh(c.mesh)
  rules = parallel.normalize_rules(c.logical_axis_rules)
  asm = trainer.assemble(build_job(c, abstract=True), c, mesh, rules)
  compiled = trainer.lower_train_step(asm, 0).compile()
  state_in, batch_in = compiled.input_shardings[0]
  along_batch = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
  assert batch_in["input_ids"].is_equivalent_to(along_batch, 2)
  # Every parameter arrives sharded as the logical rules placed it in the abstract state.
  leaves = zip(
    jax.tree_util.tree_leaves(state_in.params),
    jax.tree_util.tree_leaves(asm.state_shardings.params),
    jax.tree_util.tree_leaves(asm.abstract_state.params),
    strict=True,
  )
  for got, want, x in leaves:
    assert got.is_equivalent_to(want, x.ndim)
  assert trainer.lower_eval_step(asm).compile() is not None
