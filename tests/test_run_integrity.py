"""A run's workdir and results can be trusted: a workdir holds one job (another task, objective or
model is refused before anything is touched), an evaluation the process died in is redone on
resume, a run that fails before writing leaves no directory behind, a full disk during a
checkpoint is one clear error with nothing left half-written, and the init report is said once."""

import dataclasses
import errno
import json
import logging as std_logging
import os

import orbax.checkpoint as ocp
import pytest
from test_trainer import _toy_config, _toy_job

from bert_jax.checkpoint import CheckpointSaveError
from bert_jax.runs.finetuning import runner
from bert_jax.runs.rules import FINETUNING_RUN, PRETRAINING_RUN
from bert_jax.train import trainer
from configs import glue, pretrain


def _listing(directory):
  """path -> (size, mtime) of every file under ``directory``."""
  out = {}
  for root, _, files in os.walk(directory):
    for f in files:
      p = os.path.join(root, f)
      out[p] = (os.path.getsize(p), os.path.getmtime(p))
  return out


def _glue(task, data_dir, minilm_dir, **kw):
  """A from-scratch tiny encoder on a slice: seconds per run."""
  c = glue.get_config(task)
  c.data_dir = str(data_dir)
  c.vocab_file = str(minilm_dir / "vocab.txt")
  c.max_seq_length = 32
  c.train_batch_size = 16
  c.eval_batch_size = 16
  c.max_train_examples = 32
  c.max_eval_examples = 16
  c.num_train_steps = 2
  c.predict_test = False
  c.length_buckets = ""  # one batch shape: one compile
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def _pretrain(**kw):
  c = pretrain.get_config("tiny")
  for k, v in dict(
    synthetic_data=True,
    num_train_steps=2,
    train_batch_size=8,
    max_seq_length=32,
    max_predictions_per_seq=4,
    save_checkpoints_steps=1,
    max_eval_steps=1,
    eval_batch_size=8,
    **kw,
  ).items():
    setattr(c, k, v)
  c.phase2.fraction = 0.0
  return c


@pytest.fixture(scope="module")
def mrpc_workdir(tmp_path_factory, shared_data, minilm_dir):
  workdir = tmp_path_factory.mktemp("mrpc")
  result = runner.finetune(_glue("mrpc", shared_data / "glue", minilm_dir), str(workdir))
  assert result["status"] == "completed"
  return workdir


def test_a_workdir_of_another_task_is_refused_before_anything_is_touched(
  mrpc_workdir, shared_data, minilm_dir, tmp_path
):
  before = _listing(mrpc_workdir)
  # SST-2 into MRPC's workdir. Its data directory does not even exist: nothing is read.
  c = _glue("sst2", tmp_path / "no_data_here", minilm_dir)
  message = (
    f"workdir {mrpc_workdir} holds a 'mrpc' run ({mrpc_workdir}/config.json: task); this "
    "config is 'sst2': use a new --workdir"
  )
  with pytest.raises(ValueError) as e:
    runner.finetune(c, str(mrpc_workdir))
  assert str(e.value) == message
  # Pre-training into it.
  with pytest.raises(ValueError, match=r"holds a 'mrpc' run .*: task\); this config is "
                     r"pre-training \(objective 'mlm_nsp'\): use a new --workdir"):  # fmt: skip
    trainer.run(
      _pretrain(), str(mrpc_workdir), lambda *a: pytest.fail("built a job"), rules=PRETRAINING_RUN
    )
  # A from-scratch MRPC run of another size.
  c = _glue("mrpc", shared_data / "glue", minilm_dir, model_preset="mini")
  with pytest.raises(ValueError, match=r"model_config.json: this workdir holds another model "
                     r"\(hidden_size: 128 in the workdir vs 256 now"):  # fmt: skip
    runner.finetune(c, str(mrpc_workdir))
  assert _listing(mrpc_workdir) == before  # not a byte written, no lock file left
  # What users change on a resume is not the job: MRPC with more steps and another learning
  # rate resumes and trains on.
  c = _glue("mrpc", shared_data / "glue", minilm_dir, num_train_steps=3, learning_rate=3e-5)
  trainer.check_workdir_identity(c, str(mrpc_workdir), FINETUNING_RUN.identity)


