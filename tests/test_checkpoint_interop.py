"""Checkpoint import/export: round trips, TensorFlow checkpoints and bad input.

References: tensors written by ``transformers``' own ``save_pretrained`` (safetensors and
pytorch_model.bin) and a TensorFlow checkpoint written by TensorFlow's own ``Saver`` under
google-research/bert's variable names (with Adam slots and global_step, as the original's
``run_pretraining.py`` leaves them). Outputs are compared to Hugging Face's PyTorch BERT.
"""

import json
import pathlib
import re

import jax
import numpy as np
import pytest
import torch
import transformers
from float_tolerance import assert_model_close

from bert_jax import model as models
from bert_jax.formats import CheckpointError, detect, load_pretrained, save_hf

HF_SMALL = dict(
  vocab_size=99,
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=4,
  intermediate_size=37,
  max_position_embeddings=40,
)
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(94)]


def hf_model(cls_name="BertForPreTraining", seed=0, **extra):
  torch.manual_seed(seed)
  model = getattr(transformers, cls_name)(transformers.BertConfig(**HF_SMALL, **extra)).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  return model


def save_hf_dir(model, directory, safe=True):
  model.save_pretrained(directory, safe_serialization=safe)
  (pathlib.Path(directory) / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  return pathlib.Path(directory)


def state(model):
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def assert_same_state(a, b):
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(scope="module")
def pretraining_dir(tmp_path_factory):
  model = hf_model()
  return save_hf_dir(model, tmp_path_factory.mktemp("hf_pre")), model


# --- round trips -----------------------------------------------------------------------------


def test_hf_pretraining_round_trip_is_identical(pretraining_dir, tmp_path):
  directory, model = pretraining_dir
  pre = load_pretrained(directory)
  assert (pre.source, pre.task, pre.absent) == ("huggingface", "pretraining", ())
  assert pre.tokenizer is not None and pre.tokenizer.vocab_size == len(VOCAB)
  save_hf(tmp_path, pre.params, pre.config, pre.tokenizer, head="pretraining")
  back = transformers.BertForPreTraining.from_pretrained(tmp_path)
  assert_same_state(state(back), state(model))
  assert (tmp_path / "vocab.txt").read_text().split() == VOCAB
  assert transformers.AutoTokenizer.from_pretrained(tmp_path).convert_tokens_to_ids("w3") == 8


def test_minilm_bertmodel_round_trip_is_identical(minilm_dir, tmp_path):
  """A real BertModel checkpoint (no "bert." prefix, [out, in] kernels, a position_ids buffer)."""
  from safetensors.numpy import load_file

  pre = load_pretrained(minilm_dir)
  assert pre.task == "encoder" and pre.absent == ("mlm", "nsp")  # BertModel: no heads
  save_hf(tmp_path, pre.params, pre.config, pre.tokenizer, head="encoder")
  original = load_file(str(minilm_dir / "model.safetensors"))
  exported = load_file(str(tmp_path / "model.safetensors"))
  original.pop("embeddings.position_ids")  # a buffer, not a weight
  assert_same_state(exported, original)
  loaded, info = transformers.BertModel.from_pretrained(tmp_path, output_loading_info=True)
  assert not any(info.values()), info


def test_pytorch_bin_imports_like_safetensors(pretraining_dir, tmp_path):
  directory, model = pretraining_dir
  bin_dir = save_hf_dir(model, tmp_path, safe=False)
  assert (bin_dir / "pytorch_model.bin").is_file()
  a, b = load_pretrained(directory).params, load_pretrained(bin_dir).params
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_masked_lm_checkpoint_lists_what_is_absent(tmp_path):
  model = hf_model("BertForMaskedLM")
  pre = load_pretrained(save_hf_dir(model, tmp_path))
  assert pre.task == "pretraining"
  assert set(pre.absent) == {"bert/pooler", "nsp"}
  assert "nsp" not in pre.params and "mlm_output_bias" in pre.params
  assert pre.params["bert"]["pooler"]["kernel"].shape == (32, 32)  # initialised, as listed


def test_bert_jax_workdir_round_trip(pretraining_dir, tmp_path):
  """HF -> a bert_jax workdir (Orbax, through the manager) -> load_pretrained -> HF."""
  from bert_jax import checkpoint as manager

  directory, model = pretraining_dir
  pre = load_pretrained(directory)
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "model_config.json").write_text(json.dumps(pre.config.to_dict()))
  (workdir / "head.json").write_text(
    json.dumps({"task": "pretraining", "num_labels": None, "labels": []})
  )
  pre.tokenizer.save(workdir)
  mngr = manager.CheckpointManager(str(workdir), async_save=False)
  mngr.save(3, {"params": pre.params, "step": np.int32(3)})
  mngr.close()
  assert detect(workdir) == "bert_jax"
  ours = load_pretrained(workdir)
  assert (ours.source, ours.task) == ("bert_jax", "pretraining")
  save_hf(tmp_path / "hf", ours.params, ours.config, ours.tokenizer, head=ours.task)
  assert_same_state(
    state(transformers.BertForPreTraining.from_pretrained(tmp_path / "hf")), state(model)
  )


