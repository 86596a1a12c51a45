"""Corpus readers (original format, plain text, MediaWiki dumps, TFDS) and bad input."""

import bz2
import glob
import re

import pytest
import tensorflow as tf

from bert_jax.data import corpus, generate, sentences


def test_sentence_rule():
  text = (
    "Mr. Smith met Dr. J. R. Jones at 4 p.m. on Jan. 5. They talked about e.g. pi, which "
    'is 3.14 or so! Did it help? "Yes," he said. (It did.) The end'
  )
  assert sentences.split_sentences(text) == [
    "Mr. Smith met Dr. J. R. Jones at 4 p.m. on Jan. 5.",
    "They talked about e.g. pi, which is 3.14 or so!",
    "Did it help?",
    '"Yes," he said.',
    "(It did.)",
    "The end",
  ]
  assert sentences.split_sentences("  \n ") == []
  assert sentences.split_sentences("one line\nwrapped. Two") == ["one line wrapped.", "Two"]


def test_original_format(shared_data):
  path = shared_data / "pretrain" / "bert_sample_text.txt"
  stats = {}
  docs = list(corpus.read_original_format(str(path), stats))
  # Independent reference: the file's blank-line-separated blocks, one sentence per line.
  blocks = [
    b.strip().split("\n") for b in path.read_text(encoding="utf-8").split("\n\n") if b.strip()
  ]
  assert docs == [[line.strip() for line in b] for b in blocks]
  assert len(docs) == 3 and not stats


def test_plain_text_paragraphs_and_documents(tmp_path):
  path = tmp_path / "plain.txt"
  path.write_text(
    "First para line one\nline two. Second sentence.\n\nSecond para.\n\n\n"
    "Doc two para.\n\n\n\n\nDoc three.\n",
    encoding="utf-8",
  )
  docs = list(corpus.read_plain_text(str(path), {}, doc_boundary=2))
  assert docs == [
    ["First para line one line two.", "Second sentence.", "Second para."],
    ["Doc two para."],
    ["Doc three."],
  ]
  whole = list(corpus.read_plain_text(str(path), {}, doc_boundary=0))
  assert len(whole) == 1 and len(whole[0]) == 5


def test_wiki_dump(shared_data):
  path = sorted(glob.glob(str(shared_data / "pretrain" / "wiki" / "*.bz2")))[0]
  # Independent count: <page> elements minus redirects (the README says 106 articles).
  raw = bz2.open(path, "rt", encoding="utf-8").read()
  articles = raw.count("<page>") - raw.count("<redirect ")
  from bert_jax.data import wikitext

  assert sum(1 for _ in wikitext.iter_wiki_articles(path)) == articles == 106
  docs = list(corpus.read_wiki_dump(path, {}))
  assert len(docs) >= 100  # Pure lists/disambiguation leftovers may have no prose.
  text = " ".join(s for d in docs for s in d)
  assert docs[0][0].startswith("Anarchism is a political philosophy")
  for markup in ("[[", "]]", "{{", "}}", "<ref", "'''", "&lt;", "==", "[http"):
    assert markup not in text, markup


