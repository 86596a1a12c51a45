"""The shared training loop's throughput figures with batches of varying length (bucketing)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def _split(pairs):
  """[(phase, its step)] -> the loop's (phases, steps)."""
  return [p for p, _ in pairs], [s for _, s in pairs]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _State:
  step: jax.Array


class _Manager:
  """The CheckpointManager calls the loop makes, doing nothing."""

  directory = "nowhere"

  def save(self, *args, **kwargs):
    pass

  def wait(self):
    pass

  def check_for_errors(self):
    pass

  def latest_step(self):
    return None


class _Writer:
  def __init__(self):
    self.logged = []

  def scalars(self, step, values):
    self.logged.append((step, dict(values)))


def test_tokens_per_sec_counts_each_batch_at_its_own_length():
  from bert_jax import parallel
  from bert_jax.train.job import Phase
  from bert_jax.train.loop import LoopOptions, train_loop
  from configs.common import logical_axis_rules

  mesh = parallel.create_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  rules = parallel.normalize_rules(logical_axis_rules())
  batch, max_len = 8, 128
  lengths = [32, 128, 64, 32, 96, 32, 64, 128]  # a bucketed epoch: one per step

  def inputs():
    for length in lengths:
      yield {"input_ids": np.ones((batch, length), np.int32), "label": np.zeros(batch, np.int32)}

  step_fn = jax.jit(lambda s, b: (_State(s.step + 1), {"loss": jnp.sum(b["input_ids"]) * 0.0}))
  writer = _Writer()
  phase = (Phase("finetune", len(lengths), batch, max_len, {}, make_input=inputs), step_fn)
  options = LoopOptions(save_every_steps=100, log_every_steps=4)
  summary = train_loop(
    _State(jnp.zeros((), jnp.int32)), *_split([phase]), _Manager(), options, writer, mesh, rules
  )
  assert summary["step"] == len(lengths) and summary["status"] == "completed"
  logged = {step: values for step, values in writer.logged}
  # Step 1 is timed alone (compilation); steps 2-4 and 5-8 are the two logged intervals. The
  # first batch of each new length (steps 2, 3 and 5: 128, 64, 96) compiles the step again and
  # is timed apart (compile_sec), out of the rates.
  assert "train/first_step_sec" in logged[1] and "train/tokens_per_sec" not in logged[1]
  for step, rows in ((4, [lengths[3]]), (8, lengths[5:8])):
    m = logged[step]
    assert m["train/compile_sec"] > 0
    # Both rates share the interval's seconds, so their ratio is the tokens per example fed.
    np.testing.assert_allclose(
      m["train/tokens_per_sec"] / m["train/examples_per_sec"], np.mean(rows), rtol=1e-9
    )
    np.testing.assert_allclose(m["train/steps_per_sec"] * batch, m["train/examples_per_sec"])


def test_ctrl_c_asks_for_a_save_and_a_second_one_aborts():
  import signal

  from bert_jax.train.loop import PreemptionWatcher

  # Python's own handler, whatever this process inherited (a job started in the background of a
  # non-interactive shell inherits SIGINT ignored).
  inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with PreemptionWatcher() as watcher:
      assert not watcher.requested()
      signal.raise_signal(signal.SIGINT)  # the first Ctrl-C: save and stop at the next step
      assert watcher.requested()
      with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)  # the second: at once
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
  finally:
    signal.signal(signal.SIGINT, inherited)


