"""The run's BertConfig comes from one factory (``bert_jax.model.run_settings``) and a kernel's
traits from one table (``bert_jax.model.kernels.attention.ATTENTION_KERNELS``).

References: the three ways the run's encoder used to be made (pre-training's
``bert_config_from``, fine-tuning's ``resolve_model`` / abstract job, the planner's
``kernel_for``), written out here as they were, compared with what each path gives now on
every platform; and a kernel entry changed in the table, which every reader must follow."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from bert_jax.model import BertConfig
from bert_jax.model.kernels import attention as kernels
from bert_jax.model.run_settings import NUMERICS_KEYS, run_bert_config
from bert_jax.parallel.topology import parse_topology
from bert_jax.plan import attention as plan_attention
from bert_jax.runs.finetuning import runner as ft_runner
from bert_jax.runs.finetuning import runner_io
from bert_jax.runs.pretraining import runner as pt_task
from bert_jax.runs.rules import check_run_config
from configs import glue, ner, pretrain, squad, swag

PLATFORMS = ("cpu", "gpu", "tpu")


# --- the old paths, as they were --------------------------------------------------------------
def _old_kernel(requested, dropout, platform, lengths):
  found = {
    kernels.resolve_attention_kernel(
      requested,
      attention_dropout=dropout,
      platform=platform,
      max_seq_length=length,
      length_key=key,
    )
    for length, key in lengths
  }
  if len(found) > 1:
    found.discard("splash")
  return found.pop()


def _old_pretraining(config, vocab_size, platform):
  bert = BertConfig.from_preset(config.model_preset, vocab_size=vocab_size).replace(
    dtype=config.dtype,
    remat=config.remat,
    is_decoder=config.objective == "ltr",
    hidden_dropout_prob=float(config.hidden_dropout_prob),
    attention_probs_dropout_prob=float(config.attention_probs_dropout_prob),
  )
  lengths = [(config.max_seq_length, "config.max_seq_length")] + (
    [(config.phase2.max_seq_length, "config.phase2.max_seq_length")]
    if config.phase2.fraction > 0
    else []
  )
  kernel = _old_kernel(
    config.attention_kernel, float(config.attention_probs_dropout_prob), platform, lengths
  )
  return bert.replace(attention_kernel=kernel)


def _old_finetuning(base, config, platform, causal):
  bert = base.replace(
    is_decoder=causal,
    dtype=config.dtype,
    hidden_dropout_prob=float(config.hidden_dropout_prob),
    attention_probs_dropout_prob=float(config.attention_probs_dropout_prob),
  )
  kernel = _old_kernel(
    config.get("attention_kernel", "reference"),
    bert.attention_probs_dropout_prob,
    platform,
    [(int(config.max_seq_length), "config.max_seq_length")],
  )
  return bert.replace(attention_kernel=kernel)


# --- configs ----------------------------------------------------------------------------------
def _pretrain_config(kernel, dropout, **changes):
  c = pretrain.get_config("tiny")  # phase 2 at 512 over the last 10%
  c.unlock()
  c.attention_kernel, c.attention_probs_dropout_prob = kernel, dropout
  for k, v in changes.items():
    node = c
    *parents, leaf = k.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = v
  return c


def _glue_config(kernel, dropout, **changes):
  c = glue.get_config("mrpc")
  c.unlock()
  c.attention_kernel, c.attention_probs_dropout_prob = kernel, dropout
  c.update(changes)
  return c


CASES = [
  ("reference", 0.1, {}),
  ("auto", 0.1, {}),
  ("auto", 0.0, {}),
  ("auto", 0.0, {"max_seq_length": 200, "phase2.max_seq_length": 256}),  # tpu: dot_product
  ("auto", 0.0, {"phase2.fraction": 0.0}),
  ("dot_product", 0.0, {"dtype": "bfloat16"}),
  ("auto", 0.0, {"objective": "ltr", "remat": True}),
]


def _outcome(make):
  """What ``make()`` gives: its value, or the ValueError's message (a refusal must match too)."""
  try:
    return make()
  except ValueError as e:
    return f"ValueError: {e}"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("kernel, dropout, changes", CASES)
def test_pretraining_gets_the_encoder_it_got_before(
  monkeypatch, platform, kernel, dropout, changes
):
  config = _pretrain_config(kernel, dropout, **changes)
  monkeypatch.setattr(pt_task, "platform_of", lambda mesh: platform)
  new = _outcome(lambda: pt_task.bert_config_from(config, 97))
  assert new == _outcome(lambda: _old_pretraining(config, 97, platform))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(
  "kernel, dropout, changes",
  [
    ("reference", 0.1, {}),
    ("auto", 0.1, {}),
    ("auto", 0.0, {}),
    ("auto", 0.0, {"max_seq_length": 200}),
    ("splash", 0.0, {"max_seq_length": 256}),
    ("dot_product", 0.0, {"dtype": "bfloat16"}),
  ],
)
def test_fine_tuning_gets_the_encoder_it_got_before(
  monkeypatch, platform, kernel, dropout, changes
):
  config = _glue_config(kernel, dropout, **changes)
  monkeypatch.setattr(runner_io, "platform_of", lambda mesh: platform)
  base = BertConfig.from_preset("tiny", vocab_size=97)
  for causal in (False, True):
    new = _outcome(lambda c=causal: runner_io.run_model_config(base, config, is_decoder=c))
    assert new == _outcome(lambda c=causal: _old_finetuning(base, config, platform, c))
  # the abstract job's encoder: the preset at BERT's vocabulary, is_decoder as the preset's
  abstract = _outcome(lambda: ft_runner._abstract_bert_config(config))
  assert abstract == _outcome(
    lambda: _old_finetuning(BertConfig.from_preset("tiny"), config, platform, False)
  )


