"""Length bucketing: bucket choice, declared axes, and outputs equal to unbucketed references."""

import numpy as np
import pytest
from float_tolerance import assert_model_close

from bert_jax.data.length_buckets import LengthBucketer, longest_row, parse_buckets


@pytest.mark.parametrize(
  "setting,max_len,expected",
  [
    ("32", 128, (32, 64, 96, 128)),
    ("48", 128, (48, 96, 128)),
    ("16,48", 64, (16, 48, 64)),
    ("64,32,128", 128, (32, 64, 128)),
    ("", 128, ()),
    ("0", 128, ()),
    (128, 128, (128,)),
  ],
)
def test_parse_buckets(setting, max_len, expected):
  assert parse_buckets(setting, max_len) == expected


@pytest.mark.parametrize(
  "setting,match",
  [
    ("a,b", "length_buckets='a,b': expected"),
    ("32,200", r"\[200\] exceed"),
    ("-8", "must be positive"),
  ],
)
def test_parse_buckets_errors_name_the_key(setting, match):
  with pytest.raises(ValueError, match=match):
    parse_buckets(setting, 128)


def _prefix_mask(lengths, L):
  return (np.arange(L)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)


def test_bucket_is_the_smallest_holding_the_longest_row():
  rng = np.random.default_rng(0)
  b = LengthBucketer((32, 64, 96, 128), {"input_ids": 1, "input_mask": 1})
  for _ in range(50):
    lengths = rng.integers(1, 129, size=8)
    mask = _prefix_mask(lengths, 128)
    want = min(x for x in (32, 64, 96, 128) if x >= lengths.max())
    assert b.length_of({"input_mask": mask}) == want
    cut = b.cut({"input_mask": mask, "input_ids": mask * 7, "label": lengths}, want)
    assert cut["input_ids"].shape == (8, want) and cut["label"] is not None
    assert cut["input_mask"].sum() == lengths.sum()  # nothing real was cut away
  assert longest_row(np.zeros((2, 5)), 1) == 0


def test_declared_axes_swag_ner_and_positions():
  # SWAG: B x C x L inputs; the longest of all choices decides.
  mask = np.zeros((2, 4, 64), np.int32)
  mask[0, 3, :37] = 1
  mask[1, 0, :5] = 1
  swag = LengthBucketer((16, 32, 48, 64), {"input_mask": 2, "input_ids": 2})
  assert swag.length_of({"input_mask": mask}) == 48
  assert swag.cut({"input_mask": mask, "input_ids": mask, "label": np.zeros(2)}, 48)[
    "input_ids"
  ].shape == (2, 4, 48)
  # NER: labels and weights are B x L and are cut with the inputs.
  ner = LengthBucketer((16, 32), {"input_mask": 1, "label_ids": 1, "label_weights": 1})
  rows = {
    "input_mask": _prefix_mask([9, 3], 32),
    "label_ids": np.ones((2, 32), np.int32),
    "label_weights": _prefix_mask([9, 3], 32).astype(np.float32),
  }
  cut = ner.cut(rows, ner.length_of(rows))
  assert {k: v.shape for k, v in cut.items()} == {k: (2, 16) for k in rows}
  assert cut["label_weights"].sum() == rows["label_weights"].sum()
  # Positions into the sequence stay inside the cut (SQuAD's start/end).
  qa = LengthBucketer((16, 32, 64), {"input_mask": 1}, ("start_positions", "end_positions"))
  assert (
    qa.length_of(
      {
        "input_mask": _prefix_mask([10], 64),
        "start_positions": np.array([3]),
        "end_positions": np.array([40]),
      }
    )
    == 64
  )
  # Outputs padded back: logits with the lowest float (never an argmax), ids with 0.
  out = LengthBucketer.pad(
    {
      "logits": np.ones((2, 16), np.float32),
      "ids": np.ones((2, 16), np.int32),
      "cls": np.ones((2, 3)),
    },
    {"logits": 1, "ids": 1},
    64,
  )
  assert out["logits"].shape == (2, 64) and out["logits"][0].argmax() < 16
  assert out["ids"][:, 16:].sum() == 0 and out["cls"].shape == (2, 3)


