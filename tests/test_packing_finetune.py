"""Packing in fine-tuning (config.packing.enabled): GLUE and NER rows packed several to a row give the
unpacked loss, gradients and metrics; tasks that cannot be packed say so; the attention kernel
of config.attention_kernel reaches the fine-tuned encoder."""

import json

import flax
import jax
import numpy as np
import pytest
from float_tolerance import assert_gradients_close, assert_sum_close, encoder_terms

from bert_jax import parallel
from bert_jax.data.packing import Packer, place_sequences
from bert_jax.model import BertConfig
from bert_jax.runs.finetuning import runner_io as io
from bert_jax.runs.finetuning.inputs import FinetuneInput, Predictor, packed_rows
from bert_jax.runs.finetuning.runner import build_finetune_job, make_loss_fn, make_packer
from bert_jax.tasks import create_task
from bert_jax.tokenize import load_tokenizer
from configs import glue, ner, squad, swag
from configs.common import logical_axis_rules

L = 64


# --- the packer on its own --------------------------------------------------------------------
def test_placement_fits_every_sequence_once():
  rng = np.random.default_rng(0)
  length_N = rng.integers(2, 40, 300)
  p = place_sequences(length_N, L, 4)
  assert p.num_rows < 300 and p.num_rows >= -(-length_N.sum() // L)
  taken = np.zeros((p.num_rows, L), int)
  for r, o, n in zip(p.row_N, p.offset_N, length_N):
    taken[r, o : o + n] += 1
  assert taken.max() == 1  # no two sequences overlap, none runs past the row
  pairs = set(zip(p.row_N.tolist(), p.slot_N.tolist()))
  assert len(pairs) == 300 and p.slot_N.max() == 3  # slots unique per row, at most 4
  again = place_sequences(length_N, L, 4)
  np.testing.assert_array_equal(again.row_N, p.row_N)  # deterministic
  np.testing.assert_array_equal(again.offset_N, p.offset_N)
  with pytest.raises(ValueError, match=r"config.max_seq_length=64"):
    place_sequences(np.array([3, 65]), L, 4)


def test_packed_row_counts_are_few_shapes():
  assert [packed_rows(n, 32, 1) for n in (1, 4, 5, 9, 30, 32)] == [4, 4, 8, 12, 32, 32]
  assert [packed_rows(n, 16, 1) for n in (1, 3, 5, 9)] == [2, 4, 6, 10]
  assert [packed_rows(n, 32, 8) for n in (1, 8, 9, 17, 30)] == [8, 8, 16, 24, 32]


def test_pack_layout():
  """Each sequence keeps its tokens, token types and per-sequence label at its slot."""
  arrays = {
    "input_ids": np.array([[101, 5, 6, 102, 0, 0], [101, 7, 102, 8, 102, 0]], np.int32),
    "input_mask": np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]], np.int32),
    "segment_ids": np.array([[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 0]], np.int32),
    "label": np.array([1, 0], np.int32),
  }
  packer = Packer(12, 4, ("input_ids", "segment_ids"))
  placement = packer.place(packer.lengths(arrays))
  out = packer.pack(arrays, np.arange(2), placement, 2)
  # The longer pair first, at 0; the other after it.
  np.testing.assert_array_equal(out["input_ids"][0], [101, 7, 102, 8, 102, 101, 5, 6, 102, 0, 0, 0])
  np.testing.assert_array_equal(out["segment_ids"][0], [0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(out["position_ids"][0], [0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 0, 0])
  np.testing.assert_array_equal(out["sequence_ids"][0], [1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0])
  np.testing.assert_array_equal(out["input_mask"][0], out["sequence_ids"][0] > 0)
  np.testing.assert_array_equal(out["cls_positions"][0], [0, 5, 0, 0])
  np.testing.assert_array_equal(out["sequence_weights"], [[1, 1, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(out["label"], [[0, 1, 0, 0], [0, 0, 0, 0]])
  logits = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
  back = packer.unpack({"logits": logits}, placement, {})
  np.testing.assert_array_equal(back["logits"], [logits[0, 1], logits[0, 0]])


# --- train steps: packed == unpacked --------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
  return load_tokenizer(str(minilm_dir / "vocab.txt"), do_lower_case=True)


def _task(kind, shared_data, tokenizer, **overrides):
  if kind == "ner":
    c = ner.get_config()
    c.unlock()
    c.train_file = str(shared_data / "conll2003/train.txt")
    c.dev_file = str(shared_data / "conll2003/dev.txt")
  else:
    c = glue.get_config(kind)
    c.unlock()
    c.data_dir = str(shared_data / "glue")
  c.max_seq_length, c.packing.enabled, c.packing.max_sequences_per_row = L, True, 8
  for k, v in overrides.items():
    c[k] = v
  return create_task(c, tokenizer)


def _model_and_params(task, tokenizer):
  bert = BertConfig.from_preset("tiny", vocab_size=tokenizer.vocab_size).replace(
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
  )
  model = task.build_model(bert)
  init = jax.jit(lambda rng: task.init_variables(model, rng, 1)["params"])
  return model, flax.linen.meta.unbox(init(jax.random.PRNGKey(0)))


def _loss_and_grads_fn(task, model):
  """``(params, batch) -> (loss, metrics, grads)``, jitted once (a compile per batch shape)."""
  loss_fn = make_loss_fn(task, model)
  step = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, None, True), has_aux=True))

  def run(params, batch):
    (loss, metrics), grads = step(params, batch)
    return float(loss), metrics, grads

  return run


# Two float32 steps in other orders (float_tolerance, rule 2): the tiny encoder's reductions at
# length L, the head's (pooler and classifier: 2 D) and the mean over a batch's L x 16 tokens.
_TINY = BertConfig.from_preset("tiny")
_TERMS = encoder_terms(_TINY, L) + 2 * _TINY.hidden_size + 16 * L


def _assert_same(a, b):
  (la, ma, ga), (lb, mb, gb) = a, b
  assert_sum_close(la, lb, abs(lb), _TERMS)
  for k in ma:
    assert_sum_close(float(ma[k]), float(mb[k]), abs(float(mb[k])), _TERMS, err_msg=k)
  assert len(jax.tree_util.tree_leaves(ga)) == len(jax.tree_util.tree_leaves(gb))
  assert_gradients_close(ga, gb, 2 * _TERMS)


@pytest.mark.parametrize("kind", ["sst2", "stsb", "ner"])
def test_packed_step_equals_unpacked(kind, shared_data, tokenizer):
  """The same step's rows, packed and not: the same loss, metrics and gradients (float32),
  also per micro-batch of gradient accumulation (row i*k+j to micro-batch j)."""
  task = _task(kind, shared_data, tokenizer, max_train_examples=96)
  data = task.load_split("train")
  model, params = _model_and_params(task, tokenizer)
  run = _loss_and_grads_fn(task, model)
  packer = make_packer(task, task.config)
  plain = FinetuneInput(data, 6, 16, seed=3)
  packed = FinetuneInput(data, 6, 16, seed=3, packer=packer)
  ref, got = plain.batch(7), packed.batch(7)  # the second epoch's shuffle
  assert got["input_ids"].shape[0] < 16  # really packed: fewer rows
  assert int(got["sequence_ids"].max()) > 1
  _assert_same(run(params, got), run(params, ref))
  accum = FinetuneInput(data, 6, 16, seed=3, packer=packer, grad_accum_steps=2).batch(1)
  ref = plain.batch(1)
  for j in range(2):
    micro = {k: v[j::2] for k, v in accum.items()}
    _assert_same(run(params, micro), run(params, {k: v[j::2] for k, v in ref.items()}))


# --- evaluation: packed == unpacked metrics -------------------------------------------------
def _predictor(task, model, packed):
  mesh = parallel.create_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  rules = parallel.normalize_rules(logical_axis_rules())
  packer = make_packer(task, task.config) if packed else None
  return Predictor(task, model, mesh, rules, 16, None, L, packer=packer)


@pytest.mark.parametrize("kind,n", [("sst2", 0), ("stsb", 300), ("ner", 300)])
def test_packed_evaluation_gives_the_unpacked_metrics(kind, n, shared_data, tokenizer):
  """Real dev rows (SST-2's 872; STS-B's and CoNLL's first 300), a tiny random model."""
  task = _task(kind, shared_data, tokenizer, max_eval_examples=n)
  data = task.load_split("dev")
  model, params = _model_and_params(task, tokenizer)
  want_preds = _predictor(task, model, packed=False)(params, data)
  got_preds = _predictor(task, model, packed=True)(params, data)
  for k in want_preds:
    assert got_preds[k].shape == want_preds[k].shape
    if k == "logits":
      want = want_preds[k]
      assert_sum_close(got_preds[k], want, np.abs(want).max(), _TERMS, err_msg=k)
  want, _ = task.evaluate(data, want_preds)
  got, _ = task.evaluate(data, got_preds)
  assert set(got) == set(want)
  for k, v in want.items():
    if isinstance(v, float):
      # near-constant scores of a random model: a correlation moves at 1e-5 with float noise
      assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-4), k
    else:
      assert got[k] == v, k


# --- what cannot be packed ----------------------------------------------------------------
def test_unpackable_runs_are_refused_before_any_step():
  c = squad.get_config()
  c.unlock()
  c.packing.enabled = True
  with pytest.raises(
    ValueError, match=r"^config.packing.enabled=True: task 'squad_v1' cannot be packed"
  ):
    build_finetune_job(c)
  c = swag.get_config()
  c.unlock()
  c.packing.enabled = True
  with pytest.raises(
    ValueError, match=r"^config.packing.enabled=True: task 'swag' cannot be packed"
  ):
    build_finetune_job(c)
  c = glue.get_config("cola")
  c.unlock()
  c.packing.enabled, c.private_attributes, c.defence.name = True, "cola_source", "multidetasking"
  with pytest.raises(ValueError, match=r"config.packing.enabled=True: config.defence.name="):
    build_finetune_job(c)
  c = glue.get_config("cola")
  c.unlock()
  c.packing.enabled, c.packing.max_sequences_per_row = True, 0
  with pytest.raises(ValueError, match=r"config.packing.max_sequences_per_row must be at least 1"):
    build_finetune_job(c)


def test_abstract_packed_job_has_packed_batches():
  c = glue.get_config("mrpc")
  c.unlock()
  c.packing.enabled, c.packing.max_sequences_per_row = True, 5
  job = build_finetune_job(c)
  spec = job.program.phases[0].batch_spec
  assert spec["label"].shape == (32, 5) and spec["sequence_weights"].shape == (32, 5)
  assert spec["cls_positions"].shape == (32, 5) and spec["sequence_ids"].shape == (32, 128)
  assert job.program.eval_batch_spec["label"].shape == (32, 5)
  assert job.program.phases[0].flops_per_example == 0.0


# --- the attention kernel -------------------------------------------------------------------
def test_attention_kernel_reaches_the_encoder():
  """config.attention_kernel, resolved for the platform, is the fine-tuned encoder's kernel."""
  from bert_jax.runs.finetuning import runner

  c = glue.get_config("mrpc")
  c.unlock()
  bert = BertConfig.from_preset("tiny")
  c.attention_kernel = "auto"  # on a CPU, and with attention dropout: the reference path
  assert io.run_model_config(bert, c, keys=()).attention_kernel == "reference"
  c.attention_kernel = "dot_product"
  with pytest.raises(ValueError, match=r"config.attention_kernel='dot_product'.*dropout"):
    build_finetune_job(c)
  c.attention_probs_dropout_prob = 0.0
  assert runner._abstract_bert_config(c).attention_kernel == "dot_product"
  assert build_finetune_job(c).program.phases[0].batch_spec["input_ids"].shape == (32, 128)
  c.attention_kernel = "splash"
  with pytest.raises(ValueError, match=r"config.attention_kernel='splash' runs on TPUs only"):
    build_finetune_job(c)


# --- a run end to end ---------------------------------------------------------------------
@pytest.mark.slow
def test_packed_run_trains_and_evaluates_like_the_unpacked_one(tmp_path, shared_data, minilm_dir):
  """Two 4-step runs on an SST-2 slice, dropout off, packed and not (the suite's 8 devices,
  so packed row counts are multiples of 8): the same training losses and dev metrics."""
  from bert_jax.runs.finetuning import runner

  def run(packing):
    c = glue.get_config("sst2")
    c.data_dir, c.vocab_file, c.model_preset = str(shared_data / "glue"), "", "tiny"
    c.vocab_file = str(minilm_dir / "vocab.txt")
    c.max_seq_length, c.train_batch_size, c.eval_batch_size = 64, 32, 32
    c.max_train_examples, c.max_eval_examples, c.num_train_steps = 128, 96, 4
    c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0.0
    c.learning_rate, c.predict_test, c.packing.enabled = 1e-3, False, packing
    c.logging.log_every_steps = 1
    workdir = tmp_path / ("packed" if packing else "plain")
    return runner.finetune(c, str(workdir)), workdir

  (plain, plain_dir), (packed, packed_dir) = run(False), run(True)
  losses = [
    [l for _, l in json.load(open(d / "summary.json"))["train_loss_history"]]
    for d in (plain_dir, packed_dir)
  ]
  assert len(losses[0]) == 4
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)
  assert packed["dev"]["accuracy"] == plain["dev"]["accuracy"]
  assert packed["dev"]["loss"] == pytest.approx(plain["dev"]["loss"], rel=1e-4)
  preds = (packed_dir / "predictions/dev_predictions.tsv").read_text()
  assert preds == (plain_dir / "predictions/dev_predictions.tsv").read_text()
