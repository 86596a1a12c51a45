"""Creates pre-training TFRecords (google-research/bert's schema) from a text corpus.

One command makes the data of both phases of the curriculum (seq 128 with 20 predictions and
seq 512 with 80):

  python -m bert_jax.create_pretraining_data \
    --input_file=../shared/data/pretrain/bert_sample_text.txt --output_dir=/tmp/bert_data \
    --vocab_file=/path/to/vocab.txt --max_seq_length=128,512 --max_predictions_per_seq=20,80 \
    --dupe_factor=10

For the paper's ablations: ``--mask_rates=1,0,0`` (what a masked position becomes: [MASK] /
itself / a random token, Table 8) and ``--sentence_pairs=false`` (documents packed into single
segments without NSP pairs, for the no-NSP and left-to-right objectives, Table 5).
``--engine=fast`` makes the same kind of pairs several times faster with its own random stream.

Output: {output_dir}/seq_{L}/{train,eval}-NNNNN-of-NNNNN.tfrecord. The inputs and settings are
checked before anything is written (an --output_dir that is or contains an input file or the
vocabulary is refused: ``bert_jax.checkpoint.outputs``); a user error is one line
``create_pretraining_data: error: ...`` (status 2 for usage errors, 1 otherwise),
``--verbose_errors`` adds the traceback. See docs/pretraining_data.md.
"""

from bert_jax import interrupts

if __name__ == "__main__":  # a Ctrl-C during the imports below stops at once
  interrupts.stop_at_once_on_ctrl_c("create_pretraining_data")

import os

from absl import app, flags

from bert_jax import cli
from bert_jax.checkpoint.outputs import check_outputs, check_parent, input_paths
from bert_jax.data import generate

FLAGS = flags.FLAGS
flags.DEFINE_string(
  "input_file",
  None,
  "Comma-separated globs of input files, or for "
  "--input_format=tfds the dataset name (e.g. wikipedia/20230601.en).",
)
flags.DEFINE_enum(
  "input_format",
  "original",
  ["original", "text", "wiki", "tfds"],
  "original: a sentence per line, blank line between documents; text: plain "
  "text (rule-based sentence split); wiki: MediaWiki XML(.bz2); tfds: a TFDS "
  "text dataset under --tfds_data_dir.",
)
flags.DEFINE_string("output_dir", None, "Where seq_{L}/ folders of TFRecords are written.")
flags.DEFINE_string("vocab_file", None, "vocab.txt, SentencePiece .model, or a directory.")
flags.DEFINE_boolean("do_lower_case", None, "Lower-case input (default: the tokenizer's).")
flags.DEFINE_list("max_seq_length", ["128"], "One or more sequence lengths.")
flags.DEFINE_list("max_predictions_per_seq", ["20"], "Masked positions per length.")
flags.DEFINE_float("masked_lm_prob", 0.15, "Masked LM probability.")
flags.DEFINE_float("short_seq_prob", 0.1, "Probability of a shorter target length.")
flags.DEFINE_integer("dupe_factor", 10, "Passes over the data with different masks.")
flags.DEFINE_boolean("do_whole_word_mask", False, "Mask whole words, not single pieces.")
flags.DEFINE_list(
  "mask_rates",
  ["0.8", "0.1", "0.1"],
  "What a masked position becomes: mask,same,random probabilities summing to 1 ([MASK] / the "
  "token itself / a random token; the paper's Table 8 ablations, e.g. 1,0,0 or 0.8,0,0.2).",
)
flags.DEFINE_boolean(
  "sentence_pairs",
  True,
  "true: [CLS] A [SEP] B [SEP] pairs for next-sentence prediction (BERT). false: documents "
  "packed into full single segments [CLS] ... [SEP] (a [SEP] between documents), for "
  "objectives without NSP (the paper's 'No NSP' and left-to-right 'LTR & No NSP').",
)
flags.DEFINE_enum(
  "engine",
  "original",
  ["original", "fast"],
  "original: google-research/bert's random stream call for call (the same files as earlier "
  "releases for a seed); fast: the same procedure in bulk with numpy, its own random stream "
  "(several times faster). See docs/pretraining_data.md.",
)
flags.DEFINE_integer("random_seed", 12345, "Seed (per shard, so any worker count agrees).")
flags.DEFINE_float("eval_fraction", 0.0, "Fraction of documents held out into eval-* files.")
flags.DEFINE_integer(
  "doc_boundary",
  2,
  "text format: blank lines in a row that end a document (0: a file is a document).",
)
flags.DEFINE_integer("num_shards", 0, "Input shards (0: one per input file; tfds: 16).")
flags.DEFINE_integer("num_workers", 0, "Worker processes (0: all cores).")
flags.DEFINE_integer("process_index", 0, "This host's index (shards are split across hosts).")
flags.DEFINE_integer("process_count", 1, "Number of hosts.")
flags.DEFINE_boolean("overwrite", False, "Regenerate shards whose files exist.")
flags.DEFINE_string("tfds_data_dir", "", "TFDS data_dir (nothing is downloaded).")
flags.DEFINE_string("tfds_split", "train", "TFDS split.")
flags.DEFINE_string("tfds_text_key", "text", "TFDS text feature.")
flags.mark_flags_as_required(["input_file", "output_dir", "vocab_file"])


