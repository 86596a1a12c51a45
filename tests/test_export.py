"""Export round trips: a bert_jax workdir -> transformers (PyTorch), SavedModel, Orbax params.

Each head's exported model is run on the same batch (with padding) as bert_jax and the outputs
compared to 1e-5. The references are independent implementations: Hugging Face's PyTorch BERT
classes and TensorFlow executing the jax2tf-converted graph.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax.linen import meta
from float_tolerance import assert_model_close

from bert_jax import model as models
from bert_jax.checkpoint import CheckpointManager
from bert_jax.formats import CheckpointError, export
from bert_jax.model import BertConfig
from bert_jax.tokenize import load_tokenizer

HEADS = (
  "pretraining",
  "sequence_classification",
  "token_classification",
  "question_answering",
  "multiple_choice",
)
HF_CLASS = {
  "pretraining": "BertForPreTraining",
  "sequence_classification": "BertForSequenceClassification",
  "token_classification": "BertForTokenClassification",
  "question_answering": "BertForQuestionAnswering",
  "multiple_choice": "BertForMultipleChoice",
}
LABELS = {
  "sequence_classification": ["entailment", "neutral", "contradiction"],
  "token_classification": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
}
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "bert", "jax", "##s", "run", "."]
CONFIG = BertConfig(
  vocab_size=64,
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=4,
  intermediate_size=48,
  max_position_embeddings=40,
)


def make_module(task):
  n = len(LABELS.get(task, ()))
  return {
    "pretraining": lambda: models.BertForPreTraining(CONFIG),
    "sequence_classification": lambda: models.BertForSequenceClassification(CONFIG, n),
    "token_classification": lambda: models.BertForTokenClassification(CONFIG, n),
    "question_answering": lambda: models.BertForQuestionAnswering(CONFIG),
    "multiple_choice": lambda: models.BertForMultipleChoice(CONFIG),
  }[task]()


def batch(task, b=3, length=11, seed=0):
  rng = np.random.RandomState(seed)
  shape = (b, 4, length) if task == "multiple_choice" else (b, length)
  ids = rng.randint(5, CONFIG.vocab_size, shape).astype(np.int32)
  mask = np.ones(shape, np.int32)
  mask[..., 0, length - 4 :] = 0  # padding in the batch
  segments = np.zeros(shape, np.int32)
  segments[..., length // 2 :] = 1
  return ids, mask, segments


def make_workdir(root, task, seed):
  """A bert_jax workdir as training leaves it: Orbax checkpoint, model_config, head, vocab."""
  workdir = root / task
  module = make_module(task)
  ids, _, _ = batch(task, 1, 4)
  params = meta.unbox(module.init(jax.random.PRNGKey(seed), ids)["params"])
  # Non-zero biases everywhere, so a bias lost in export shows up in the outputs.
  params = jax.tree_util.tree_map(
    lambda x: (
      np.asarray(x) + 0.02 * np.random.RandomState(seed).standard_normal(x.shape).astype(np.float32)
    ),
    params,
  )
  manager = CheckpointManager(str(workdir), async_save=False)
  manager.save(7, {"params": params, "step": np.int32(7)})
  manager.wait()
  manager.close()
  (workdir / "model_config.json").write_text(json.dumps(CONFIG.to_dict()))
  labels = LABELS.get(task, [])
  (workdir / "head.json").write_text(
    json.dumps(
      {
        "task": task,
        "num_labels": len(labels) or (1 if task == "multiple_choice" else 2),
        "labels": labels,
      }
    )
  )
  vocab = root / "vocab.txt"
  if not vocab.exists():
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab.write_text(
      "\n".join(
        specials + WORDS + [f"w{i}" for i in range(CONFIG.vocab_size - len(specials) - len(WORDS))]
      )
      + "\n"
    )
  load_tokenizer(str(vocab), do_lower_case=True).save(str(workdir))
  return workdir, params


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("export_workdirs")
  return {task: make_workdir(root, task, i) for i, task in enumerate(HEADS)}


def jax_outputs(task, params, ids, mask, segments):
  return make_module(task).apply({"params": params}, ids, mask, segments, deterministic=True)


@pytest.mark.parametrize("task", HEADS)
def test_hf_export_matches_bert_jax(task, workdirs, tmp_path):
  import torch
  import transformers

  workdir, params = workdirs[task]
  out = export(str(workdir), "hf", str(tmp_path / "hf"))
  hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert hf_config["architectures"] == [HF_CLASS[task]]
  if task in LABELS:
    assert [hf_config["id2label"][str(i)] for i in range(len(LABELS[task]))] == LABELS[task]
  model = getattr(transformers, HF_CLASS[task]).from_pretrained(out).eval().float()
  ids, mask, segments = batch(task)
  ours = jax_outputs(task, params, ids, mask, segments)
  with torch.no_grad():
    theirs = model(
      input_ids=torch.tensor(ids, dtype=torch.long),
      attention_mask=torch.tensor(mask, dtype=torch.long),
      token_type_ids=torch.tensor(segments, dtype=torch.long),
    )
  pairs = {
    "pretraining": [("mlm_logits", "prediction_logits"), ("nsp_logits", "seq_relationship_logits")],
    "question_answering": [("start_logits", "start_logits"), ("end_logits", "end_logits")],
  }.get(task, [("logits", "logits")])
  for ours_key, theirs_key in pairs:
    # PyTorch's float32 in another order (float_tolerance, rule 2).
    theirs_np = theirs[theirs_key].numpy()
    length = ids.shape[-1]
    assert_model_close(ours[ours_key], theirs_np, CONFIG, length, err_msg=f"{task}: {ours_key}")
  # The tokenizer travels with the model: transformers' BertTokenizer reads the same vocab.
  tok = transformers.BertTokenizer.from_pretrained(out)
  assert tok.convert_tokens_to_ids(["cat", "##s"]) == load_tokenizer(out).convert_tokens_to_ids(
    ["cat", "##s"]
  )


@pytest.mark.parametrize("task", HEADS)
def test_saved_model_matches_bert_jax(task, workdirs, tmp_path):
  import tensorflow as tf

  workdir, params = workdirs[task]
  out = export(str(workdir), "saved_model", str(tmp_path / "sm"))
  serve = tf.saved_model.load(out).signatures["serving_default"]
  # One SavedModel, two batch sizes and two lengths: batch and length are polymorphic.
  for b, length in ((3, 11), (1, 17)):
    ids, mask, segments = batch(task, b, length, seed=b)
    ours = jax_outputs(task, params, ids, mask, segments)
    theirs = serve(
      input_ids=tf.constant(ids), input_mask=tf.constant(mask), segment_ids=tf.constant(segments)
    )
    keys = {
      "pretraining": ["mlm_logits", "nsp_logits"],
      "question_answering": ["start_logits", "end_logits"],
    }.get(task, ["logits"])
    for key in keys + ["sequence_output", "pooled_output"]:
      # TensorFlow's float32 in another order (float_tolerance, rule 2).
      msg = f"{task}: {key} at {b}x{length}"
      assert_model_close(theirs[key].numpy(), ours[key], CONFIG, length, err_msg=msg)
  if task == "pretraining":  # the second signature: MLM logits at given positions only
    ids, mask, segments = batch(task, 2, 13, seed=5)
    positions = np.array([[1, 4, 7], [0, 2, 12]], np.int32)
    ours = models.BertForPreTraining(CONFIG).apply(
      {"params": params}, ids, mask, segments, masked_lm_positions=positions
    )
    theirs = tf.saved_model.load(out).signatures["masked_lm"](
      input_ids=tf.constant(ids),
      input_mask=tf.constant(mask),
      segment_ids=tf.constant(segments),
      masked_lm_positions=tf.constant(positions),
    )
    assert theirs["mlm_logits"].shape == (2, 3, CONFIG.vocab_size)
    for key in ("mlm_logits", "nsp_logits"):
      msg = f"masked_lm: {key}"
      assert_model_close(theirs[key].numpy(), ours[key], CONFIG, 13, err_msg=msg)
  extra = os.path.join(out, "assets.extra")
  assert json.load(open(os.path.join(extra, "head.json")))["task"] == task
  assert os.path.exists(os.path.join(extra, "vocab.txt"))


def test_params_only_export_restores_the_same_weights(workdirs, tmp_path):
  import orbax.checkpoint as ocp

  from bert_jax.formats.params_only import restore_params_only

  workdir, params = workdirs["sequence_classification"]
  out = export(str(workdir), "params", str(tmp_path / "params"))
  restored, config, head, tokenizer = restore_params_only(out)
  assert config == CONFIG and head["labels"] == LABELS["sequence_classification"]
  assert tokenizer.vocab_size == CONFIG.vocab_size
  flat = lambda t: {
    jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(t)[0]
  }
  want, got = flat(params), flat(restored)
  assert want.keys() == got.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], np.asarray(want[k]), err_msg=k)
  # bert_jax reads it as a checkpoint to start fine-tuning from (init_checkpoint=out).
  from bert_jax.formats import load_pretrained

  again = load_pretrained(out)
  assert again.task == "sequence_classification" and again.num_labels == 3
  np.testing.assert_array_equal(
    again.params["bert"]["pooler"]["kernel"], params["bert"]["pooler"]["kernel"]
  )
  # Plain Orbax, no bert_jax, restores it too.
  plain = ocp.StandardCheckpointer().restore(os.path.join(out, "params"))
  np.testing.assert_array_equal(plain["classifier"]["kernel"], params["classifier"]["kernel"])


def test_encoder_export_from_a_fine_tuned_checkpoint(workdirs, tmp_path):
  import torch
  import transformers

  workdir, params = workdirs["question_answering"]
  out = export(str(workdir), "hf", str(tmp_path / "enc"), task="encoder")
  model = transformers.BertModel.from_pretrained(out).eval()
  ids, mask, segments = batch("question_answering")
  ours = models.BertEncoder(CONFIG).apply({"params": params["bert"]}, ids, mask, segments)
  with torch.no_grad():
    theirs = model(
      input_ids=torch.tensor(ids, dtype=torch.long),
      attention_mask=torch.tensor(mask, dtype=torch.long),
      token_type_ids=torch.tensor(segments, dtype=torch.long),
    )
  # PyTorch's float32 in another order (float_tolerance, rule 2).
  length = ids.shape[-1]
  assert_model_close(theirs.last_hidden_state.numpy(), ours["sequence_output"], CONFIG, length)


@pytest.mark.parametrize(
  "have,want",
  [
    ("sequence_classification", "question_answering"),
    ("pretraining", "BertForTokenClassification"),
    ("question_answering", "pretraining"),
  ],
)
def test_head_that_does_not_fit_is_an_error_before_writing(have, want, workdirs, tmp_path):
  workdir, _ = workdirs[have]
  out = tmp_path / "out"
  for fmt in ("hf", "saved_model", "params"):
    with pytest.raises(CheckpointError, match=have):
      export(str(workdir), fmt, str(out), task=want)
    assert not out.exists()


def test_head_json_that_disagrees_with_the_weights(workdirs, tmp_path):
  workdir, _ = workdirs["sequence_classification"]
  bad = tmp_path / "bad"
  subprocess.run(["cp", "-r", str(workdir), str(bad)], check=True)
  (bad / "head.json").write_text(
    json.dumps({"task": "sequence_classification", "num_labels": 5, "labels": []})
  )
  with pytest.raises(CheckpointError, match=r"num_labels 5 .* classifier .* has 3 outputs"):
    export(str(bad), "hf", str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()


def test_entry_point_reports_a_clear_error(workdirs, tmp_path):
  workdir, _ = workdirs["sequence_classification"]
  out = tmp_path / "out"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.export",
      f"--workdir={workdir}",
      "--format=hf",
      f"--output={out}",
      "--task=question_answering",
    ],
    capture_output=True,
    text=True,
    cwd=os.path.dirname(os.path.dirname(__file__)),
  )
  assert proc.returncode == 1, proc.stderr  # bert_jax.cli: 1 for a user error, 2 for usage
  assert "export: error:" in proc.stderr and "Traceback" not in proc.stderr
  assert not out.exists()


def _tree(directory):
  """Sorted (relative path, is a directory, st_mode & 0o777) of everything under ``directory``;
  Orbax's content-addressed data files (new names, and a varying number, in every export) all
  read ``d/<data>`` (one entry per mode)."""
  out = []
  for root, dirs, files in os.walk(directory):
    for name in dirs + files:
      path = os.path.join(root, name)
      rel = os.path.relpath(path, directory)
      mode = os.stat(path).st_mode & 0o777
      out.append((re.sub(r"/d/[0-9a-f]{32}$", "/d/<data>", rel), os.path.isdir(path), mode))
  return sorted(set(out))


@pytest.mark.parametrize(
  "fmt", ["hf", pytest.param("saved_model", marks=pytest.mark.slow), "params"]
)
def test_overwrite_replaces_the_output_whole_with_the_umask_modes(fmt, workdirs, tmp_path):
  workdir, _ = workdirs["sequence_classification"]
  out = tmp_path / "out"
  export(str(workdir), fmt, str(out))
  first = _tree(out)
  # Modes as the umask gives them to any file the user creates (as open() and mkdir() do).
  umask = os.umask(0)
  os.umask(umask)
  for path, is_dir, mode in first:
    want = 0o777 & ~umask if is_dir else 0o666 & ~umask
    assert mode == want, f"{path}: {oct(mode)}, the umask gives {oct(want)}"
  # Files of an earlier export, or anything else, in the output folder.
  (out / "stale.txt").write_text("from an earlier export")
  (out / "old").mkdir()
  (out / "old" / "weights.bin").write_bytes(b"stale")
  with pytest.raises(FileExistsError, match="--overwrite"):
    export(str(workdir), fmt, str(out))
  assert (out / "stale.txt").exists()
  export(str(workdir), fmt, str(out), overwrite=True)
  assert _tree(out) == first  # exactly what one export writes: nothing stale survives
  assert os.listdir(tmp_path) == ["out"]  # no staging directory left beside it


def _copy_workdir(workdirs, task, dest):
  import shutil

  shutil.copytree(workdirs[task][0], dest)
  return dest


def test_overwrite_never_deletes_the_workdir_being_exported(workdirs, tmp_path):
  workdir = _copy_workdir(workdirs, "pretraining", tmp_path / "runs" / "w")
  before = _tree(workdir)
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.export",
      f"--workdir={workdir}",
      "--format=params",
      f"--output={workdir}",
      "--overwrite",
    ],
    capture_output=True,
    text=True,
    cwd=os.path.dirname(os.path.dirname(__file__)),
  )
  assert proc.returncode == 1, proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == (
    f"export: error: --output={workdir} is the input --workdir={workdir}: writing it would "
    "destroy the input; choose another folder"
  )
  assert "wrote" not in proc.stdout
  # An output inside the workdir, or one that holds it, is refused the same way.
  for out, word in [(workdir / "export", "lies inside"), (tmp_path / "runs", "contains")]:
    with pytest.raises(ValueError, match=f"^--output={out} {word} the input --workdir="):
      export(str(workdir), "params", str(out), overwrite=True)
  assert _tree(workdir) == before
  assert os.listdir(tmp_path / "runs") == ["w"]


def _dead_pid():
  proc = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
  )
  return int(proc.stdout)


def test_staging_folders_of_dead_exports_are_removed_with_a_log_line(
  workdirs, tmp_path, monkeypatch
):
  from bert_jax.formats import exporter

  workdir, _ = workdirs["sequence_classification"]
  out = tmp_path / "out"
  export(str(workdir), "params", str(out))
  dead, alive = _dead_pid(), os.getppid()
  stale = [tmp_path / f".out.new-{dead}-0123abcd", tmp_path / f".out.old-{dead}-89abcdef"]
  for d in stale + [tmp_path / f".out.new-{alive}-feedbeef"]:
    (d / "params").mkdir(parents=True)
    (d / "params" / "weights").write_bytes(b"\0" * 1024)
  logged = []
  monkeypatch.setattr(exporter.logging, "info", lambda msg, *args: logged.append((msg, args)))
  export(str(workdir), "params", str(out), overwrite=True)
  assert sorted(os.listdir(tmp_path)) == [f".out.new-{alive}-feedbeef", "out"]  # a live export's
  lines = [m % a for m, a in logged if isinstance(m, str) and m.startswith("export: ")]
  assert lines == [
    f"export: removed 2 staging folder(s) left by an interrupted export of {out}: "
    f".out.new-{dead}-0123abcd, .out.old-{dead}-89abcdef"
  ]


_STALL = """
import sys, time
from bert_jax.formats import params_only