def test_row_lengths_are_each_rows_own_need():
  """Per-row needs (the eval sort key) equal length_of on that row alone (unrounded)."""
  rng = np.random.default_rng(1)
  mask = (rng.random((30, 4, 40)) < 0.1).astype(np.int32)  # holes: the last 1 decides
  mask[3] = 0  # an all-padding row needs 0
  swag = LengthBucketer(tuple(range(1, 41)), {"input_mask": 2})
  want = [longest_row(mask[i : i + 1], 2) for i in range(30)]
  np.testing.assert_array_equal(swag.row_lengths({"input_mask": mask}), want)
  qa = LengthBucketer((16, 32, 64), {"input_mask": 1}, ("end_positions",))
  rows = {"input_mask": _prefix_mask([10, 50, 3], 64), "end_positions": np.array([40, 2, 0])}
  np.testing.assert_array_equal(qa.row_lengths(rows), [41, 50, 3])


def _predictor(task, model, bucketed, batch_size=8):
  from bert_jax import parallel
  from bert_jax.runs.finetuning.inputs import Predictor, make_bucketer

  mesh = parallel.create_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  from configs.common import logical_axis_rules

  rules = parallel.normalize_rules(logical_axis_rules())
  bucketer = make_bucketer(task, task.config) if bucketed else None
  return Predictor(task, model, mesh, rules, batch_size, bucketer, int(task.config.max_seq_length))


def test_bucketed_glue_logits_equal_hugging_face(shared_data, minilm_dir):
  """MiniLM on CoLA dev rows: bert_jax cut to buckets vs HF PyTorch on the full-length rows."""
  import torch
  import transformers

  from bert_jax.formats import load_pretrained
  from bert_jax.tasks import create_task
  from configs import glue

  c = glue.get_config("cola")
  c.data_dir, c.max_seq_length, c.length_buckets, c.max_eval_examples = (
    str(shared_data / "glue"),
    64,
    "16",
    12,
  )
  pre = load_pretrained(str(minilm_dir))
  task = create_task(c, pre.tokenizer)
  data = task.load_split("dev")
  lengths = data.arrays["input_mask"].sum(1)
  assert lengths.max() <= 32 < 64  # so every batch is really cut (to 16 or 32)
  assert np.any(np.diff(lengths) < 0)  # evaluation visits them shortest first: reordered
  torch.manual_seed(0)
  hf = transformers.BertForSequenceClassification.from_pretrained(
    str(minilm_dir), num_labels=2
  ).eval()
  params = {
    "bert": pre.params["bert"],
    "classifier": {
      "kernel": hf.classifier.weight.detach().numpy().T,
      "bias": hf.classifier.bias.detach().numpy(),
    },
  }
  ours = _predictor(task, task.build_model(pre.config), bucketed=True)(params, data)["logits"]
  with torch.no_grad():
    ref = hf(
      input_ids=torch.as_tensor(data.arrays["input_ids"]).long(),
      attention_mask=torch.as_tensor(data.arrays["input_mask"]).long(),
      token_type_ids=torch.as_tensor(data.arrays["segment_ids"]).long(),
    ).logits.numpy()
  assert ours.shape == (12, 2)
  np.testing.assert_allclose(ours, ref, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["swag", "ner"])
