"""The time-to-quality benchmark's fairness checks.

(a) The PyTorch reference (benchmarks/common/torch_pretrain.py: Hugging Face's
``BertForPreTraining``, SDPA attention) computes the same loss as bert_jax's pre-training loss on
the same batch given the same weights (bert_jax's initial parameters, converted by
``bert_jax.formats.hf``), with Hugging Face's labels=-100 loss and with the output layer at the
masked positions; the records it reads without TensorFlow equal TensorFlow's parse.
(b) The split by document puts no held-out document's text on the training side.
"""

import glob
import os

import jax
import numpy as np
import pytest
import torch
from flax.linen import meta

from benchmarks.common import torch_pretrain
from benchmarks.quality import time_to_quality, time_to_quality_data
from bert_jax.formats import hf
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.tasks.pretraining.loss import make_pretraining_eval, make_pretraining_loss


def _batch(vocab: int, b: int = 4, seq: int = 32, preds: int = 5, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  lengths = rng.integers(12, seq + 1, b)
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  ids = rng.integers(5, vocab, (b, seq)).astype(np.int32) * mask
  segments = ((np.arange(seq)[None] >= lengths[:, None] // 2) * mask).astype(np.int32)
  positions = np.zeros((b, preds), np.int32)
  weights = np.zeros((b, preds), np.float32)
  for i, n in enumerate(rng.integers(2, preds + 1, b)):  # some rows with padding predictions
    positions[i, :n] = np.sort(rng.choice(np.arange(1, lengths[i] - 1), n, replace=False))
    weights[i, :n] = 1.0
  return {
    "input_ids": ids,
    "input_mask": mask,
    "segment_ids": segments,
    "masked_lm_positions": positions,
    "masked_lm_ids": (rng.integers(5, vocab, (b, preds)) * (weights > 0)).astype(np.int32),
    "masked_lm_weights": weights,
    "next_sentence_labels": rng.integers(0, 2, (b,)).astype(np.int32),
  }


def test_pytorch_reference_has_bert_jax_initial_loss_on_the_same_weights():
  vocab = 512
  config = BertConfig.from_preset(
    "tiny", vocab_size=vocab, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
  )
  batch = _batch(vocab)
  model = BertForPreTraining(config)
  params = meta.unbox(model.init(jax.random.PRNGKey(0), batch["input_ids"])["params"])
  loss, metrics = make_pretraining_loss(model, "mlm_nsp")(params, batch, None, True)
  sums = make_pretraining_eval(model, "mlm_nsp")(params, batch)

  reference = torch_pretrain.hf_model("tiny", vocab, 0.0, 0.0).eval()
  tensors = hf.params_to_tensors(params, config, "pretraining", 2)
  missing, unexpected = reference.load_state_dict(
    {k: torch.from_numpy(np.array(v)) for k, v in tensors.items()}, strict=False
  )
  assert not unexpected
  # Tied to the word embeddings, or buffers: nothing learned is left at its own initial value.
  assert set(missing) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
  batch_t = {k: torch.from_numpy(v) for k, v in batch.items()}
  for head in ("all", "masked"):
    with torch.no_grad():
      loss_t, sums_t = torch_pretrain.loss_terms(reference, batch_t, head)
    np.testing.assert_allclose(float(loss_t), float(loss), rtol=2e-5, err_msg=head)
    for k in ("mlm_loss_sum", "mlm_correct", "mlm_weight", "nsp_loss_sum", "nsp_correct"):
      np.testing.assert_allclose(float(sums_t[k]), float(sums[k]), rtol=2e-5, atol=1e-5)
  assert np.isfinite(float(metrics["mlm_accuracy"]))


def test_records_read_without_tensorflow_equal_tensorflows_parse(tmp_path):
  tf = pytest.importorskip("tensorflow")
  from bert_jax.data import example_proto, tfrecord, tfrecord_writer

  rng = np.random.default_rng(1)
  n, seq, preds = 7, 16, 3
  lengths = rng.integers(5, seq + 1, n)
  ids = rng.integers(0, 300, (n, seq)) * (np.arange(seq)[None] < lengths[:, None])
  records = example_proto.serialize_arrays(
    ids,
    lengths,
    rng.integers(0, 2, (n, seq)),
    rng.integers(0, seq, (n, preds)),
    rng.integers(0, 300, (n, preds)),
    rng.integers(0, preds + 1, n),
    rng.integers(0, 2, n),
  )
  path = str(tmp_path / "x.tfrecord")
  tfrecord_writer.write_records(path, records)
  ours = torch_pretrain.read_records(path)
  theirs = tfrecord.parse_batch(tf.constant(records), seq, preds)
  for k, v in theirs.items():
    np.testing.assert_array_equal(ours[k], v.numpy(), err_msg=k)


def test_document_split_keeps_heldout_text_out_of_training(tmp_path):
  docs = list(time_to_quality_data.iter_documents("cpython"))[:120]
  docs += docs[:30]  # repeated documents: each copy must land on the same side
  train, heldout, dropped = time_to_quality_data.split_documents(docs, 0.2)
  assert heldout and train and len(train) + len(heldout) + dropped == len(docs)
  train_text = "\n\n".join("\n".join(d) for d in train)
  assert not [d for d in heldout if "\n".join(d) in train_text]


def test_prepared_data_has_no_heldout_document_text_in_training(tmp_path):
  data = time_to_quality_data.prepare(
    str(tmp_path / "data"), corpora=["cpython"], max_documents=120, heldout_fraction=0.2,
    dupe_factor=1, max_eval_records=256, eval_batch_size=32,
  )  # fmt: skip
  with open(os.path.join(data.out_dir, "text", "heldout.txt")) as f:
    heldout_docs = [d for d in f.read().split("\n\n") if d.strip()]
  train_text = "".join(open(p).read() for p in glob.glob(f"{data.out_dir}/text/train/*.txt"))
  assert len(heldout_docs) == data.documents["heldout"] > 0
  assert not [d for d in heldout_docs if d.strip() in train_text]
  assert data.eval_records % 32 == 0 and 0 < data.eval_records <= 256


def test_time_to_reach_interpolates_between_evaluations():
  evals = [
    dict(train_seconds=0.0, mlm_accuracy=0.0),
    dict(train_seconds=60.0, mlm_accuracy=0.2),
    dict(train_seconds=120.0, mlm_accuracy=0.4),
  ]
  assert time_to_quality.time_to_reach(evals, 0.3) == pytest.approx(90.0)
  assert time_to_quality.time_to_reach(evals, 0.5) is None


def test_glue_stage_commands_pass_the_caps_and_margins_are_over_the_floor(tmp_path):
  args = time_to_quality._parser().parse_args([
    f"--workdir={tmp_path}", "--glue_seeds=2", "--glue_tasks=rte,mrpc",
    "--glue_args=--config.max_train_examples=1000 --config.max_eval_examples=500",
  ])  # fmt: skip
  cmd = time_to_quality.glue_command(args, "/ckpt", str(tmp_path / "glue" / "m"))
  assert cmd[cmd.index("--") + 1 :] == [
    "--config.max_train_examples=1000",
    "--config.max_eval_examples=500",
  ]
  assert "--seeds=2" in cmd and "--tasks=rte,mrpc" in cmd and "--protocol=quick" in cmd
  glue = dict(
    glue_args=args.glue_args,
    models={
      "a": dict(
        tasks={"rte": {"score": 60.0}, "mrpc": {"score": 80.0}}, averages={"average": 70.0}
      ),
      "random_init": dict(tasks={"rte": {"score": 50.0}}, averages={"average": 55.5}),
    },
  )
  table = "\n".join(time_to_quality.glue_markdown(glue))
  assert "| a | 80.0 | 60.0 | 70.00 | +14.50 |" in table
  assert "| random_init | - | 50.0 | 55.50 | +0.00 |" in table


def test_notrain_reads_finished_runs_only(tmp_path):
  from benchmarks.quality import time_to_quality_runs as runs

  done, running = tmp_path / "done", tmp_path / "running"
  for path, completed in ((done, True), (running, False)):
    path.mkdir()
    (path / "ttq_state.json").write_text(
      f'{{"recipe": "bert_jax_fast", "evals": [], "completed": {str(completed).lower()}}}'
    )
  assert runs.finished("bert_jax_fast", str(done))["completed"] is True
  assert runs.finished("bert_jax_fast", str(running)) is None
  assert runs.finished("pytorch_sdpa", str(tmp_path / "absent")) is None


def test_device_section_fits_its_box_and_passes_flags_the_benchmark_takes(tmp_path):
  """The device check's section: the recipes' training budget is what its share leaves after
  the data and each recipe's overhead (none when that is under the floor), and its command is
  one the benchmark's own parser accepts (bfloat16 mini on the built-in corpus, no GLUE)."""
  from benchmarks.device import time_to_quality as section

  full = section.budget_per_recipe(216.0, quick=False)
  assert full == pytest.approx((216.0 - section.DATA_S["full"]) / 3 - section.OVERHEAD_S["full"])
  assert section.budget_per_recipe(100.0, quick=False) == 0.0
  cmd = section.command(str(tmp_path / "w"), str(tmp_path / "o"), full, quick=False)
  args = time_to_quality._parser().parse_args(cmd[3:])
  assert (args.size, args.dtype, args.corpora, args.glue) == (
    "mini",
    "bfloat16",
    ["cpython"],
    False,
  )
  assert args.budget_minutes * 60 == pytest.approx(full, abs=0.01)
  assert args.recipes == list(section.RECIPES)
  assert "--notrain" in section.command("w", "o", full, quick=True, train=False)


def test_device_section_table_reads_the_benchmark_summary():
  from benchmarks.device import time_to_quality as section

  evals = lambda accs: [
    dict(train_seconds=10.0 * (i + 1), mlm_accuracy=a) for i, a in enumerate(accs)
  ]
  results = {
    "bert_jax_fast": dict(evals=[dict(e, step=100 * (i + 1)) for i, e in enumerate(evals([0.1, 0.3]))]),
    "pytorch_sdpa": dict(evals=[dict(e, step=50 * (i + 1)) for i, e in enumerate(evals([0.1, 0.2]))]),
  }  # fmt: skip
  summary = time_to_quality.summarize(results)
  lines = section.table_lines(dict(budget_seconds_per_recipe=20.0, summary=summary))
  fast = next(line for line in lines if "bert_jax_fast" in line).split()
  assert fast[1:] == ["200", "0.3000", "15", "0.75"]  # 0.2 reached halfway from 10 s to 20 s
  assert any("not run" in line for line in section.table_lines({}))