def test_a_pretraining_workdir_is_refused_to_another_objective_and_to_fine_tuning(
  tmp_path, shared_data, minilm_dir
):
  workdir = tmp_path / "pretrain"
  from bert_jax.runs.pretraining.runner import run_pretraining

  assert run_pretraining(_pretrain(), str(workdir))["status"] == "completed"
  before = _listing(workdir)
  with pytest.raises(ValueError) as e:
    run_pretraining(_pretrain(objective="ltr"), str(workdir))
  assert str(e.value) == (
    f"workdir {workdir} holds a pre-training (objective 'mlm_nsp') run ({workdir}/config.json: "
    "objective); this config is pre-training (objective 'ltr'): use a new --workdir"
  )
  with pytest.raises(ValueError) as e:
    runner.finetune(_glue("sst2", shared_data / "glue", minilm_dir), str(workdir))
  assert str(e.value) == (
    f"workdir {workdir} holds a pre-training (objective 'mlm_nsp') run ({workdir}/config.json: "
    "no task); this config is 'sst2': use a new --workdir"
  )
  assert _listing(workdir) == before


class _Killed(BaseException):
  """Stands for SIGKILL: the process ends where it is, no handler runs."""


def _toy_run(workdir, kill_eval_at=None, keep=3):
  c = _toy_config()
  c.unlock()
  c.checkpoint.keep_checkpoint_max = keep
  c.lock()

  def build(config, workdir, mesh):
    job = _toy_job(config)
    evaluate = job.hooks.evaluate

    def killed_during(params, step, eval_step):
      if step == kill_eval_at:
        raise _Killed
      return evaluate(params, step, eval_step)

    hooks = dataclasses.replace(job.hooks, evaluate=killed_during, save_every_steps=10)
    return dataclasses.replace(job, hooks=hooks)

  return trainer.run(c, str(workdir), build)


def _history(workdir):
  return json.loads((workdir / "eval_history.json").read_text())


def test_killed_during_its_final_evaluation_a_run_reports_the_same_result(tmp_path, caplog):
  reference = _toy_run(tmp_path / "uninterrupted")
  assert [h["step"] for h in reference["eval_history"]] == [20, 40]
  assert reference["best_step"] == 40
  cut = tmp_path / "killed"
  with pytest.raises(_Killed):
    _toy_run(cut, kill_eval_at=40)  # checkpoint 40 saved, its evaluation not done
  assert [h["step"] for h in _history(cut)["history"]] == [20]
  with caplog.at_level(std_logging.WARNING):
    resumed = _toy_run(cut)
  assert resumed["init"] == "resumed" and resumed["start_step"] == 40
  assert "The evaluation of step 40 is missing from the history" in caplog.text
  assert resumed["eval_history"] == reference["eval_history"]
  assert resumed["best_step"] == 40 == _history(cut)["best_step"]
  assert resumed["eval"] == reference["eval"]
  assert sorted(os.listdir(cut / "best" / "checkpoints")) == ["40"]


def test_earlier_missing_evaluations_are_redone_from_their_checkpoints(tmp_path, caplog):
  reference = _toy_run(tmp_path / "uninterrupted")
  cut = tmp_path / "cut"
  with pytest.raises(_Killed):
    _toy_run(cut, kill_eval_at=40)
  saved = _history(cut)
  # The history lost step 20's evaluation too; its checkpoint (keep 3: 20, 30, 40) is there.
  (cut / "eval_history.json").write_text(json.dumps(dict(saved, history=[])))
  resumed = _toy_run(cut)
  assert resumed["eval_history"] == reference["eval_history"]
  assert resumed["best_step"] == reference["best_step"]
  # With the checkpoint gone, one warning names the evaluation that stays missing.
  cut2 = tmp_path / "cut2"
  with pytest.raises(_Killed):
    _toy_run(cut2, kill_eval_at=40, keep=1)
  (cut2 / "eval_history.json").write_text(json.dumps(dict(_history(cut2), history=[])))
  with caplog.at_level(std_logging.WARNING):
    resumed = _toy_run(cut2, keep=1)
  assert [h["step"] for h in resumed["eval_history"]] == [40]
  lines = [r.getMessage() for r in caplog.records if "stay missing" in r.getMessage()]
  assert lines == [
    f"The evaluations of steps 20 are missing from {cut2 / 'eval_history.json'} and their "
    "checkpoints are gone: they stay missing"
  ]


