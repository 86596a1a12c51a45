"""Exporting the paper's Table 5 ablations to Hugging Face: a pre-training workdir without NSP
(``config.objective=mlm``) becomes a ``BertForMaskedLM`` directory, a left-to-right one
(``objective=ltr``) a ``BertLMHeadModel`` with ``is_decoder`` in config.json.

The reference is independent: Hugging Face's PyTorch classes load the exported directory and
their logits (at every position, padding in the batch) are compared with bert_jax's forward to
1e-4; for the left-to-right model, PyTorch's outputs up to position i do not move when later
tokens change (and its next-token loss is the one pre-training minimises), while the masked LM's
do (bidirectional). Workdirs are made two ways: perturbed weights saved as pre-training saves
them (every bias non-zero, so a tensor lost in the export shows), and short real pre-training
runs exported with ``python -m bert_jax.export``.
"""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
import transformers
from conftest import REPO, subprocess_env_for
from flax.linen import meta
from float_tolerance import assert_model_close, assert_sum_close, encoder_terms
from test_export import CONFIG, WORDS, batch

from bert_jax import model as models
from bert_jax.checkpoint import CheckpointManager
from bert_jax.formats import CheckpointError, export, load_pretrained
from bert_jax.tokenize import load_tokenizer

HF_CLASS = {"mlm": "BertForMaskedLM", "ltr": "BertLMHeadModel"}
ATOL = 1e-4


def _vocab(root):
  vocab = root / "vocab.txt"
  if not vocab.exists():
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    rest = [f"w{i}" for i in range(CONFIG.vocab_size - len(specials) - len(WORDS))]
    vocab.write_text("\n".join(specials + WORDS + rest) + "\n")
  return vocab


def make_workdir(root, objective, seed):
  """A pre-training workdir of ``objective`` as run_pretraining leaves it: an Orbax checkpoint
  of BertForPreTraining(next_sentence=False), model_config.json (is_decoder for ltr), head.json
  and the vocabulary."""
  config = CONFIG.replace(is_decoder=objective == "ltr")
  module = models.BertForPreTraining(config, next_sentence=False)
  ids, _, _ = batch("pretraining", 1, 4)
  params = meta.unbox(module.init(jax.random.PRNGKey(seed), ids)["params"])
  rng = np.random.RandomState(seed)
  params = jax.tree_util.tree_map(
    lambda x: np.asarray(x) + 0.05 * rng.standard_normal(x.shape).astype(np.float32), params
  )
  assert "nsp" not in params and "pooler" in params["bert"]
  workdir = root / objective
  manager = CheckpointManager(str(workdir), async_save=False)
  manager.save(3, {"params": params, "step": np.int32(3)})
  manager.wait()
  manager.close()
  (workdir / "model_config.json").write_text(json.dumps(config.to_dict()))
  (workdir / "head.json").write_text(json.dumps({"task": "pretraining", "objective": objective}))
  load_tokenizer(str(_vocab(root)), do_lower_case=True).save(str(workdir))
  return workdir, params, module


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("ablation_workdirs")
  return {o: make_workdir(root, o, seed) for seed, o in enumerate(("mlm", "ltr"))}


def torch_logits(model, ids, mask, segments, labels=None):
  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(ids, dtype=torch.long),
      attention_mask=torch.tensor(mask, dtype=torch.long),
      token_type_ids=torch.tensor(segments, dtype=torch.long),
      labels=None if labels is None else torch.tensor(labels, dtype=torch.long),
    )
  return out.logits.numpy(), out.loss


def our_logits(module, params, ids, mask, segments):
  out = module.apply({"params": params}, ids, mask, segments, deterministic=True)
  return np.asarray(out["mlm_logits"])


def load_hf(objective, directory):
  """The exported directory in ``transformers``' class for it; nothing missing or unexpected."""
  hf_config = json.loads((directory / "config.json").read_text())
  assert hf_config["architectures"] == [HF_CLASS[objective]]
  assert hf_config.get("is_decoder", False) is (objective == "ltr")
  model, info = getattr(transformers, HF_CLASS[objective]).from_pretrained(
    directory, output_loading_info=True
  )
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert model.config.is_decoder is (objective == "ltr")
  return model.eval().float()


