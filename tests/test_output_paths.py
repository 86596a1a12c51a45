"""No output path overwrites, replaces or lies over an input: bert_jax.checkpoint.outputs and
the entry points that use it (each refuses before any work, one line naming both flags)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, subprocess_env_for

from bert_jax.checkpoint.outputs import (
  check_outputs,
  check_parent,
  check_workdir,
  config_inputs,
  input_paths,
)


@pytest.fixture
def tree(tmp_path):
  """data/{a.txt,b.txt}, ckpt/ (a folder) and a symlink link -> data."""
  (tmp_path / "data").mkdir()
  (tmp_path / "data" / "a.txt").write_text("a\n")
  (tmp_path / "data" / "b.txt").write_text("b\n")
  (tmp_path / "ckpt").mkdir()
  (tmp_path / "link").symlink_to(tmp_path / "data")
  return tmp_path


def test_an_output_equal_to_an_input_is_refused_through_symlinks_and_dots(tree):
  a = tree / "data" / "a.txt"
  for same in (a, tree / "link" / "a.txt", tree / "ckpt" / ".." / "data" / "a.txt"):
    with pytest.raises(ValueError) as e:
      check_outputs({"--output_file": str(same)}, {"--input_file": str(a)})
    assert str(e.value) == (
      f"--output_file={same} is the input --input_file={a}: writing it would destroy the "
      "input; choose another path"
    )
  check_outputs({"--output_file": str(tree / "data" / "out.txt")}, {"--input_file": str(a)})


def test_an_output_folder_containing_an_input_is_refused(tree):
  with pytest.raises(ValueError, match=r"^--output=\S+ contains the input --workdir=\S+/ckpt"):
    check_outputs({"--output": str(tree)}, {"--workdir": str(tree / "ckpt")})


def test_only_a_replaced_output_may_not_lie_inside_an_input_folder(tree):
  inside = str(tree / "ckpt" / "export")
  check_outputs({"--output_file": inside}, {"--checkpoint": str(tree / "ckpt")})  # a file beside
  with pytest.raises(ValueError, match=r"^--output=\S+/ckpt/export lies inside the input "):
    check_outputs({"--output": inside}, {"--workdir": str(tree / "ckpt")}, replaced=["--output"])


def test_two_outputs_that_are_the_same_file_are_refused(tree):
  out = tree / "out.jsonl"
  with pytest.raises(ValueError, match=r"^--output_file=\S+ and --summary_file=\S+ are the same"):
    check_outputs(
      {"--output_file": str(out), "--summary_file": str(tree / "link" / ".." / "out.jsonl")}, {}
    )


def test_a_tf_checkpoint_prefix_stands_for_its_files(tree):
  prefix = tree / "ckpt" / "bert_model.ckpt"
  for suffix in (".index", ".data-00000-of-00001"):
    (tree / "ckpt" / f"bert_model.ckpt{suffix}").write_text("")
  out = f"{prefix}.index"
  with pytest.raises(ValueError, match=rf"^--output_file={out} is the input --checkpoint={out}:"):
    check_outputs({"--output_file": out}, {"--checkpoint": str(prefix)})


def test_remote_and_empty_paths_are_not_compared(tree):
  check_outputs({"--workdir": "gs://b/run", "--other": ""}, {"--data": "gs://b/run", "--x": None})


def test_parent_folder_checks(tree):
  a = tree / "data" / "a.txt"
  with pytest.raises(ValueError, match=r"^--output_file=\S+/nope/out.txt: the folder \S+/nope "):
    check_parent("--output_file", tree / "nope" / "out.txt")
  with pytest.raises(ValueError, match=r"^--output_file=\S+/data is a folder: name a file"):
    check_parent("--output_file", tree / "data")
  with pytest.raises(ValueError, match=r"^--workdir=\S+/a.txt/run/x: \S+/a.txt is a file"):
    check_parent("--workdir", a / "run" / "x", create=True)
  with pytest.raises(ValueError, match=r"^--workdir=\S+/a.txt is a file, not a folder$"):
    check_parent("--workdir", a, create=True)
  check_parent("--workdir", tree / "new" / "run", create=True)
  check_parent("--output_file", tree / "data" / "new.txt")


def test_input_paths_expand_globs_and_lists(tree):
  paths = input_paths(f"{tree}/data/*.txt, {tree}/ckpt,gs://b/x")
  assert paths == [f"{tree}/data/a.txt", f"{tree}/data/b.txt", f"{tree}/ckpt"]


def test_config_inputs_read_the_configs_keys():
  from configs import glue, pretrain

  c = pretrain.get_config("tiny")
  c.init_checkpoint, c.phase2.input_files, c.vocab_file = "/w/ckpt", "/d/a,/d/b", "/v.txt"
  assert config_inputs(c) == {
    "config.init_checkpoint": ["/w/ckpt"],
    "config.vocab_file": ["/v.txt"],
    "config.phase2.input_files": ["/d/a", "/d/b"],
  }
  g = glue.get_config("rte")
  g.data_dir = "/glue"
  assert config_inputs(g) == {"config.data_dir": ["/glue"]}
  with pytest.raises(ValueError, match=r"^--workdir=/glue/run lies inside the input config\.data"):
    check_workdir("--workdir", "/glue/run", g)


def _cli(module, *args, timeout=240):
  proc = subprocess.run(
    [sys.executable, "-m", module, *args],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=subprocess_env_for(1),
    timeout=timeout,
  )
  errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
  return proc.returncode, proc.stderr, errors


def _listing(path):
  return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_build_vocab_refuses_an_output_holding_the_corpus(tree):
  before = _listing(tree)
  rc, err, errors = _cli(
    "bert_jax.build_vocab", f"--input={tree}/data/*.txt", f"--output={tree}/data", "--vocab_size=50"
  )
  assert rc == 1 and errors == [
    f"build_vocab: error: --output={tree}/data contains the input --input={tree}/data/a.txt: "
    "writing it could destroy the input; choose a folder outside it"
  ], err
  assert _listing(tree) == before


def test_create_pretraining_data_refuses_an_output_over_its_vocabulary(tree):
  (tree / "ckpt" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\n")
  before = _listing(tree)
  rc, err, errors = _cli(
    "bert_jax.create_pretraining_data",
    f"--input_file={tree}/data/a.txt",
    f"--output_dir={tree}/ckpt",
    f"--vocab_file={tree}/ckpt/vocab.txt",
  )
  assert rc == 1 and len(errors) == 1, err
  assert errors[0].startswith(
    f"create_pretraining_data: error: --output_dir={tree}/ckpt contains the input --vocab_file="
  ), err
  assert _listing(tree) == before


def test_pretrain_refuses_a_workdir_holding_its_data(tree):
  before = _listing(tree)
  rc, err, errors = _cli(
    "bert_jax.pretrain",
    "--config=configs/pretrain.py:tiny",
    f"--workdir={tree}/data",
    f"--config.input_files={tree}/data/*.txt",
  )
  assert rc == 1 and errors == [
    f"pretrain: error: --workdir={tree}/data contains the input "
    f"config.input_files={tree}/data/a.txt: writing it could destroy the input; choose a folder "
    "outside it"
  ], err
  assert _listing(tree) == before


def test_finetune_refuses_a_workdir_inside_its_init_checkpoint(tree):
  before = _listing(tree)
  rc, err, errors = _cli(
    "bert_jax.finetune",
    "--config=configs/glue.py:rte",
    f"--workdir={tree}/ckpt/rte",
    f"--config.init_checkpoint={tree}/ckpt",
    f"--config.data_dir={tree}/data",
  )
  assert rc == 1 and errors == [
    f"finetune: error: --workdir={tree}/ckpt/rte lies inside the input "
    f"config.init_checkpoint={tree}/ckpt: writing it would change the input; choose a folder "
    "outside it"
  ], err
  assert _listing(tree) == before


def test_evaluate_refuses_the_workdir_as_its_output_dir(tree):
  workdir = tree / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({"task": "rte", "data_dir": str(tree / "data")}))
  (workdir / "metrics.json").write_text('{"accuracy": 0.7}')
  before = _listing(tree)
  for out, expected in [
    (workdir, f"--output_dir={workdir} is the input --workdir={workdir}"),
    (tree, f"--output_dir={tree} contains the input --workdir={workdir}"),
  ]:
    rc, err, errors = _cli("bert_jax.evaluate", f"--workdir={workdir}", f"--output_dir={out}")
    assert rc == 1 and len(errors) == 1 and errors[0].startswith(f"evaluate: error: {expected}:")
  assert _listing(tree) == before


def test_no_output_may_lie_inside_a_sealed_checkpoint(tree):
  ckpt = tree / "ckpt"
  (ckpt / "vocab.txt").write_text("[PAD]\n")
  (tree / "ckpt_link").symlink_to(ckpt)
  for out in (ckpt / "vocab.txt", ckpt / "new" / "x.jsonl", tree / "ckpt_link" / "x.jsonl"):
    with pytest.raises(ValueError, match=r"^--output_file=\S+ lies inside the checkpoint "):
      check_outputs(
        {"--output_file": str(out)}, {"--checkpoint": str(ckpt)}, sealed=["--checkpoint"]
      )
  for out in (ckpt, tree / "ckpt_link"):  # the checkpoint itself, or a symlink to it
    with pytest.raises(ValueError, match=r"^--output_file=\S+ is the input --checkpoint="):
      check_outputs(
        {"--output_file": str(out)}, {"--checkpoint": str(ckpt)}, sealed=["--checkpoint"]
      )
  check_outputs(
    {"--output_file": str(tree / "x.jsonl")}, {"--checkpoint": str(ckpt)}, sealed=["--checkpoint"]
  )


def test_a_sealed_tf_prefix_or_saved_step_seals_its_folder_and_workdir(tree):
  (tree / "ckpt" / "bert_model.ckpt.index").write_text("")
  prefix = str(tree / "ckpt" / "bert_model.ckpt")
  with pytest.raises(
    ValueError, match=r"lies inside the checkpoint --checkpoint=\S+ \(its folder "
  ):
    check_outputs(
      {"--output_file": str(tree / "ckpt" / "o.txt")},
      {"--checkpoint": prefix},
      sealed=["--checkpoint"],
    )
  step = tree / "run" / "checkpoints" / "20"
  step.mkdir(parents=True)
  with pytest.raises(
    ValueError, match=r"lies inside the checkpoint --checkpoint=\S+/20 \(its folder \S+/run\)"
  ):
    check_outputs(
      {"--output_file": str(tree / "run" / "vocab.txt")},
      {"--checkpoint": str(step)},
      sealed=["--checkpoint"],
    )


def test_a_workdir_inside_a_tf_init_checkpoints_folder_is_refused(tree):
  (tree / "ckpt" / "bert_model.ckpt.index").write_text("")
  config = {"init_checkpoint": str(tree / "ckpt" / "bert_model.ckpt")}
  with pytest.raises(ValueError, match=r"^--workdir=\S+/ckpt/run lies inside the checkpoint "):
    check_workdir("--workdir", str(tree / "ckpt" / "run"), config)


@pytest.mark.parametrize("module", ["bert_jax.predict_next", "bert_jax.extract_features"])
def test_inference_refuses_an_output_inside_its_checkpoint(tree, module):
  (tree / "ckpt" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
  before = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
  rc, err, errors = _cli(
    module,
    f"--input_file={tree}/data/a.txt",
    f"--output_file={tree}/ckpt/vocab.txt",
    f"--checkpoint={tree}/ckpt",
  )
  prog = module.split(".")[1]
  assert rc == 1 and errors == [
    f"{prog}: error: --output_file={tree}/ckpt/vocab.txt lies inside the checkpoint "
    f"--checkpoint={tree}/ckpt: writing it would change the checkpoint; choose a path outside it"
  ], err
  assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == before


def test_probe_refuses_a_workdir_inside_its_init_checkpoint(tree):
  before = _listing(tree)
  rc, err, errors = _cli(
    "bert_jax.probe",
    "--config=configs/probe.py:cola_source",
    f"--workdir={tree}/ckpt/probe",
    f"--config.init_checkpoint={tree}/ckpt",
    f"--config.data_dir={tree}/data",
  )
  assert rc == 1 and len(errors) == 1, err
  assert errors[0].startswith(
    f"probe: error: --workdir={tree}/ckpt/probe lies inside the input "
  ), err
  assert _listing(tree) == before
