r"""Packing in pre-training: real tokens per second of the train step, packed vs unpacked.

  python -m benchmarks.bench_packing                       # tiny, seq 128 and 512, CPU
  python -m benchmarks.bench_packing --preset=mini --seq_lens=128 --repeats=5

One process, side by side: for each sequence length, the built-in corpus (README's main
command's: ``bert_jax.data.default_corpus`` with configs/pretrain.py's seed, NSP pairs, static
masks) is read by the run's own input (``pretraining_data.input_factory``) once one instance per
row and once packed (``config.packing``: up to max_sequences_per_row instances per row, first fit
within the batch in the reader's order), and the run's train step (model, MLM + NSP loss, AdamW, one jitted donated
step) trains on each. Runs alternate (unpacked, packed, unpacked, ...), each timing ``--steps``
steps after one untimed step over batches read beforehand; the median of ``--repeats`` is
reported. Real tokens per second = the batches' real tokens (input_mask) / step time; the
real-token share (real tokens / row slots) is measured over ``--share_batches`` batches of each
input, and 1 / share is the most packing can gain at that length. The input's own time per batch
(reading, masking, packing; not in the step time) is reported beside it.

Writes benchmarks/results/packing/bench_packing_<device>.json (or ``--out``) with the date and
the command.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import time

import jax
import numpy as np
from absl import app, flags

from bert_jax import parallel
from bert_jax.model import BertForPreTraining
from bert_jax.tasks.pretraining import data as pretraining_data
from bert_jax.tasks.pretraining.loss import make_pretraining_loss
from bert_jax.tasks.pretraining.task import bert_config_from
from bert_jax.train import optimizers
from bert_jax.train.state import init_train_state
from bert_jax.train.train_step import jit_train_step, make_train_step
from configs import pretrain

_PRESET = flags.DEFINE_string("preset", "tiny", "configs/pretrain.py preset (model and batch)")
_SEQ_LENS = flags.DEFINE_list("seq_lens", ["128", "512"], "sequence lengths (rows)")
_STEPS = flags.DEFINE_integer("steps", 10, "timed steps per run")
_REPEATS = flags.DEFINE_integer("repeats", 3, "alternating runs of each mode")
_SHARE_BATCHES = flags.DEFINE_integer("share_batches", 100, "batches to measure the share over")
_CORPUS_DIR = flags.DEFINE_string(
  "corpus_dir", "/tmp/bert_jax_bench_packing/default_corpus", "where the built-in corpus goes"
)
_OUT = flags.DEFINE_string("out", "", "result JSON ('' = benchmarks/results/packing/...)")

_PREDICTIONS = {128: 20, 512: 80}


def _config(seq: int, packed: bool, data):
  config = pretrain.get_config(_PRESET.value)
  batch = (
    config.train_batch_size if seq == config.max_seq_length else config.phase2.train_batch_size
  )
  config.phase2.fraction = 0.0
  config.max_seq_length, config.max_predictions_per_seq = seq, _PREDICTIONS[seq]
  config.train_batch_size = batch
  config.input_files, config.vocab_file = data.train_files[seq], data.vocab_file
  config.packing.enabled = packed
  if seq == 512:  # phase 2's setting for rows of 512
    config.packing.max_sequences_per_row = config.phase2.max_sequences_per_row
  return config


def _input(config, workdir):
  sources = pretraining_data.resolve_data(config, workdir)
  (phase,) = sources.phases
  share = pretraining_data.TokenShare(f"seq{phase.max_seq_length}", phase.packed)
  make = pretraining_data.input_factory(config, sources, phase, config.train_batch_size, share)
  return sources, phase, make(), share


def _step(config, sources, mesh, rules, phase):
  bert = bert_config_from(config, sources.vocab_size, mesh)
  model = BertForPreTraining(bert)
  tx = optimizers.create_optimizer(config.optimizer, 1e-4)
  ids = np.zeros((1, phase.max_seq_length), np.int32)
  preds = np.zeros((1, phase.max_predictions_per_seq), np.int32)
  state = init_train_state(
    lambda rng: model.init(rng, ids, ids, ids, preds)["params"], tx, mesh, rules, seed=0
  )
  step = jit_train_step(
    make_train_step(make_pretraining_loss(model, config.objective), tx, None, 1, mesh),
    jax.tree_util.tree_map(lambda x: x.sharding, state),
    mesh,
    rules,
  )
  holder = {"state": state}

  def run(batch):
    holder["state"], metrics = step(holder["state"], batch)
    return metrics["loss"]

  return run


def _time(run, batches, steps) -> float:
  float(run(batches[-1]))
  loss = None
  t = time.perf_counter()
  for i in range(steps):
    loss = run(batches[i % len(batches)])
  float(loss)
  return (time.perf_counter() - t) / steps


def main(argv):
  del argv
  from bert_jax.data.default_corpus import prepare_default_data

  base = pretrain.get_config(_PRESET.value)
  seqs = [int(s) for s in _SEQ_LENS.value]
  data = prepare_default_data(
    _CORPUS_DIR.value,
    max_seq_lengths=(128, 512),
    max_predictions_per_seq=(20, 80),
    random_seed=base.seed,
    **pretraining_data._default_corpus_settings(base),
  )
  mesh = parallel.create_mesh({"data": 1}, jax.devices()[:1])
  rules = parallel.normalize_rules(base.logical_axis_rules)
  workdir = os.path.dirname(_CORPUS_DIR.value)
  results = []
  for seq in seqs:
    modes = {}
    for packed in (False, True):
      config = _config(seq, packed, data)
      sources, phase, inp, share = _input(config, workdir)
      t = time.perf_counter()
      batches = [next(inp) for _ in range(_SHARE_BATCHES.value)]
      host = (time.perf_counter() - t) / len(batches)
      device_batches = [jax.device_put(b) for b in batches[: max(_STEPS.value, 1)]]
      real = [int(np.count_nonzero(b["input_mask"])) for b in batches[: _STEPS.value]]
      modes[packed] = dict(
        run=_step(config, sources, mesh, rules, phase),
        batches=device_batches,
        real_per_step=sum(real) / len(real),
        share=share.summary(),
        host=host,
        batch=config.train_batch_size,
        phase=phase,
      )
    times = {False: [], True: []}
    for _ in range(_REPEATS.value):
      for packed in (False, True):
        m = modes[packed]
        times[packed].append(_time(m["run"], m["batches"], _STEPS.value))
    for packed in (False, True):
      m = modes[packed]
      step_s = statistics.median(times[packed])
      results.append(
        dict(
          seq_len=seq,
          packed=packed,
          rows_per_batch=m["batch"],
          max_sequences_per_row=m["phase"].max_sequences_per_row,
          prediction_slots_per_row=m["phase"].row_predictions,
          real_token_share=round(m["share"]["real_token_share"], 4),
          sequences_per_row=round(m["share"]["sequences_per_row"], 3),
          share_limit_speedup=round(1 / m["share"]["real_token_share"], 3),
          step_seconds=round(step_s, 5),
          step_seconds_all=[round(t, 5) for t in times[packed]],
          real_tokens_per_step=m["real_per_step"],
          real_tokens_per_second=round(m["real_per_step"] / step_s, 1),
          input_seconds_per_batch=round(m["host"], 5),
        )
      )
    unpacked, packed = results[-2], results[-1]
    print(
      f"seq {seq}: share {unpacked['real_token_share']:.3f} -> {packed['real_token_share']:.3f} "
      f"({packed['sequences_per_row']:.2f} sequences per row); real tokens/s "
      f"{unpacked['real_tokens_per_second']:.0f} -> {packed['real_tokens_per_second']:.0f} "
      f"(x{packed['real_tokens_per_second'] / unpacked['real_tokens_per_second']:.3f})",
      flush=True,
    )
  out = dict(
    date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    command="python -m benchmarks.bench_packing " + " ".join(sys.argv[1:]),
    device=jax.devices()[0].device_kind,
    platform=jax.default_backend(),
    preset=_PRESET.value,
    corpus="bert_jax.data.default_corpus (README main command's settings)",
    steps=_STEPS.value,
    repeats=_REPEATS.value,
    results=results,
    speedup={
      str(seq): round(
        next(r for r in results if r["seq_len"] == seq and r["packed"])["real_tokens_per_second"]
        / next(r for r in results if r["seq_len"] == seq and not r["packed"])[
          "real_tokens_per_second"
        ],
        3,
      )
      for seq in seqs
    },
  )
  path = _OUT.value or os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "results",
    "packing",
    f"bench_packing_{jax.default_backend()}.json",
  )
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(out, f, indent=2)
  print(json.dumps(out["speedup"]), "->", path)


if __name__ == "__main__":
  app.run(main)
