"""The paper's pre-training ablations at the model and loss level (Tables 5 and 6).

References: the No NSP loss is checked against a masked-LM cross-entropy written out in numpy;
the left-to-right model and loss against Hugging Face's PyTorch ``BertLMHeadModel`` (causal
attention, ``is_decoder=True``) on the same weights; the Table 6 sizes against the paper's table,
and base / large against its stated 110M / 340M parameters.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from float_tolerance import assert_model_close

from bert_jax.formats import load_pretrained
from bert_jax.model import PRESETS, BertConfig, BertEncoder, BertForPreTraining
from bert_jax.tasks.pretraining.loss import make_pretraining_eval, make_pretraining_loss

SMALL = dict(
  vocab_size=97,
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=4,
  intermediate_size=37,
  max_position_embeddings=40,
)


def _batch(vocab, b=3, length=16, preds=4, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, (b, length)).astype(np.int32)
  lengths = np.array([length] + list(rng.integers(6, length, b - 1)))
  mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
  positions = np.stack([np.sort(rng.choice(np.arange(1, n - 1), preds, False)) for n in lengths])
  weights = np.ones((b, preds), np.float32)
  weights[-1, -1] = 0.0  # a padding prediction
  return {
    "input_ids": ids * mask,
    "input_mask": mask,
    "segment_ids": np.zeros_like(ids),
    "masked_lm_positions": positions.astype(np.int32),
    "masked_lm_ids": rng.integers(5, vocab, (b, preds)).astype(np.int32),
    "masked_lm_weights": weights,
    "next_sentence_labels": rng.integers(0, 2, (b,)).astype(np.int32),
  }


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_no_nsp_has_no_nsp_head_and_its_loss_is_the_masked_lm_loss_alone():
  config = BertConfig(**SMALL)
  batch = _batch(config.vocab_size)
  model = BertForPreTraining(config, next_sentence=False)
  params = model.init(jax.random.PRNGKey(0), batch["input_ids"])["params"]
  assert "nsp" not in params and {"mlm_transform", "mlm_output_bias"} <= set(params)
  with_nsp = BertForPreTraining(config).init(jax.random.PRNGKey(0), batch["input_ids"])["params"]
  assert set(with_nsp) - set(params) == {"nsp"}

  loss, metrics = make_pretraining_loss(model, "mlm")(params, batch, None, True)
  assert set(metrics) == {"mlm_loss", "mlm_accuracy"}
  # Reference: cross-entropy at the masked positions, weighted, from the model's own logits.
  logits = np.asarray(
    model.apply({"params": params}, batch["input_ids"], batch["input_mask"])["mlm_logits"]
  )
  rows = np.take_along_axis(logits, batch["masked_lm_positions"][..., None], axis=1)
  logp = np.take_along_axis(_log_softmax(rows), batch["masked_lm_ids"][..., None], -1)[..., 0]
  w = batch["masked_lm_weights"]
  np.testing.assert_allclose(float(loss), -(logp * w).sum() / w.sum(), rtol=1e-5)
  sums = make_pretraining_eval(model, "mlm")(params, batch)
  assert "nsp_count" not in sums


@pytest.fixture(scope="module")
def hf_causal_lm(tmp_path_factory):
  """A random Hugging Face BertLMHeadModel (causal), perturbed, saved as a directory."""
  torch.manual_seed(0)
  hf_config = transformers.BertConfig(**SMALL, is_decoder=True)
  model = transformers.BertLMHeadModel(hf_config).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  path = tmp_path_factory.mktemp("hf_causal")
  model.save_pretrained(path)
  return model, str(path)


def test_left_to_right_model_and_loss_match_the_pytorch_causal_lm(hf_causal_lm):
  hf_model, path = hf_causal_lm
  pretrained = load_pretrained(path)
  assert pretrained.config.is_decoder
  model = BertForPreTraining(pretrained.config, next_sentence=False)
  batch = _batch(SMALL["vocab_size"], b=4, length=20)
  loss, metrics = jax.jit(lambda p, b: make_pretraining_loss(model, "ltr")(p, b, None, True))(
    pretrained.params, {k: batch[k] for k in ("input_ids", "input_mask", "segment_ids")}
  )
  ids = torch.tensor(batch["input_ids"], dtype=torch.long)
  mask = torch.tensor(batch["input_mask"], dtype=torch.long)
  labels = torch.where(mask > 0, ids, torch.full_like(ids, -100))
  with torch.no_grad():
    ref = hf_model(input_ids=ids, attention_mask=mask, token_type_ids=0 * ids, labels=labels)
  np.testing.assert_allclose(float(loss), float(ref.loss), rtol=1e-5)
  assert float(metrics["lm_loss"]) == float(loss)
  # Every real position's logits, not only the loss.
  ours = np.asarray(
    model.apply({"params": pretrained.params}, batch["input_ids"], batch["input_mask"])[
      "mlm_logits"
    ]
  )
  valid = batch["input_mask"] > 0
  # PyTorch's float32 in another order (float_tolerance, rule 2).
  assert_model_close(ours[valid], ref.logits.numpy()[valid], pretrained.config, ids.shape[1])


def test_left_to_right_outputs_never_see_later_tokens():
  config = BertConfig(**SMALL, is_decoder=True)
  model = BertForPreTraining(config, next_sentence=False)
  batch = _batch(config.vocab_size, b=2, length=24)
  ids, mask = batch["input_ids"], np.ones_like(batch["input_mask"])
  params = model.init(jax.random.PRNGKey(1), ids)["params"]
  apply = jax.jit(lambda i: model.apply({"params": params}, i, mask, output_hidden_states=True))
  base = apply(ids)
  rng = np.random.default_rng(3)
  for i in (0, 5, 17, 22):
    changed = ids.copy()
    changed[:, i + 1 :] = rng.integers(5, config.vocab_size, changed[:, i + 1 :].shape)
    out = apply(changed)
    for key in ("mlm_logits", "sequence_output"):
      assert np.array_equal(np.asarray(out[key])[:, : i + 1], np.asarray(base[key])[:, : i + 1])
      assert not np.array_equal(np.asarray(out[key])[:, i + 1 :], np.asarray(base[key])[:, i + 1 :])
    for a, b in zip(out["hidden_states"], base["hidden_states"]):
      assert np.array_equal(np.asarray(a)[:, : i + 1], np.asarray(b)[:, : i + 1])
  # The bidirectional model does see them (the mask is what makes the difference).
  bidir = BertForPreTraining(config.replace(is_decoder=False), next_sentence=False)
  out_a = bidir.apply({"params": params}, ids, mask)["mlm_logits"]
  changed = ids.copy()
  changed[:, -1] = (changed[:, -1] + 1) % config.vocab_size
  out_b = bidir.apply({"params": params}, changed, mask)["mlm_logits"]
  assert not np.array_equal(np.asarray(out_a)[:, 0], np.asarray(out_b)[:, 0])


def test_left_to_right_sparse_positions_equal_the_full_rows():
  """The masked-position path (last layer only at some rows) keeps each row's causal mask."""
  config = BertConfig(**SMALL, is_decoder=True)
  model = BertForPreTraining(config)
  batch = _batch(config.vocab_size)
  params = model.init(jax.random.PRNGKey(2), batch["input_ids"])["params"]
  args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"])
  full = model.apply({"params": params}, *args)["mlm_logits"]
  sparse = model.apply({"params": params}, *args, batch["masked_lm_positions"])["mlm_logits"]
  rows = jnp.take_along_axis(full, batch["masked_lm_positions"][..., None], axis=1)
  length = batch["input_ids"].shape[1]
  assert_model_close(sparse, rows, config, length)  # other orders (float_tolerance, rule 2)


# Devlin et al. 2019, Table 6: #L, #H, #A of the model size ablation.
TABLE_6 = [(3, 768, 12), (6, 768, 3), (6, 768, 12), (12, 768, 12), (12, 1024, 16), (24, 1024, 16)]


def test_table_6_presets_and_the_papers_parameter_counts():
  for layers, hidden, heads in TABLE_6:
    name = f"L{layers}_H{hidden}_A{heads}"
    c = BertConfig.from_preset(name)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (layers, hidden, heads)
    assert c.intermediate_size == 4 * hidden  # section 3: feed-forward size 4H
  assert PRESETS["L12_H768_A12"] == PRESETS["base"]
  assert PRESETS["L24_H1024_A16"] == PRESETS["large"]

  def count(preset):
    encoder = BertEncoder(BertConfig.from_preset(preset))
    ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda i: encoder.init(jax.random.PRNGKey(0), i), ids)
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))

  # Section 3: BERT-base 110M and BERT-large 340M parameters (figures rounded to 10M).
  assert abs(count("base") - 110e6) <= 5e6
  assert abs(count("large") - 340e6) <= 5e6