def test_each_phases_first_step_is_timed_apart_from_its_throughput():
  """A phase's first step compiles its own step function: like the run's first step it is logged
  as first_step_sec, not folded into the next interval's rates (a 128 -> 512 curriculum's first
  seq-512 interval read a small fraction of its real rate)."""
  from bert_jax import parallel
  from bert_jax.train.job import Phase
  from bert_jax.train.loop import LoopOptions, train_loop
  from configs.common import logical_axis_rules

  mesh = parallel.create_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  rules = parallel.normalize_rules(logical_axis_rules())
  batch = 8

  def phase(name, end_step, length):
    def inputs():
      while True:
        yield {"input_ids": np.ones((batch, length), np.int32)}

    step_fn = jax.jit(lambda s, b: (_State(s.step + 1), {"loss": jnp.sum(b["input_ids"]) * 0.0}))
    return (Phase(name, end_step, batch, length, {}, make_input=inputs), step_fn)

  writer = _Writer()
  options = LoopOptions(save_every_steps=100, log_every_steps=4)
  phases = [phase("seq128", 6, 128), phase("seq512", 12, 512)]
  summary = train_loop(
    _State(jnp.zeros((), jnp.int32)), *_split(phases), _Manager(), options, writer, mesh, rules
  )
  assert summary["step"] == 12
  logged = {step: values for step, values in writer.logged}
  for first in (1, 7):  # the first step of each phase
    assert "train/first_step_sec" in logged[first], sorted(logged)
    assert "train/tokens_per_sec" not in logged[first]
  # After phase 2's first step, its intervals count only its own later steps at 512 tokens each.
  m = logged[8]
  assert m["train/tokens_per_sec"] / m["train/examples_per_sec"] == pytest.approx(512)
  assert m["train/steps_per_sec"] > 0 and "train/first_step_sec" not in m
  assert "train/compile_sec" not in m  # one shape per phase: nothing compiles after its first


def test_a_step_that_compiles_a_new_shape_is_kept_out_of_the_rates():
  """A slow first call per batch shape (as a compile is) shows as compile_sec, and the interval's
  rates are those of the other steps."""
  import time

  from bert_jax import parallel
  from bert_jax.train.job import Phase
  from bert_jax.train.loop import LoopOptions, train_loop
  from configs.common import logical_axis_rules

  mesh = parallel.create_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  rules = parallel.normalize_rules(logical_axis_rules())
  batch, lengths = 8, [32, 32, 64, 32, 64, 64, 32, 64]
  jitted = jax.jit(lambda s, b: (_State(s.step + 1), {"loss": jnp.sum(b["input_ids"]) * 0.0}))
  seen = set()

  def step_fn(state, b):
    if b["input_ids"].shape not in seen:
      seen.add(b["input_ids"].shape)
      time.sleep(2.0)  # a compile
    return jitted(state, b)

  def inputs():
    for length in lengths:
      yield {"input_ids": np.ones((batch, length), np.int32)}

  writer = _Writer()
  phase = (Phase("finetune", len(lengths), batch, 64, {}, make_input=inputs), step_fn)
  options = LoopOptions(save_every_steps=100, log_every_steps=4)
  train_loop(
    _State(jnp.zeros((), jnp.int32)), *_split([phase]), _Manager(), options, writer, mesh, rules
  )
  logged = {step: values for step, values in writer.logged}
  m = logged[4]  # steps 2-4; step 3 is the first of length 64
  assert 2.0 <= m["train/compile_sec"] < 10
  # 2 steps of milliseconds (even on a loaded host), not 3 steps in over 2 s (1.5 steps/s)
  assert m["train/steps_per_sec"] > 3
  np.testing.assert_allclose(m["train/tokens_per_sec"] / m["train/examples_per_sec"], 32)
  assert "train/compile_sec" not in logged[8]  # no new shape in steps 5-8


def _counting_phase(total, batch=8, length=16, on_step=None):
  from bert_jax.train.job import Phase

  jitted = jax.jit(lambda s, b: (_State(s.step + 1), {"loss": jnp.sum(b["input_ids"]) * 0.0}))

  def step_fn(state, b):
    if on_step is not None:
      on_step()
    return jitted(state, b)

  def inputs():
    while True:
      yield {"input_ids": np.ones((batch, length), np.int32)}

  return (Phase("finetune", total, batch, length, {}, make_input=inputs), step_fn)


def _mesh_rules():
  from bert_jax import parallel
  from configs.common import logical_axis_rules

  mesh = parallel.create_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  return mesh, parallel.normalize_rules(logical_axis_rules())