@pytest.mark.parametrize("objective", ["mlm", "ltr"])
def test_hf_export_of_a_no_nsp_workdir_matches_bert_jax(objective, workdirs, tmp_path):
  workdir, params, module = workdirs[objective]
  out = tmp_path / "hf"
  export(str(workdir), "hf", str(out))
  model = load_hf(objective, out)
  # No NSP classifier and no pooler (neither class has one): the LM head and the encoder.
  with open(out / "model.safetensors", "rb") as f:
    header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
  names = set(header) - {"__metadata__"}
  assert not any(n.startswith(("cls.seq_relationship", "bert.pooler")) for n in names), names
  assert "cls.predictions.bias" in names
  for b, length, seed in ((3, 11, 0), (2, 17, 4)):
    ids, mask, segments = batch("pretraining", b, length, seed)
    theirs, _ = torch_logits(model, ids, mask, segments)
    np.testing.assert_allclose(
      our_logits(module, params, ids, mask, segments), theirs, atol=ATOL, rtol=ATOL
    )
  # The tokenizer travels with the model.
  tok = transformers.BertTokenizer.from_pretrained(out)
  assert tok.convert_tokens_to_ids(["cat", "##s"]) == load_tokenizer(out).convert_tokens_to_ids(
    ["cat", "##s"]
  )


@pytest.mark.parametrize("objective", ["mlm", "ltr"])
def test_later_tokens_move_earlier_outputs_only_in_the_masked_lm(objective, workdirs, tmp_path):
  """PyTorch's model of the export: causal for ltr (outputs <= i fixed when tokens > i change),
  bidirectional for mlm; bert_jax agrees with it on both inputs."""
  workdir, params, module = workdirs[objective]
  export(str(workdir), "hf", str(tmp_path / "hf"))
  model = load_hf(objective, tmp_path / "hf")
  ids, mask, segments = batch("pretraining", 2, 13, seed=9)
  mask[:] = 1
  i = 6
  changed = ids.copy()
  changed[:, i + 1 :] = (ids[:, i + 1 :] + 7 - 5) % (CONFIG.vocab_size - 5) + 5
  assert (changed[:, i + 1 :] != ids[:, i + 1 :]).all()
  before, _ = torch_logits(model, ids, mask, segments)
  after, _ = torch_logits(model, changed, mask, segments)
  for x, y in ((ids, before), (changed, after)):
    np.testing.assert_allclose(our_logits(module, params, x, mask, segments), y, atol=ATOL)
  assert not np.allclose(before[:, i + 1 :], after[:, i + 1 :], atol=1e-3)
  if objective == "ltr":
    # The same rows in float32 (float_tolerance, rule 2): a later token leaking in moves them
    # by far more.
    assert_model_close(before[:, : i + 1], after[:, : i + 1], CONFIG, ids.shape[1])
  else:
    assert not np.allclose(before[:, : i + 1], after[:, : i + 1], atol=1e-3)


def test_ltr_export_next_token_loss_is_the_pretraining_loss(workdirs, tmp_path):
  """BertLMHeadModel's loss (labels = the input, shifted inside: row i predicts token i + 1,
  padding ignored) equals bert_jax's ltr pre-training loss on the same batch."""
  from bert_jax.tasks.pretraining.loss import make_pretraining_loss

  workdir, params, module = workdirs["ltr"]
  export(str(workdir), "hf", str(tmp_path / "hf"))
  model = load_hf("ltr", tmp_path / "hf")
  ids, mask, segments = batch("pretraining", 3, 11, seed=2)  # row 0 ends in padding
  labels = np.where(mask == 1, ids, -100)
  _, loss = torch_logits(model, ids, mask, segments, labels)
  ours, _ = make_pretraining_loss(module, "ltr")(
    params, {"input_ids": ids, "input_mask": mask, "segment_ids": segments}, None, True
  )
  # PyTorch's float32 in another order (float_tolerance, rule 2): the encoder, the head (D, then
  # the vocabulary's softmax) and the mean over the tokens.
  n = encoder_terms(CONFIG, ids.shape[1]) + CONFIG.hidden_size + CONFIG.vocab_size + ids.size
  assert_sum_close(float(ours), float(loss), abs(float(loss)), n)


@pytest.mark.parametrize("objective", ["mlm", "ltr"])
def test_the_export_imports_back_and_exports_the_same_bytes(objective, workdirs, tmp_path):
  workdir, params, _ = workdirs[objective]
  first = tmp_path / "first"
  export(str(workdir), "hf", str(first))
  again = load_pretrained(first)
  assert again.task == "pretraining" and set(again.absent) == {"nsp", "bert/pooler"}
  assert again.config.is_decoder is (objective == "ltr")
  flat = lambda p: {k: np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(p)}
  want = {k: v for k, v in flat(params).items() if "pooler" not in jax.tree_util.keystr(k)}
  got = {k: v for k, v in flat(again.params).items() if "pooler" not in jax.tree_util.keystr(k)}
  assert want.keys() == got.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=jax.tree_util.keystr(k))
  second = tmp_path / "second"
  export(str(first), "hf", str(second))
  for name in ("model.safetensors", "config.json"):
    assert (second / name).read_bytes() == (first / name).read_bytes(), name