# --- TensorFlow ------------------------------------------------------------------------------


def tf_name(hf_name):
  """google-research/bert's variable name for a Hugging Face tensor (from modeling.py)."""
  n = hf_name.replace(".", "/")
  n = re.sub(r"layer/(\d+)/", r"layer_\1/", n)
  n = re.sub(r"LayerNorm/weight$", "LayerNorm/gamma", n)
  n = re.sub(r"LayerNorm/bias$", "LayerNorm/beta", n)
  n = re.sub(r"_embeddings/weight$", "_embeddings", n)
  n = n.replace("cls/predictions/bias", "cls/predictions/output_bias")
  n = n.replace("cls/seq_relationship/weight", "cls/seq_relationship/output_weights")
  n = n.replace("cls/seq_relationship/bias", "cls/seq_relationship/output_bias")
  # run_classifier.py's head: output_weights [num_labels, hidden] and output_bias.
  n = {"classifier/weight": "output_weights", "classifier/bias": "output_bias"}.get(n, n)
  return re.sub(r"/weight$", "/kernel", n)


def write_tf_checkpoint(model, directory, extra_vars=()):
  """The HF weights as google-research/bert would have saved them (tf.compat.v1 Saver)."""
  import tensorflow as tf

  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  values = {}
  for k, v in state(model).items():
    if k.startswith("cls.predictions.decoder") or k.endswith("position_ids"):
      continue
    name = tf_name(k)
    values[name] = v.T if name.endswith("/kernel") else v  # TF dense kernels are [in, out]
  for name in list(values)[:3]:  # Adam slots and the step, as run_pretraining.py leaves them
    values[name + "/adam_m"] = np.zeros_like(values[name])
    values[name + "/adam_v"] = np.zeros_like(values[name])
  values["global_step"] = np.int64(7)
  values.update(extra_vars)
  with tf.Graph().as_default():
    variables = [tf.compat.v1.Variable(v, name=n) for n, v in values.items()]
    saver = tf.compat.v1.train.Saver(variables)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      saver.save(sess, str(directory / "bert_model.ckpt"), write_meta_graph=False)
  config = {
    k: v
    for k, v in model.config.to_dict().items()
    if k
    in (
      "vocab_size",
      "hidden_size",
      "num_hidden_layers",
      "num_attention_heads",
      "intermediate_size",
      "hidden_act",
      "hidden_dropout_prob",
      "attention_probs_dropout_prob",
      "max_position_embeddings",
      "type_vocab_size",
      "initializer_range",
    )
  }
  (directory / "bert_config.json").write_text(json.dumps(config))
  (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  return directory


def test_tf_checkpoint_imports_to_same_outputs(pretraining_dir, tmp_path):
  _, model = pretraining_dir
  directory = write_tf_checkpoint(model, tmp_path / "uncased_L-2_H-32_A-4")
  assert detect(directory) == "tensorflow"
  pre = load_pretrained(directory)
  assert (pre.source, pre.task, pre.absent) == ("tensorflow", "pretraining", ())
  assert pre.tokenizer.do_lower_case  # from the directory name, as google-research names them
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 99, (2, 9)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 6:] = 0
  seg = np.zeros_like(ids)
  seg[:, 4:] = 1
  positions = np.array([[1, 3], [2, 5]], np.int32)
  ours = jax.jit(models.BertForPreTraining(pre.config).apply)(
    {"params": pre.params}, ids, mask, seg, masked_lm_positions=positions
  )
  with torch.no_grad():
    ref = model(torch.tensor(ids).long(), torch.tensor(mask).long(), torch.tensor(seg).long())
  # PyTorch's float32 in another order (float_tolerance, rule 2).
  ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(), positions[..., None], 1)
  assert_model_close(ours["mlm_logits"], ref_mlm, pre.config, ids.shape[1])
  assert_model_close(
    ours["nsp_logits"], ref.seq_relationship_logits.numpy(), pre.config, ids.shape[1]
  )
  # ... and it exports to exactly the weights it came from.
  save_hf(tmp_path / "hf", pre.params, pre.config, pre.tokenizer, head="pretraining")
  assert_same_state(
    state(transformers.BertForPreTraining.from_pretrained(tmp_path / "hf")), state(model)
  )


