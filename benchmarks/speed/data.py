"""Throughput of pre-training data generation (seq 128) and of the tf.data reader (128, 512).

  python -m benchmarks.speed.data --workdir=/tmp/bench_data
  taskset -c 0 python -m benchmarks.speed.data --workdir=/tmp/bench_data --skip_generation  # 1 core

  python -m benchmarks.speed.data --workdir=/tmp/bench_data --skip_reader \
    --gen_input='../shared/data/pretrain/shakespeare/*_gut.txt' --gen_format=text [--gen_engine=fast]

Uses the built-in corpus (CPython's documentation, bert_jax.data.default_corpus): prepares it
once under --workdir, then times
  * generation (examples/s, seq 128 + 20 predictions, dupe_factor 1) with 1 worker and with
    --num_workers (default: all cores), each in a fresh process, wall clock including start-up,
    and its peak memory (the process, and its largest child process: a worker), on the corpus and on it copied
    k times (--gen_scales): memory against corpus size;
  * the reader (PretrainInput, batch --batch_size at 128 and the same tokens at 512) with static
    masks, dynamic masking, and dynamic whole-word masking, after --warmup batches, on the cores
    this process may use (reported; `taskset -c 0` for one).
Prints one JSON line per measurement.
"""

import json
import os
import resource
import shutil
import sys
import time

from benchmarks.common import flags
from benchmarks.common.process import run
from bert_jax.data import corpus, default_corpus, generate, pipeline
from bert_jax.tokenize import load_tokenizer


def _report(name, examples, seconds, **extra):
  print(
    json.dumps(
      dict(
        benchmark=name,
        examples=examples,
        seconds=round(seconds, 2),
        examples_per_s=round(examples / seconds, 1),
        **extra,
      )
    ),
    flush=True,
  )


def _scaled_inputs(args, inputs, scale):
  """The input files copied `scale` times under --workdir (a corpus `scale` times as large)."""
  files = sorted(corpus.expand_patterns(inputs))
  if scale == 1:
    return files
  out = os.path.join(args.workdir, f"corpus_x{scale}")
  shutil.rmtree(out, ignore_errors=True)
  os.makedirs(out)
  for k in range(scale):
    for f in files:
      shutil.copy(f, os.path.join(out, f"{k}_{os.path.basename(f)}"))
  return sorted(corpus.expand_patterns(os.path.join(out, "*")))


def _generate_child(spec: dict) -> None:
  """One generation in this (fresh) process; prints its examples, time and peak memory."""
  config = generate.GenerationConfig(**spec["config"])
  start = time.time()
  result = generate.generate(
    spec["inputs"], spec["out"], config, num_workers=spec["workers"], overwrite=True, progress=False
  )
  seconds = time.time() - start
  print(
    json.dumps(
      dict(
        examples=result["stats"]["per_length"]["128"]["examples"],
        seconds=seconds,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        peak_child_rss_mb=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
      )
    )
  )


def bench_generation(args, data, workers, scale):
  config = dict(
    tokenizer_path=data.vocab_file,
    do_lower_case=True,
    max_seq_lengths=(128,),
    max_predictions_per_seq=(20,),
    dupe_factor=1,
    input_format=args.gen_format if args.gen_input else "original",
    engine=args.gen_engine,
  )
  inputs = _scaled_inputs(args, args.gen_input or list(data.corpus_files), scale)
  out = os.path.join(args.workdir, f"gen_{workers}")
  shutil.rmtree(out, ignore_errors=True)
  spec = dict(config=config, inputs=inputs, out=out, workers=workers)
  child = run([sys.executable, "-m", "benchmarks.speed.data", "--generate_child", json.dumps(spec)])
  wall = child.seconds
  got = json.loads(child.stdout.strip().splitlines()[-1])
  _report(
    "generate_seq128",
    got["examples"],
    wall,
    generate_seconds=round(got["seconds"], 2),
    workers=workers,
    engine=args.gen_engine,
    cores=len(os.sched_getaffinity(0)),
    input=args.gen_input or "built-in corpus",
    corpus_mb=round(sum(os.path.getsize(f) for f in inputs) / 1e6, 1),
    peak_rss_mb=round(got["peak_rss_mb"]),
    peak_child_rss_mb=round(got["peak_child_rss_mb"]),
  )


def bench_reader(args, data, name, seq, **kw):
  preds = {128: 20, 512: 80}[seq]
  batch = args.batch_size * 128 // seq  # The same tokens per batch at every length.
  inp = pipeline.PretrainInput(
    data.train_files[seq], batch, seq, preds, seed=0, process_index=0, process_count=1, **kw
  )
  for _ in range(args.warmup):
    next(inp)
  start = time.time()
  for _ in range(args.batches):
    next(inp)
  _report(
    f"reader_seq{seq}_{name}",
    args.batches * batch,
    time.time() - start,
    batch_size=batch,
    cores=len(os.sched_getaffinity(0)),
  )


def _parser():
  p = flags.parser(__doc__)
  p.add_argument("--workdir", default="/tmp/bench_data", help="Scratch directory.")
  p.add_argument(
    "--num_workers",
    type=int,
    default=0,
    help="Generation workers for the parallel run (0: all cores).",
  )
  p.add_argument("--batch_size", type=int, default=256, help="Reader batch size.")
  p.add_argument("--warmup", type=int, default=5, help="Reader batches before timing.")
  p.add_argument(
    "--gen_input",
    default="",
    help="Generation input globs (default: the built-in corpus), e.g. "
    "'../shared/data/pretrain/shakespeare/*_gut.txt'.",
  )
  flags.add_bool(p, "skip_reader", False, "Only time generation.")
  flags.add_bool(p, "skip_generation", False, "Only time the reader.")
  p.add_argument("--gen_format", default="original", help="--input_format of --gen_input.")
  p.add_argument(
    "--gen_engine", default="original", choices=["original", "fast"], help="Generation engine."
  )
  p.add_argument("--batches", type=int, default=40, help="Reader batches timed.")
  flags.add_list(
    p,
    "gen_scales",
    ["1", "2"],
    "Generation corpus sizes: the input copied k times (memory vs size).",
  )
  p.add_argument(
    "--generate_child", default="", help="Internal: run one generation (JSON spec) and exit."
  )
  flags.add_list(
    p, "reader_seq_lens", ["128", "512"], "Reader sequence lengths (20 / 80 predictions)."
  )
  return p


def main(argv=None):
  args = _parser().parse_args(argv)
  if args.generate_child:
    _generate_child(json.loads(args.generate_child))
    return
  start = time.time()
  data = default_corpus.prepare_default_data(os.path.join(args.workdir, "default"))
  print(
    json.dumps(
      {
        "benchmark": "prepare_default_data",
        "seconds": round(time.time() - start, 2),
        "note": "0 when reused from an earlier run",
      }
    ),
    flush=True,
  )
  if not args.skip_generation:
    for scale in map(int, args.gen_scales):
      bench_generation(args, data, 1, scale)
      bench_generation(args, data, args.num_workers or len(os.sched_getaffinity(0)), scale)
  if args.skip_reader:
    return
  tokenizer = load_tokenizer(data.tokenizer_dir)
  for seq in map(int, args.reader_seq_lens):
    bench_reader(args, data, "static", seq)
    bench_reader(args, data, "dynamic", seq, dynamic_masking=True, tokenizer=tokenizer)
    bench_reader(
      args,
      data,
      "dynamic_wwm",
      seq,
      dynamic_masking=True,
      tokenizer=tokenizer,
      whole_word_mask=True,
    )


if __name__ == "__main__":
  main()