@pytest.mark.parametrize("objective", ["mlm", "ltr"])
def test_params_export_keeps_the_model_and_saved_model_names_the_format(
  objective, workdirs, tmp_path
):
  workdir, params, _ = workdirs[objective]
  export(str(workdir), "params", str(tmp_path / "p"))
  back = load_pretrained(tmp_path / "p")
  assert back.task == "pretraining" and back.absent == ("nsp",)
  assert back.config.is_decoder is (objective == "ltr")
  jax.tree_util.tree_map(np.testing.assert_array_equal, back.params, params)
  # A SavedModel of a pre-training head serves nsp_logits: refused before anything is written.
  with pytest.raises(CheckpointError, match=r"no nsp head.*--format=saved_model.*--format=hf"):
    export(str(workdir), "saved_model", str(tmp_path / "sm"))
  assert not (tmp_path / "sm").exists()


# -- real pre-training runs, exported by the entry point ---------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Two-step pre-training runs of objective mlm and ltr (random batches, a one-layer model)."""
  from bert_jax.runs.pretraining.runner import run_pretraining
  from configs import pretrain

  root = tmp_path_factory.mktemp("ablation_runs")
  (root / "bert_config.json").write_text(
    json.dumps(
      dict(
        vocab_size=CONFIG.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
      )
    )
  )
  out = {}
  for objective in ("mlm", "ltr"):
    c = pretrain.get_config("tiny")
    c.objective = objective
    c.synthetic_data = True
    c.vocab_file = str(_vocab(root))
    c.bert_config_file = str(root / "bert_config.json")
    c.max_seq_length, c.max_predictions_per_seq = 32, 5
    c.train_batch_size = c.eval_batch_size = 8
    c.num_train_steps, c.num_warmup_steps, c.save_checkpoints_steps = 2, 1, 2
    c.phase2.fraction = 0.0
    c.eval_every_steps, c.max_eval_steps = 0, 1
    c.checkpoint.async_save = False
    summary = run_pretraining(c, str(root / objective))
    assert summary["status"] == "completed"
    out[objective] = root / objective
  return out


def _export_cli(workdir, output, *flags):
  return subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.export",
      f"--workdir={workdir}",
      f"--output={output}",
      *flags,
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=subprocess_env_for(1),
    timeout=300,
  )


@pytest.mark.slow  # two real pre-training runs (~85 s); the in-process exports above stay in CI
@pytest.mark.parametrize("objective", ["mlm", "ltr"])
def test_entry_point_exports_a_pretraining_run(objective, runs, tmp_path):
  workdir = runs[objective]
  assert json.loads((workdir / "head.json").read_text())["objective"] == objective
  out = tmp_path / "hf"
  proc = _export_cli(workdir, out, "--format=hf")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"export: wrote hf to {out}" in proc.stdout
  model = load_hf(objective, out)
  pre = load_pretrained(workdir)
  module = models.BertForPreTraining(pre.config, next_sentence=False)
  ids, mask, segments = batch("pretraining", 3, 11, seed=1)
  theirs, _ = torch_logits(model, ids, mask, segments)
  np.testing.assert_allclose(
    our_logits(module, pre.params, ids, mask, segments), theirs, atol=ATOL, rtol=ATOL
  )
  if objective == "ltr":  # what a causal-LM user reaches for
    auto = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert type(auto).__name__ == "BertLMHeadModel" and auto.config.is_decoder
  else:
    auto = transformers.AutoModelForMaskedLM.from_pretrained(out)
    assert type(auto).__name__ == "BertForMaskedLM"


@pytest.mark.slow
def test_entry_point_refuses_a_saved_model_of_a_no_nsp_run_in_one_line(runs, tmp_path):
  out = tmp_path / "sm"
  proc = _export_cli(runs["mlm"], out, "--format=saved_model")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  errors = [line for line in proc.stderr.splitlines() if "export: error:" in line]
  assert len(errors) == 1 and "no nsp head" in errors[0] and "--format=hf" in errors[0], errors
  assert not out.exists()