def test_tf_run_classifier_checkpoint_imports_as_a_classifier(tmp_path):
  model = hf_model("BertForSequenceClassification", num_labels=3)
  pre = load_pretrained(write_tf_checkpoint(model, tmp_path / "cased_glue"))
  assert (pre.task, pre.num_labels) == ("sequence_classification", 3)
  assert not pre.tokenizer.do_lower_case  # "cased_..." directory
  ids = np.array([[2, 7, 8, 9, 3, 0]], np.int32)
  mask = (ids > 0).astype(np.int32)
  ours = jax.jit(models.BertForSequenceClassification(pre.config, 3).apply)(
    {"params": pre.params}, ids, mask, np.zeros_like(ids)
  )["logits"]
  with torch.no_grad():
    ref = model(torch.tensor(ids).long(), torch.tensor(mask).long()).logits.numpy()
  assert_model_close(ours, ref, pre.config, ids.shape[1])  # float_tolerance, rule 2


def test_tf_unknown_variable_is_named(pretraining_dir, tmp_path):
  _, model = pretraining_dir
  directory = write_tf_checkpoint(
    model,
    tmp_path / "ckpt",
    {"bert/encoder/layer_0/attention/self/rotary/kernel": np.zeros((32, 32), np.float32)},
  )
  with pytest.raises(CheckpointError, match=r"bert_model\.ckpt.*attention/self/rotary/kernel"):
    load_pretrained(directory)


def test_tf_checkpoint_without_config_is_an_error(pretraining_dir, tmp_path):
  _, model = pretraining_dir
  directory = write_tf_checkpoint(model, tmp_path / "ckpt")
  (directory / "bert_config.json").unlink()
  with pytest.raises(CheckpointError, match="no bert_config.json"):
    load_pretrained(directory / "bert_model.ckpt")


# --- bad input -------------------------------------------------------------------------------


@pytest.fixture
def encoder_dir(tmp_path):
  return save_hf_dir(hf_model("BertModel"), tmp_path / "enc")


def edit_config(directory, **changes):
  path = directory / "config.json"
  path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def edit_tensors(directory, fn):
  from safetensors.numpy import load_file, save_file

  path = str(directory / "model.safetensors")
  save_file(fn(load_file(path)), path, metadata={"format": "pt"})


def test_config_sizes_that_disagree_with_the_weights(encoder_dir):
  edit_config(encoder_dir, hidden_size=64, intermediate_size=37)
  with pytest.raises(
    CheckpointError,
    match=r"model\.safetensors: tensor 'embeddings\.word_"
    r"embeddings\.weight' has shape \[99, 32\] but .*config\.json.*\[99, 64\]",
  ):
    load_pretrained(encoder_dir)


def test_config_with_fewer_layers_than_the_weights(encoder_dir):
  edit_config(encoder_dir, num_hidden_layers=1)
  with pytest.raises(
    CheckpointError,
    match=r"num_hidden_layers=1 but the weights have "
    r"layer\(s\) 1\).*'encoder\.layer\.1\.",
  ):
    load_pretrained(encoder_dir)


def test_truncated_safetensors_names_the_file(encoder_dir):
  path = encoder_dir / "model.safetensors"
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
  with pytest.raises(
    CheckpointError,
    match=r"enc/model\.safetensors: not a readable "
    r"safetensors file",
  ):
    load_pretrained(encoder_dir)


def test_unknown_tensor_is_named(encoder_dir):
  edit_tensors(
    encoder_dir,
    lambda t: {**t, "encoder.layer.0.attention.self.rotary.weight": np.zeros((4, 4), np.float32)},
  )
  with pytest.raises(
    CheckpointError,
    match=r"model\.safetensors: unknown tensor.*"
    r"'encoder\.layer\.0\.attention\.self\.rotary\.weight'",
  ):
    load_pretrained(encoder_dir)


def test_missing_tensor_is_named(encoder_dir):
  edit_tensors(
    encoder_dir, lambda t: {k: v for k, v in t.items() if k != "encoder.layer.1.output.dense.bias"}
  )
  with pytest.raises(
    CheckpointError,
    match=r"model\.safetensors: missing tensor.*"
    r"'bert\.encoder\.layer\.1\.output\.dense\.bias'",
  ):
    load_pretrained(encoder_dir)


def test_wrongly_shaped_head_is_named(tmp_path):
  directory = save_hf_dir(hf_model("BertForSequenceClassification", num_labels=3), tmp_path)
  edit_tensors(directory, lambda t: {**t, "classifier.bias": np.zeros(4, np.float32)})
  with pytest.raises(CheckpointError, match=r"tensor 'classifier\.bias' has shape \[4\].*\[3\]"):
    load_pretrained(directory)


