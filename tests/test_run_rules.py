"""The trainer takes what a task decides through the task: the run config's rules, the
workdir's identity and the run-wide settings (``bert_jax.runs.rules``,
``bert_jax.train.job.RunRules`` / ``RunSettings``); ``bert_jax/train`` names no task's keys.

References: the messages the single rule list gave before the rules moved to the tasks (the
problems of a config named in the same order), written out here."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from bert_jax.runs.finetuning import runner_io
from bert_jax.runs.finetuning.rules import FINETUNING_RULES
from bert_jax.runs.pretraining.rules import PRETRAINING_RULES
from bert_jax.runs.rules import FINETUNING_RUN, PRETRAINING_RUN, check_run_config, config_rules
from bert_jax.train import run_config, trainer
from bert_jax.train.job import Job, Program, RunSettings
from configs import glue, pretrain

TRAIN = pathlib.Path(__file__).resolve().parent.parent / "bert_jax" / "train"


def _set(config, **values):
  config.unlock()
  for key, value in values.items():
    node = config
    *parents, leaf = key.split("__")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def test_pretraining_problems_are_named_in_the_order_they_were():
  c = _set(
    pretrain.get_config("tiny"),
    learning_rate=-1.0,
    masked_lm_prob=1.5,
    attention_probs_dropout_prob=2.0,
    phase2__fraction=1.0,
    logging__log_every_steps=0,
    num_warmup_steps=-1,
    num_train_steps=0,
  )
  expected = (
    "invalid config: config.learning_rate=-1.0 (must be a positive number); "
    "config.masked_lm_prob=1.5 (must be in (0, 1)); "
    "config.attention_probs_dropout_prob=2.0 (must be in [0, 1)); "
    "config.phase2.fraction=1.0 (must be in [0, 1)); "
    "config.logging.log_every_steps=0 (must be >= 1); "
    "config.num_warmup_steps=-1 (must be >= 0); "
    "config.num_train_steps=0 (must be >= 1)"
  )
  for check in (
    lambda: check_run_config(c),  # the tasks' pick, for callers without rules
    lambda: run_config.check_run_config(c, rules=PRETRAINING_RULES),
  ):
    with pytest.raises(ValueError) as e:
      check()
    assert str(e.value) == expected


def test_fine_tuning_problems_are_named_in_the_order_they_were():
  c = _set(
    glue.get_config("mrpc"),
    grad_accum_steps=0,
    num_train_epochs=0.0,
    warmup_proportion=2.0,
    save_checkpoints_steps=-1,
    num_warmup_steps=-2,
    num_train_steps=-1,
  )
  expected = (
    "invalid config: config.grad_accum_steps=0 (must be >= 1); "
    "config.num_train_epochs=0.0 (must be a positive number); "
    "config.warmup_proportion=2.0 (must be in [0, 1]); "
    "config.save_checkpoints_steps=-1 (must be >= 0); "
    "config.num_warmup_steps=-2 (must be >= -1); "
    "config.num_train_steps=-1 (must be >= 0)"
  )
  with pytest.raises(ValueError) as e:
    check_run_config(c)
  assert str(e.value) == expected
  assert config_rules(c) is FINETUNING_RULES and FINETUNING_RUN.config is FINETUNING_RULES


def test_the_generic_rules_know_no_task_key():
  c = _set(pretrain.get_config("tiny"), masked_lm_prob=1.5, phase2__train_batch_size=3)
  run_config.check_run_config(c, {"data": 2}, processes=1, rules=run_config.GENERIC_RULES)
  with pytest.raises(ValueError, match=r"config.phase2.train_batch_size=3 is not divisible by"):
    run_config.check_batch_layout(c, {"data": 2}, processes=1, rules=PRETRAINING_RULES)
  with pytest.raises(ValueError, match=r"masked_lm_prob"):
    run_config.check_run_config(c, rules=PRETRAINING_RUN.config)


def test_the_trainer_names_no_task_key():
  """Only docstrings and comments of bert_jax/train may name a task's keys; the trainer reads
  the run-wide settings from the Job (``RunSettings.from_config`` makes them in job.py)."""
  task_keys = re.compile(
    r"masked_lm_prob|phase2|warmup_proportion|num_train_epochs|objective|model_preset|\"task\""
  )
  settings = re.compile(r"config\.(optimizer|checkpoint|logging|seed)\b")
  for path in TRAIN.glob("*.py"):
    code, in_doc = [], False
    for line in path.read_text().splitlines():
      quotes = line.count('"""')
      if in_doc or quotes:
        in_doc = in_doc != (quotes % 2 == 1)
        continue
      code.append(line.split("#")[0])
    found = [line for line in code if task_keys.search(line)]
    if path.name == "trainer.py":
      found += [line for line in code if settings.search(line)]
    assert not found, (path.name, found)


def test_glue_workdirs_gain_their_later_keys_from_the_glue_task(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"task": "rte"}))
  config = runner_io.read_run_config(str(tmp_path))
  assert config.train_sample_seed == -1 and config.defence.name == ""
  assert config.remat is False  # added to every fine-tuning config with remat
  (tmp_path / "config.json").write_text(json.dumps({"task": "squad_v1"}))
  config = runner_io.read_run_config(str(tmp_path))
  assert "defence" not in config and "train_sample_seed" not in config


def test_the_job_carries_the_run_settings_the_trainer_applies():
  c = pretrain.get_config("tiny")
  settings = RunSettings.from_config(c)
  assert (settings.seed, settings.optimizer, settings.checkpoint, settings.logging) == (
    12345,
    c.optimizer,
    c.checkpoint,
    c.logging,
  )
  other = RunSettings(c.optimizer, 7, c.checkpoint, c.logging)
  job = Job("toy", Program(None, None, None, []), settings=other)
  assert job.run_settings(c).seed == 7
  assert Job("toy", Program(None, None, None, [])).run_settings(c) == settings


def test_a_workdir_identity_is_the_task_s(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"task": "mrpc"}))
  c = pretrain.get_config("tiny")
  trainer.check_workdir_identity(c, str(tmp_path))  # no identity: any workdir
  with pytest.raises(ValueError) as e:
    trainer.check_workdir_identity(c, str(tmp_path), PRETRAINING_RUN.identity)
  assert str(e.value) == (
    f"workdir {tmp_path} holds a 'mrpc' run ({tmp_path}/config.json: task); this config is "
    "pre-training (objective 'mlm_nsp'): use a new --workdir"
  )
  (tmp_path / "config.json").write_text(json.dumps({"learning_rate": 1.0}))
  with pytest.raises(ValueError) as e:
    trainer.check_workdir_identity(glue.get_config("rte"), str(tmp_path), FINETUNING_RUN.identity)
  assert str(e.value) == (
    f"workdir {tmp_path} holds a run of no task or objective ({tmp_path}/config.json: no task);"
    " this config is 'rte': use a new --workdir"
  )
