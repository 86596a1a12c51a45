"""The WordPiece vocabulary builder is deterministic: the same bytes from two processes with
different hash seeds, the BPE of a brute-force reference (every pair recounted at every merge),
close to tokenizers' WordPieceTrainer, and the main pre-training command run twice from scratch
gives the same vocabulary, TFRecords and losses."""

import collections
import glob
import os
import random
import subprocess
import sys

import pytest
from conftest import subprocess_env_for

from bert_jax.tokenize import base
from bert_jax.tokenize.vocab import build_wordpiece_vocab
from bert_jax.tokenize.wordpiece_trainer import count_words, train_wordpiece

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIALS = list(base.SPECIAL_TOKENS)


def brute_force_wordpiece(word_counts, vocab_size, min_frequency=0, limit_alphabet=None):
  """WordPiece-flavoured BPE the slow, obvious way: all pairs recounted from the current
  segmentation before every merge. Ties: the pair of earlier vocabulary entries."""
  char_counts = collections.Counter()
  for word, n in word_counts.items():
    for char in word:
      char_counts[char] += n
  ranked = sorted(char_counts, key=lambda c: (-char_counts[c], c))
  chars = sorted(ranked if limit_alphabet is None else ranked[:limit_alphabet])
  words = []
  for word, n in sorted(word_counts.items()):
    kept = [c for c in word if c in chars]
    if kept:
      words.append(([kept[0]] + ["##" + c for c in kept[1:]], n))
  vocab = SPECIALS + chars + sorted({s for symbols, _ in words for s in symbols[1:]})
  while len(vocab) < vocab_size:
    counts = collections.Counter()
    for symbols, n in words:
      for pair in zip(symbols, symbols[1:]):
        counts[pair] += n
    if not counts:
      break
    best = min(counts, key=lambda p: (-counts[p], vocab.index(p[0]), vocab.index(p[1])))
    if counts[best] < max(min_frequency, 1):
      break
    first, second = best
    new = first + second.removeprefix("##")
    if new not in vocab:
      vocab.append(new)
    for k, (symbols, n) in enumerate(words):
      out, i = [], 0
      while i < len(symbols):
        if tuple(symbols[i : i + 2]) == best:
          out.append(new)
          i += 2
        else:
          out.append(symbols[i])
          i += 1
      words[k] = (out, n)
  return vocab


def _random_word_counts(seed, n_words=60, letters="abcde"):
  rng = random.Random(seed)
  counts = collections.Counter()
  for _ in range(n_words):
    word = "".join(rng.choice(letters) for _ in range(rng.randint(1, 8)))
    counts[word] += rng.randint(1, 5)
  return dict(counts)


@pytest.mark.parametrize(
  "seed, vocab_size, min_frequency, limit_alphabet",
  [(0, 60, 0, None), (1, 80, 2, None), (2, 200, 1, None), (3, 50, 3, 3), (4, 120, 2, 4)],
)
def test_trainer_matches_brute_force(seed, vocab_size, min_frequency, limit_alphabet):
  word_counts = _random_word_counts(seed)
  ours = train_wordpiece(
    word_counts,
    vocab_size,
    special_tokens=SPECIALS,
    min_frequency=min_frequency,
    limit_alphabet=limit_alphabet,
  )
  assert ours == brute_force_wordpiece(word_counts, vocab_size, min_frequency, limit_alphabet)


def test_repeated_symbols():
  # "aaaa" and "baaa": (##a, ##a) merges left to right without overlap.
  word_counts = {"aaaa": 5, "baaa": 3, "abc": 4, "xbc": 4, "abd": 3, "ab": 2}
  ours = train_wordpiece(word_counts, 100, special_tokens=SPECIALS)
  assert ours == brute_force_wordpiece(word_counts, 100)
  assert len(ours) == len(set(ours))


def test_build_matches_brute_force_end_to_end(tmp_path):
  # Lower-case letters and spaces only: BERT's pipeline splits exactly at the spaces.
  rng = random.Random(7)
  lines = [
    " ".join("".join(rng.choice("abcdef") for _ in range(rng.randint(1, 7))) for _ in range(8))
    for _ in range(40)
  ]
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
  build_wordpiece_vocab([corpus], tmp_path / "vocab.txt", 150, min_frequency=2)
  built = (tmp_path / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
  word_counts = collections.Counter(w for line in lines for w in line.split())
  assert built == brute_force_wordpiece(word_counts, 150, min_frequency=2, limit_alphabet=1000)


def test_word_counts_piece_by_piece_equal_line_by_line():
  """count_words splits each distinct whitespace piece once; BERT's pipeline on every whole line
  gives the same counts, with every kind of space and control between and inside words."""
  from bert_jax.tokenize.vocab import _word_splitter
  from bert_jax.tokenize.wordpiece import WordPieceTokenizer

  rng = random.Random(3)
  atoms = ["Caf\u00e9", "na\u0131ve", "e\u0301", "\u4e2d\u6587", "don't", "U.S.A.", "x"]
  gaps = [" ", "\t", "\xa0", "\u3000", "\x1c", "\x0b", "\x85", "\u2028", "\x00", "\u200b", ""]
  lines = ["".join(rng.choice(atoms) + rng.choice(gaps) for _ in range(12)) for _ in range(300)]
  for do_lower_case in (True, False):
    shell = WordPieceTokenizer(SPECIALS, do_lower_case=do_lower_case)
    split = _word_splitter(shell._rust)
    rust = shell._rust
    expected = collections.Counter()
    for line in lines:
      normalized = rust.normalizer.normalize_str(line)
      expected.update(w for w, _ in rust.pre_tokenizer.pre_tokenize_str(normalized))
    assert count_words(lines, split) == dict(expected)


def _small_corpus(shared_data):
  return [
    str(shared_data / "pretrain/bert_sample_text.txt"),
    str(shared_data / "pretrain/shakespeare/hamlet_gut.txt"),
  ]


def test_two_processes_write_the_same_bytes(shared_data, tmp_path):
  files = _small_corpus(shared_data)
  procs = []
  for seed in ("1", "2"):
    out = tmp_path / f"seed{seed}" / "vocab.txt"
    code = (
      "import sys; from bert_jax.tokenize.vocab import build_wordpiece_vocab; "
      "build_wordpiece_vocab(sys.argv[1:-1], sys.argv[-1], 3000)"
    )
    env = {**subprocess_env_for(1), "PYTHONHASHSEED": seed}
    cmd = [sys.executable, "-c", code, *files, str(out)]
    procs.append((out, subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE)))
  for _, proc in procs:
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-2000:]
  first, second = (out.read_bytes() for out, _ in procs)
  assert first == second and len(first.split(b"\n")) == 3001