def test_bucketed_predictions_equal_the_uncut_batch(name, shared_data, minilm_dir):
  """Tiny model, dropout off: the same outputs whether batches are cut or not."""
  import jax

  from bert_jax.model import BertConfig
  from bert_jax.tasks import create_task
  from bert_jax.tokenize import load_tokenizer
  from configs import ner, swag

  tok = load_tokenizer(str(minilm_dir / "vocab.txt"))
  if name == "swag":
    c = swag.get_config()
    c.train_file = c.dev_file = str(shared_data / "swag/sample.csv")
  else:
    c = ner.get_config()
    c.train_file = str(shared_data / "conll2003/dev.txt")
    c.dev_file = str(shared_data / "conll2003/dev.txt")
    c.max_eval_examples = 20
  c.max_seq_length, c.length_buckets = 96, "32"
  task = create_task(c, tok)
  data = task.load_split("dev")
  model = task.build_model(BertConfig.from_preset("tiny", vocab_size=tok.vocab_size))
  params = jax.tree_util.tree_map(
    np.asarray,
    jax.device_get(
      __import__("flax").linen.meta.unbox(
        task.init_variables(model, jax.random.PRNGKey(0), 1)["params"]
      )
    ),
  )
  cut = _predictor(task, model, True)(params, data)
  full = _predictor(task, model, False)(params, data)
  axis = 2 if name == "swag" else 1
  assert longest_row(data.arrays["input_mask"], axis) < 96  # something was cut
  assert set(cut) == set(full)
  for k in full:
    assert cut[k].shape == full[k].shape
    if name == "ner":  # label ids; compare them where a label is scored
      w = data.arrays["label_weights"] > 0
      np.testing.assert_array_equal(cut[k][w], full[k][w])
    else:
      # Shorter rows: other float32 orders (float_tolerance, rule 2).
      assert_model_close(cut[k], full[k], BertConfig.from_preset("tiny"), 96, err_msg=k)
  metrics_cut, _ = task.evaluate(data, cut)
  metrics_full, _ = task.evaluate(data, full)
  assert metrics_cut == metrics_full


def _cola_run(shared_data, minilm_dir, length_buckets, **kw):
  from configs import glue

  c = glue.get_config("cola")
  c.data_dir, c.vocab_file, c.model_preset = (
    str(shared_data / "glue"),
    str(minilm_dir / "vocab.txt"),
    "tiny",
  )
  c.max_seq_length, c.length_buckets = 64, length_buckets
  c.train_batch_size = c.eval_batch_size = 16
  c.max_train_examples, c.max_eval_examples, c.num_train_steps = 96, 32, 6
  c.learning_rate, c.predict_test, c.logging.log_every_steps = 1e-3, False, 1
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def test_bucketed_training_equals_unbucketed_without_dropout(tmp_path, shared_data, minilm_dir):
  """Same losses, dev metrics and final parameters, up to float noise (padding is masked)."""
  import json

  import jax

  from bert_jax.checkpoint import load_params
  from bert_jax.runs.finetuning import runner
  from bert_jax.runs.finetuning.inputs import FinetuneInput, make_bucketer
  from bert_jax.tasks import create_task
  from bert_jax.tokenize import load_tokenizer

  results = {}
  for buckets in ("16", ""):
    c = _cola_run(
      shared_data, minilm_dir, buckets, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    results[buckets] = runner.finetune(c, str(tmp_path / f"b{buckets}"))
  # The bucketed run really trained on cut batches of more than one length.
  task = create_task(c, load_tokenizer(str(minilm_dir / "vocab.txt")))
  c.length_buckets = "16"
  inputs = FinetuneInput(task.load_split("train"), 6, 16, int(c.seed), make_bucketer(task, c))
  assert len({next(inputs)["input_ids"].shape[1] for _ in range(6)}) > 1
  loss = {
    b: [l for _, l in json.load(open(tmp_path / f"b{b}/summary.json"))["train_loss_history"]]
    for b in results
  }
  np.testing.assert_allclose(loss["16"], loss[""], rtol=2e-5)
  assert results["16"]["dev"]["accuracy"] == results[""]["dev"]["accuracy"]
  assert results["16"]["dev"]["loss"] == pytest.approx(results[""]["dev"]["loss"], rel=1e-5)
  cut, _, _ = load_params(str(tmp_path / "b16"))
  full, _, _ = load_params(str(tmp_path / "b"))
  for a, b in zip(jax.tree_util.tree_leaves(cut), jax.tree_util.tree_leaves(full)):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