def test_tfds_text_dataset(tmp_path, minilm_dir):
  import tensorflow_datasets as tfds

  documents = [
    f"Title {i}\nThis is article number {i}. It has a second sentence.\n"
    f"A new paragraph of article {i} starts here. It ends here."
    for i in range(12)
  ]

  class BertJaxDataTinyText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict(
          {"text": tfds.features.Text(), "title": tfds.features.Text()}
        ),
      )

    def _split_generators(self, dl_manager):
      del dl_manager
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i, text in enumerate(documents):
        yield i, {"text": text, "title": f"t{i}"}

  data_dir = str(tmp_path / "tfds")
  BertJaxDataTinyText(data_dir=data_dir).download_and_prepare()
  shards = corpus.make_input_shards(
    "bert_jax_data_tiny_text", "tfds", num_shards=3, tfds_data_dir=data_dir
  )
  read = [d for s in shards for d in corpus.read_shard_documents(s, "tfds", {})]
  assert len(read) == 12
  assert sorted(read) == sorted(
    [
      [
        f"Title {i}",
        f"This is article number {i}.",
        "It has a second sentence.",
        f"A new paragraph of article {i} starts here.",
        "It ends here.",
      ]
      for i in range(12)
    ]
  )
  with pytest.raises(ValueError, match="no feature 'body'"):
    list(
      corpus.read_shard_documents(
        corpus.make_input_shards(
          "bert_jax_data_tiny_text",
          "tfds",
          num_shards=1,
          tfds_data_dir=data_dir,
          tfds_text_key="body",
        )[0],
        "tfds",
        {},
      )
    )
  config = generate.GenerationConfig(
    tokenizer_path=str(minilm_dir / "vocab.txt"), input_format="tfds", dupe_factor=2
  )
  result = generate.generate(
    "bert_jax_data_tiny_text",
    str(tmp_path / "out"),
    config,
    num_shards=2,
    num_workers=1,
    tfds_data_dir=data_dir,
    progress=False,
  )
  assert result["stats"]["documents"] == 12
  n = sum(1 for _ in tf.data.TFRecordDataset(glob.glob(result["files"][128]["train"])))
  assert n == result["stats"]["per_length"]["128"]["train_examples"] > 0


def test_globs_and_shard_grouping(shared_data):
  pattern = str(shared_data / "pretrain" / "shakespeare" / "*_gut.txt")
  files = corpus.expand_patterns(pattern + "," + pattern)
  assert len(files) == 42 and files == sorted(files)
  shards = corpus.make_input_shards(pattern, "text", num_shards=5)
  assert len(shards) == 5 and sorted(f for s in shards for f in s.files) == files
  with pytest.raises(ValueError, match="matches no file"):
    corpus.make_input_shards(str(shared_data / "nope-*.txt"))


def test_bad_input_is_skipped_with_counts_or_named(tmp_path, minilm_dir):
  config = generate.GenerationConfig(
    tokenizer_path=str(minilm_dir / "vocab.txt"),
    dupe_factor=3,
    max_seq_lengths=(64,),
    max_predictions_per_seq=(10,),
  )
  good = tmp_path / "good.txt"
  long_line = " ".join(f"word{i}" for i in range(3000))
  good.write_bytes(
    b"Only one sentence here.\n\n"  # a one-sentence document
    + long_line.encode()
    + b"\nAfter the long line.\n\n"  # a line far over max length
    + b"Bad bytes \xff\xfe here.\nA fine line.\nAnother fine line.\n\n"  # one non-UTF-8 line
    + b"\n\n\n"
  )
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  result = generate.generate(
    [str(good), str(empty)], str(tmp_path / "out"), config, num_workers=1, progress=False
  )
  stats = result["stats"]
  assert stats["lines_skipped_non_utf8"] == 1
  assert stats["documents"] == 3 and stats["one_sentence_documents"] == 1
  records = list(tf.data.TFRecordDataset(sorted(glob.glob(result["files"][64]["train"]))))
  assert len(records) == stats["per_length"]["64"]["train_examples"] > 0
  for r in records:
    ex = tf.io.parse_single_example(r, {"input_mask": tf.io.FixedLenFeature([64], tf.int64)})
    assert int(ex["input_mask"].numpy().sum()) <= 64
  # The empty input gives an empty (valid) shard, not a missing one.
  empty_out = [
    p for p in glob.glob(result["files"][64]["train"]) if "00000-of" in p
  ]  # sorted first
  assert len(empty_out) == 1 and sum(1 for _ in tf.data.TFRecordDataset(empty_out)) == 0

  binary = tmp_path / "data.bin"
  binary.write_bytes(b"line one\nline\x00two\n")
  with pytest.raises(ValueError, match=re.escape(f"{binary}:2") + ".*looks binary"):
    generate.generate(
      [str(binary)], str(tmp_path / "out_bin"), config, num_workers=1, progress=False
    )


def test_bad_config_is_named(tmp_path, minilm_dir):
  with pytest.raises(ValueError, match="same number of entries"):
    generate.GenerationConfig(
      tokenizer_path="x", max_seq_lengths=(128, 512), max_predictions_per_seq=(20,)
    )
  with pytest.raises(ValueError, match="input_format"):
    corpus.make_input_shards("x", "pdf")