def test_the_best_is_recomputed_from_the_history_kept_on_resume(tmp_path):
  """A history written past the checkpoint resumed from (its later checkpoint lost): the best is
  the best of the entries up to the resumed step, not the saved one."""
  from bert_jax.train.eval_history import EvalHistory

  (tmp_path / "eval_history.json").write_text(
    json.dumps(
      {
        "history": [
          {"step": 10, "primary": 0.7},
          {"step": 20, "primary": 0.8},
          {"step": 30, "primary": 0.9},
        ],
        "best_value": 0.9,
        "best_step": 30,
      }
    )
  )
  history = EvalHistory(str(tmp_path), 20, True, None)
  assert history.steps == {10, 20}
  assert (history.best_step, history.best_value) == (20, 0.8)


@pytest.mark.parametrize("case", ["no data", "no dev.tsv", "text file as checkpoint"])
def test_a_run_that_fails_before_writing_leaves_no_directory(
  case, tmp_path, shared_data, minilm_dir
):
  data = tmp_path / "data"
  (data / "SST-2").mkdir(parents=True)
  (data / "SST-2" / "train.tsv").write_text(
    (shared_data / "glue" / "SST-2" / "train.tsv").read_text()[:20000]
  )
  c = _glue("sst2", data, minilm_dir)
  if case == "no data":
    c.data_dir = str(tmp_path / "wrong")
  elif case == "text file as checkpoint":
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    c.init_checkpoint = str(tmp_path / "notes.txt")
  # A new workdir (and its new parent) is removed; a user's existing directory and file stay.
  with pytest.raises((ValueError, FileNotFoundError, OSError)):
    runner.finetune(c, str(tmp_path / "runs" / "sst2"))
  assert not (tmp_path / "runs").exists()
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.md").write_text("mine")
  with pytest.raises((ValueError, FileNotFoundError, OSError)):
    runner.finetune(c, str(tmp_path / "mine"))
  assert os.listdir(tmp_path / "mine") == ["notes.md"]


def test_disk_full_during_a_runs_checkpoint_is_one_error_with_nothing_left(
  tmp_path, monkeypatch, caplog
):
  async def full_disk(self, x, directory):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", full_disk)
  workdir = tmp_path / "w"
  with caplog.at_level(std_logging.INFO), pytest.raises(CheckpointSaveError) as e:
    _toy_run(workdir)
  assert str(e.value) == (
    f"saving the checkpoint of step 10 to {workdir / 'checkpoints'} failed: ENOSPC: No space "
    "left on device (its temporary directory was removed)"
  )
  assert os.listdir(workdir / "checkpoints") == []
  assert not [r for r in caplog.records if r.exc_info and r.levelno >= std_logging.WARNING]
  # A tmp directory an earlier crash left is removed (and said) when the next run starts.
  monkeypatch.undo()
  stale = workdir / "checkpoints" / "10.orbax-checkpoint-tmp-99"
  (stale / "state").mkdir(parents=True)
  caplog.clear()
  with caplog.at_level(std_logging.INFO):
    assert _toy_run(workdir)["status"] == "completed"
  assert not stale.exists()
  assert f"Removing {stale}, left by an interrupted save of an earlier run" in caplog.text


def test_the_init_report_is_said_once(tmp_path, caplog, capsys):
  with caplog.at_level(std_logging.INFO):
    trainer.run(_toy_config(steps=4), str(tmp_path), lambda c, w, m: _toy_job(c))
  said = caplog.text + capsys.readouterr().out
  assert said.count("initialised from scratch") == 1, said