def test_untied_decoder_is_refused(pretraining_dir, tmp_path):
  directory, model = pretraining_dir
  copy = save_hf_dir(model, tmp_path / "copy")
  edit_tensors(
    copy,
    lambda t: {
      **t,
      "cls.predictions.decoder.weight": t["bert.embeddings.word_embeddings.weight"] + 1,
    },
  )
  with pytest.raises(CheckpointError, match="decoder.weight' differs"):
    load_pretrained(copy)


def test_unsupported_config_is_refused(encoder_dir):
  edit_config(encoder_dir, position_embedding_type="relative_key")
  with pytest.raises(CheckpointError, match=r"config\.json: position_embedding_type"):
    load_pretrained(encoder_dir)


def test_classifier_without_architectures_needs_a_task(tmp_path):
  directory = save_hf_dir(hf_model("BertForTokenClassification", num_labels=3), tmp_path)
  edit_config(directory, architectures=None)
  with pytest.raises(CheckpointError, match="pass task="):
    load_pretrained(directory)
  assert load_pretrained(directory, task="token_classification").num_labels == 3


def test_not_a_checkpoint(tmp_path):
  (tmp_path / "notes.txt").write_text("hello")
  with pytest.raises(CheckpointError, match="not a checkpoint bert_jax knows"):
    load_pretrained(tmp_path)
  with pytest.raises(CheckpointError, match="no such file"):
    load_pretrained(tmp_path / "absent")


def test_save_hf_keeps_existing_files(pretraining_dir, tmp_path):
  directory, _ = pretraining_dir
  pre = load_pretrained(directory)
  save_hf(tmp_path, pre.params, pre.config, pre.tokenizer)
  before = (tmp_path / "model.safetensors").read_bytes()
  with pytest.raises(CheckpointError, match="refusing to overwrite"):
    save_hf(tmp_path, pre.params, pre.config, pre.tokenizer, head="encoder")
  assert (tmp_path / "model.safetensors").read_bytes() == before
  with pytest.raises(
    CheckpointError, match=r"params lack what a BertForSequenceClassification needs: classifier"
  ):
    save_hf(tmp_path / "x", pre.params, pre.config, head="sequence_classification", num_labels=2)


def test_bfloat16_checkpoint_imports_as_float32(tmp_path):
  model = hf_model("BertModel").to(torch.bfloat16)
  pre = load_pretrained(save_hf_dir(model, tmp_path))
  kernel = pre.params["bert"]["layer_0"]["intermediate"]["kernel"]
  assert kernel.dtype == np.float32
  ref = model.state_dict()["encoder.layer.0.intermediate.dense.weight"].float().numpy().T
  np.testing.assert_array_equal(kernel, ref)


def test_params_only_export_loads(pretraining_dir, tmp_path):
  from bert_jax.formats import params_only

  directory, model = pretraining_dir
  pre = load_pretrained(directory)
  params_only.export_params_only(
    str(tmp_path / "p"), pre.params, pre.config, pre.head, pre.tokenizer
  )
  assert detect(tmp_path / "p") == "bert_jax"
  again = load_pretrained(tmp_path / "p")
  assert (again.source, again.task, again.config) == ("bert_jax", "pretraining", pre.config)
  save_hf(tmp_path / "hf", again.params, again.config, again.tokenizer, head=again.task)
  assert_same_state(
    state(transformers.BertForPreTraining.from_pretrained(tmp_path / "hf")), state(model)
  )


def test_encoder_of_a_fine_tuned_checkpoint(tmp_path):
  model = hf_model("BertForSequenceClassification", num_labels=3)
  directory = save_hf_dir(model, tmp_path / "cls")
  pre = load_pretrained(directory, task="encoder")
  assert set(pre.params) == {"bert"} and pre.task == "encoder" and pre.absent == ()
  with pytest.raises(
    CheckpointError, match="carry a sequence_classification head, not question_answering"
  ):
    load_pretrained(directory, task="question_answering")
  full = load_pretrained(directory)
  save_hf(tmp_path / "enc", full.params, full.config, head="encoder")  # the head is left out
  back, info = transformers.BertModel.from_pretrained(tmp_path / "enc", output_loading_info=True)
  assert not any(info.values()), info
  assert_same_state(
    state(back), {k[len("bert.") :]: v for k, v in state(model).items() if k.startswith("bert.")}
  )


def test_sharded_checkpoint_imports_like_one_file(pretraining_dir, tmp_path):
  directory, model = pretraining_dir
  model.save_pretrained(tmp_path, max_shard_size="20KB")
  assert (tmp_path / "model.safetensors.index.json").is_file()
  jax.tree.map(
    np.testing.assert_array_equal,
    load_pretrained(tmp_path).params,
    load_pretrained(directory).params,
  )