@pytest.mark.parametrize("resumed_at", [10, 20])
def test_a_resumed_run_redoes_the_evaluation_it_died_in(resumed_at):
  """Killed during the evaluation of step 10 (or of the final step 20) after that step's
  checkpoint was saved: the resumed loop evaluates that step before training on."""
  from bert_jax.train.loop import LoopOptions, train_loop

  mesh, rules = _mesh_rules()
  evaluated_steps = []

  def eval_fn(state):
    evaluated_steps.append(int(state.step))
    return {"accuracy": 0.5}

  def run(evaluated):
    evaluated_steps.clear()
    options = LoopOptions(
      save_every_steps=5, log_every_steps=100, eval_every_steps=10, eval_fn=eval_fn,
      evaluated=evaluated,
    )  # fmt: skip
    state = _State(jnp.asarray(resumed_at, jnp.int32))
    return train_loop(
      state, *_split([_counting_phase(20)]), _Manager(), options, _Writer(), mesh, rules
    )

  summary = run(lambda step: False)  # the history lacks the resumed step's evaluation
  assert evaluated_steps == ([10, 20] if resumed_at == 10 else [20])
  assert summary["eval"] == {"accuracy": 0.5} and summary["step"] == 20
  run(lambda step: True)  # it has it: nothing is evaluated twice
  assert evaluated_steps == ([20] if resumed_at == 10 else [])


def test_slow_steps_log_a_progress_line_at_least_every_interval():
  """Steps of 6 s (a fake clock) with log_every_steps=1000: a line about every 30 s, with the
  interval's rates, not only at the first and the last step."""
  from bert_jax.train.loop import LoopOptions, train_loop

  mesh, rules = _mesh_rules()
  now = [0.0]

  def tick():
    now[0] += 6.0

  writer = _Writer()
  options = LoopOptions(
    save_every_steps=1000, log_every_steps=1000, progress_interval_sec=30.0, clock=lambda: now[0]
  )
  state = _State(jnp.zeros((), jnp.int32))
  train_loop(
    state, *_split([_counting_phase(22, on_step=tick)]), _Manager(), options, writer, mesh, rules
  )
  logged = [step for step, values in writer.logged if "train/loss" in values]
  # Step 1 (compiling) at t=6; then a line once 30 s passed: steps 6, 11, 16, 21; the last, 22.
  assert logged == [1, 6, 11, 16, 21, 22]
  assert all("train/steps_per_sec" in values for step, values in writer.logged if step in (6, 11))


def test_the_loop_runs_at_most_two_steps_ahead_of_the_device():
  """JAX dispatches steps asynchronously; the loop waits for step N-2's results before going on
  from step N, so its clock (progress lines every 30 s, rates) follows the steps done, not their
  dispatch (a fine-tuning run had queued minutes of steps and logged nothing meanwhile)."""
  from bert_jax import parallel
  from bert_jax.train.job import Phase
  from bert_jax.train.loop import LoopOptions, train_loop
  from configs.common import logical_axis_rules

  waited: list[int] = []  # (step waited for) in order
  dispatched: list[int] = []

  class Pending:
    """A step's metric not computed yet: records when the loop waits for it."""

    def __init__(self, step):
      self.step = step

    def block_until_ready(self):
      waited.append(self.step)
      return self

    def __float__(self):
      return 0.0

  def step_fn(state, b):
    step = len(dispatched) + 1
    # the loop waits for step - 2 at the latest right after dispatching step
    assert all(s in waited for s in range(1, step - 2)), (step, waited)
    dispatched.append(step)
    return _State(state.step + 1), {"loss": Pending(step)}

  def inputs():
    while True:
      yield {"input_ids": np.ones((8, 16), np.int32)}

  mesh = parallel.create_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  rules = parallel.normalize_rules(logical_axis_rules())
  phase = (Phase("p", 12, 8, 16, {}, make_input=inputs), step_fn)
  options = LoopOptions(save_every_steps=100, log_every_steps=100)
  train_loop(
    _State(jnp.zeros((), jnp.int32)), *_split([phase]), _Manager(), options, _Writer(), mesh, rules
  )
  assert dispatched == list(range(1, 13)) and set(range(1, 11)) <= set(waited)