def test_close_to_tokenizers_trainer(shared_data, tmp_path):
  files = _small_corpus(shared_data)
  ours = build_wordpiece_vocab(files, tmp_path / "ours", 3000).get_vocab()
  theirs = build_wordpiece_vocab(files, tmp_path / "hf", 3000, trainer="tokenizers").get_vocab()
  assert len(ours) == len(theirs) == 3000

  def initial(vocab):  # single characters, with and without "##": no tie decides these
    return {t for t in vocab if len(t.removeprefix("##")) == 1}

  assert initial(ours) == initial(theirs)
  # The rest differ only where pieces of equal count are ordered differently.
  assert len(set(ours) & set(theirs)) / len(ours) > 0.98
  with pytest.raises(ValueError, match="trainer must be one of"):
    build_wordpiece_vocab(files, tmp_path / "bad", 3000, trainer="fastest")


def _pretrain_cmd(workdir, *overrides):
  """python -m bert_jax.pretrain --config configs/pretrain.py:tiny --workdir W, overridden."""
  config = f"{REPO}/configs/pretrain.py:tiny"
  return [
    sys.executable,
    "-m",
    "bert_jax.pretrain",
    "--config",
    config,
    "--workdir",
    str(workdir),
    *overrides,
  ]


def _files(directory, pattern):
  paths = sorted(glob.glob(os.path.join(directory, "**", pattern), recursive=True))
  return {os.path.relpath(p, directory): open(p, "rb").read() for p in paths}


def test_built_in_corpus_is_the_same_from_two_processes(tmp_path):
  """The built-in corpus at a small size, prepared by two processes with different hash seeds:
  the same vocabulary and TFRecords (what bert_jax.pretrain reads when no data is set)."""
  code = (
    "import sys; from bert_jax.data.default_corpus import prepare_default_data; "
    "prepare_default_data(sys.argv[1], vocab_size=2000, max_documents=40, dupe_factor=1, "
    "eval_fraction=0.1, num_workers=1)"
  )
  procs = []
  for seed in ("1", "2"):
    env = {**subprocess_env_for(1), "PYTHONHASHSEED": seed}
    cmd = [sys.executable, "-c", code, str(tmp_path / seed)]
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE))
  for proc in procs:
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-2000:]
  vocab = [_files(tmp_path / seed, "vocab.txt") for seed in ("1", "2")]
  records = [_files(tmp_path / seed, "*.tfrecord") for seed in ("1", "2")]
  assert vocab[0] and vocab[0] == vocab[1]
  assert len(records[0]) >= 2 and records[0] == records[1]


def _losses_by_step(workdir):
  import tensorflow as tf

  out = {}
  for path in glob.glob(os.path.join(workdir, "tensorboard", "events.*")):
    for e in tf.compat.v1.train.summary_iterator(path):
      for v in e.summary.value:
        if v.tag == "train/loss":
          out[e.step] = v.simple_value
  return out


@pytest.mark.slow
def test_main_command_twice_is_identical(tmp_path):
  """README's main command (tiny, built-in corpus, full size), shortened to 4 steps at seq 128,
  in two fresh workdirs by two processes with different hash seeds."""
  overrides = (
    "--config.num_train_steps=4",
    "--config.phase2.fraction=0",
    "--config.logging.log_every_steps=1",
    "--config.max_eval_steps=1",
  )
  procs = []
  for seed in ("1", "2"):
    env = {**subprocess_env_for(1), "PYTHONHASHSEED": seed}
    cmd = _pretrain_cmd(tmp_path / seed, *overrides)
    log = open(tmp_path / f"{seed}.log", "w")
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
  for seed, proc in zip(("1", "2"), procs):
    assert proc.wait(timeout=1200) == 0, (tmp_path / f"{seed}.log").read_text()[-3000:]
  one, two = tmp_path / "1", tmp_path / "2"
  assert (one / "vocab.txt").read_bytes() == (two / "vocab.txt").read_bytes()
  assert len((one / "vocab.txt").read_text(encoding="utf-8").split("\n")) == 8001
  records = _files(one / "default_corpus", "*.tfrecord")
  assert records and records == _files(two / "default_corpus", "*.tfrecord")
  losses = _losses_by_step(one)
  assert sorted(losses) == [1, 2, 3, 4] and losses == _losses_by_step(two)