def _ints(name: str) -> tuple[int, ...]:
  try:
    return tuple(int(x) for x in FLAGS[name].value)
  except ValueError:
    raise app.UsageError(f"--{name} must be integers, got {','.join(FLAGS[name].value)}") from None


def _mask_rates() -> tuple[float, ...]:
  try:
    return tuple(float(x) for x in FLAGS.mask_rates)
  except ValueError:
    raise app.UsageError(
      f"--mask_rates must be three numbers mask,same,random, got {','.join(FLAGS.mask_rates)}"
    ) from None


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  inputs = {
    "--input_file": None if FLAGS.input_format == "tfds" else input_paths(FLAGS.input_file),
    "--tfds_data_dir": FLAGS.tfds_data_dir or None,
    "--vocab_file": FLAGS.vocab_file,
  }
  # A vocabulary folder (a workdir, a checkpoint) is read as a whole: nothing is written inside.
  sealed = ("--vocab_file",) if FLAGS.vocab_file and os.path.isdir(FLAGS.vocab_file) else ()
  check_outputs({"--output_dir": FLAGS.output_dir}, inputs, sealed=sealed)
  check_parent("--output_dir", FLAGS.output_dir, create=True)
  config = generate.GenerationConfig(
    tokenizer_path=FLAGS.vocab_file,
    do_lower_case=FLAGS.do_lower_case,
    input_format=FLAGS.input_format,
    doc_boundary=FLAGS.doc_boundary,
    max_seq_lengths=_ints("max_seq_length"),
    max_predictions_per_seq=_ints("max_predictions_per_seq"),
    masked_lm_prob=FLAGS.masked_lm_prob,
    short_seq_prob=FLAGS.short_seq_prob,
    dupe_factor=FLAGS.dupe_factor,
    whole_word_mask=FLAGS.do_whole_word_mask,
    random_seed=FLAGS.random_seed,
    eval_fraction=FLAGS.eval_fraction,
    mask_rates=_mask_rates(),
    sentence_pairs=FLAGS.sentence_pairs,
    engine=FLAGS.engine,
  )
  result = generate.generate(
    FLAGS.input_file,
    FLAGS.output_dir,
    config,
    num_shards=FLAGS.num_shards,
    num_workers=FLAGS.num_workers,
    process_index=FLAGS.process_index,
    process_count=FLAGS.process_count,
    overwrite=FLAGS.overwrite,
    tfds_split=FLAGS.tfds_split,
    tfds_data_dir=FLAGS.tfds_data_dir,
    tfds_text_key=FLAGS.tfds_text_key,
  )
  print(generate.summary_line(result["stats"]))


def run():
  """Console-script entry (bert-jax-create-pretraining-data)."""
  cli.run(main, prog="create_pretraining_data")


if __name__ == "__main__":
  run()