def stall(*args, **kwargs):
  print("writing", flush=True)
  time.sleep(120)

params_only.write_model_files = stall
from bert_jax import export
sys.argv = ["export"] + sys.argv[1:]
export.run()
"""


@pytest.mark.parametrize("signum", ["SIGTERM", pytest.param("SIGINT", marks=pytest.mark.slow)])
def test_an_interrupted_overwrite_keeps_the_old_export_and_no_staging(signum, workdirs, tmp_path):
  import signal

  workdir, _ = workdirs["sequence_classification"]
  out = tmp_path / "out"
  export(str(workdir), "params", str(out))
  before = _tree(out)
  proc = subprocess.Popen(
    [sys.executable, "-c", _STALL, f"--workdir={workdir}", "--format=params", f"--output={out}"]
    + ["--overwrite"],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    cwd=os.path.dirname(os.path.dirname(__file__)),
  )
  try:
    assert proc.stdout.readline().strip() == "writing", proc.stderr.read()
    assert any(".out.new-" in n for n in os.listdir(tmp_path))  # the new export, half written
    proc.send_signal(getattr(signal, signum))
    proc.wait(timeout=60)
  finally:
    proc.kill()
  assert proc.returncode != 0
  assert os.listdir(tmp_path) == ["out"]
  assert _tree(out) == before


def test_transformers_pipeline_reads_an_export_as_docs_export_md_says(workdirs, tmp_path):
  """docs/export.md: with TensorFlow and Keras 3 installed, transformers needs USE_TF=0 and
  framework="pt" to read an export; its snippet, run as written, works."""
  workdir, _ = workdirs["pretraining"]
  out = tmp_path / "hf"
  export(str(workdir), "hf", str(out))
  doc = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "export.md").read_text()
  (snippet,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "fill-mask" in b]
  snippet = snippet.replace('"export/tiny_hf"', repr(str(out)))
  env = {k: v for k, v in os.environ.items() if k not in ("USE_TF", "USE_TORCH")}
  proc = subprocess.run(
    [sys.executable, "-c", snippet + "print(len(fill('the [MASK] sat .')))\n"],
    capture_output=True,
    text=True,
    env=env,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "'token_str'" in proc.stdout and proc.stdout.strip().splitlines()[-1] == "5"