@pytest.mark.parametrize("platform", PLATFORMS)
def test_evaluation_keeps_the_trained_dropout_and_takes_the_run_numerics(monkeypatch, platform):
  """``evaluate`` used ``model_config.json`` with the config's dtype and the kernel resolved with
  the model's own attention dropout."""
  trained = BertConfig.from_preset("tiny", vocab_size=97).replace(
    hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.0
  )
  config = _glue_config("auto", 0.1, dtype="bfloat16")  # an override of the rate: not applied
  monkeypatch.setattr(runner_io, "platform_of", lambda mesh: platform)
  got = runner_io.run_model_config(trained, config, keys=NUMERICS_KEYS)
  old_kernel = _old_kernel("auto", 0.0, platform, [(128, "config.max_seq_length")])
  assert got == trained.replace(dtype="bfloat16", attention_kernel=old_kernel)


@pytest.mark.parametrize("topology", ["v5litepod-4", "h100:8"])
@pytest.mark.parametrize("kernel, dropout, changes", CASES)
def test_the_planner_resolves_the_kernel_the_run_does(topology, kernel, dropout, changes):
  topo = parse_topology(topology)
  config = _pretrain_config(kernel, dropout, **changes)
  platform = plan_attention.platform(topo)
  lengths = [(config.max_seq_length, "config.max_seq_length")]
  if config.phase2.fraction > 0:
    lengths.append((config.phase2.max_seq_length, "config.phase2.max_seq_length"))
  old = _outcome(lambda: _old_kernel(kernel, dropout, platform, lengths))
  assert _outcome(lambda: plan_attention.kernel_for(config, topo)) == old
  run = _outcome(lambda: run_bert_config(BertConfig(), config, platform=platform).attention_kernel)
  assert run == old


def test_every_fine_tuning_config_has_remat_off():
  for config in (
    glue.get_config("rte"),
    squad.get_config("v1"),
    ner.get_config(),
    swag.get_config(),
  ):
    assert config.remat is False


# --- one table ----------------------------------------------------------------------------------
def test_the_public_names_are_read_from_the_table():
  assert (
    kernels.KERNELS == tuple(kernels.ATTENTION_KERNELS) == ("reference", "dot_product", "splash")
  )
  assert kernels.FUSED == ("dot_product", "splash")
  assert kernels.CHOICES == ("auto",) + kernels.KERNELS
  assert [plan_attention.is_fused(k) for k in kernels.KERNELS] == [False, True, True]


def test_check_auto_and_the_planner_follow_a_changed_entry(monkeypatch):
  """A splash whose block is 256 and that runs on GPUs as well: every reader follows."""
  table = kernels.ATTENTION_KERNELS
  changed = dataclasses.replace(
    table["splash"],
    length_multiple=256,
    platforms=("tpu", "gpu"),
    custom_calls={"tpu": "TPU_CALL", "gpu": "GPU_CALL"},
  )
  monkeypatch.setitem(table, "splash", changed)

  def resolve(requested, platform, length, dropout=0.0):
    return kernels.resolve_attention_kernel(
      requested, attention_dropout=dropout, platform=platform, max_seq_length=length
    )

  assert resolve("auto", "tpu", 256) == "splash"
  assert resolve("auto", "tpu", 128) == "dot_product"  # 128 is not a multiple of the block now
  assert resolve("splash", "gpu", 256) == "splash"  # it runs there now
  with pytest.raises(ValueError, match=r"needs config.max_seq_length a multiple of 256, got 128"):
    resolve("splash", "tpu", 128)
  assert plan_attention.fused_calls("GPU_CALL GPU_CALL", "splash", "gpu") == 2
  monkeypatch.setitem(table, "dot_product", dataclasses.replace(table["dot_product"], fused=False))
  assert not plan_attention.is_fused("dot_product")
  kernels.check_kernel("dot_product", 0.1)  # no longer a fused kernel: dropout is allowed


def test_the_run_config_rule_names_the_table_choices():
  config = _pretrain_config("flash", 0.0)
  with pytest.raises(ValueError, match=r"must be auto, reference, dot_product or splash\)$"):
    check_run_config(config)


def test_the_encoder_dispatch_reads_the_table():
  """bert.py asks the table whether a kernel is fused and whether it narrows queries."""
  from bert_jax.model import bert

  source = inspect.getsource(bert)
  assert '== "splash"' not in source and '== "reference"' not in source
  assert "kernel_traits(c.attention_kernel).whole_row_queries" in source
