r"""Packing in pre-training: real tokens per second of the train step, packed vs unpacked.

  python -m benchmarks.speed.packing                       # tiny, seq 128 and 512, CPU
  python -m benchmarks.speed.packing --preset=mini --seq_lens=128 --repeats=5

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

from benchmarks.common import REPO, flags
from benchmarks.common.pretrain_step import PretrainingStepper
from benchmarks.common.timing import Timer
from bert_jax import parallel
from bert_jax.data.default_corpus import prepare_default_data
from bert_jax.model import BertForPreTraining
from bert_jax.runs.pretraining.runner import bert_config_from
from bert_jax.tasks.pretraining import data as pretraining_data
from bert_jax.tasks.pretraining.loss import make_pretraining_loss
from bert_jax.train import optimizers
from configs import pretrain

_PREDICTIONS = {128: 20, 512: 80}


def _config(args, seq: int, packed: bool, data):
  config = pretrain.get_config(args.preset)
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
  loss_fn = make_pretraining_loss(model, config.objective)
  return PretrainingStepper(
    model, loss_fn, tx, mesh, rules, phase.max_seq_length, phase.max_predictions_per_seq
  )


def _time(run, batches, steps) -> float:
  return Timer(calls=steps).time(lambda i: run(batches[i % len(batches)])).mean


def _parser():
  p = flags.parser(__doc__)
  p.add_argument("--preset", default="tiny", help="configs/pretrain.py preset (model and batch)")
  flags.add_list(p, "seq_lens", ["128", "512"], "sequence lengths (rows)")
  p.add_argument("--steps", type=int, default=10, help="timed steps per run")
  p.add_argument("--repeats", type=int, default=3, help="alternating runs of each mode")
  p.add_argument("--share_batches", type=int, default=100, help="batches to measure the share over")
  p.add_argument(
    "--corpus_dir",
    default="/tmp/bert_jax_bench_packing/default_corpus",
    help="where the built-in corpus goes",
  )
  p.add_argument("--out", default="", help="result JSON ('' = benchmarks/results/packing/...)")
  return p


def main(argv=None):
  args = _parser().parse_args(argv)
  base = pretrain.get_config(args.preset)
  seqs = [int(s) for s in args.seq_lens]
  data = prepare_default_data(
    args.corpus_dir,
    max_seq_lengths=(128, 512),
    max_predictions_per_seq=(20, 80),
    random_seed=base.seed,
    **pretraining_data._default_corpus_settings(base),
  )
  mesh = parallel.create_mesh({"data": 1}, jax.devices()[:1])
  rules = parallel.normalize_rules(base.logical_axis_rules)
  workdir = os.path.dirname(args.corpus_dir)
  results = []
  for seq in seqs:
    modes = {}
    for packed in (False, True):
      config = _config(args, seq, packed, data)
      sources, phase, inp, share = _input(config, workdir)
      t = time.perf_counter()
      batches = [next(inp) for _ in range(args.share_batches)]
      host = (time.perf_counter() - t) / len(batches)
      device_batches = [jax.device_put(b) for b in batches[: max(args.steps, 1)]]
      real = [int(np.count_nonzero(b["input_mask"])) for b in batches[: args.steps]]
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
    for _ in range(args.repeats):
      for packed in (False, True):
        m = modes[packed]
        times[packed].append(_time(m["run"], m["batches"], args.steps))
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
    command="python -m benchmarks.speed.packing " + " ".join(sys.argv[1:]),
    device=jax.devices()[0].device_kind,
    platform=jax.default_backend(),
    preset=args.preset,
    corpus="bert_jax.data.default_corpus (README main command's settings)",
    steps=args.steps,
    repeats=args.repeats,
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
  path = args.out or os.path.join(
    REPO,
    "benchmarks",
    "results",
    "packing",
    f"bench_packing_{jax.default_backend()}.json",
  )
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(out, f, indent=2)
  print(json.dumps(out["speedup"]), "->", path)


if __name__ == "__main__":
  main()
