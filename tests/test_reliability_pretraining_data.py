"""create_pretraining_data and build_vocab under failures: nothing written before the inputs
are checked, no temporary file left by a failed write, an empty corpus refused."""

from __future__ import annotations

import errno
import filecmp
import glob
import os
import subprocess
import sys

import pytest

from bert_jax.data import generate, tfrecord, tfrecord_writer
from bert_jax.tokenize import vocab


def _config(tokenizer_path, **kw):
  base = dict(
    tokenizer_path=str(tokenizer_path),
    do_lower_case=True,
    max_seq_lengths=(128,),
    max_predictions_per_seq=(20,),
    dupe_factor=1,
    random_seed=7,
    input_format="text",
  )
  base.update(kw)
  return generate.GenerationConfig(**base)


@pytest.fixture
def inputs(shared_data):
  plays = sorted(glob.glob(str(shared_data / "pretrain" / "shakespeare" / "[a-c]*_gut.txt")))[:2]
  return plays + [str(shared_data / "pretrain" / "bert_sample_text.txt")]


def _all_files(root):
  return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_missing_vocab_writes_nothing_and_the_corrected_rerun_succeeds(
  tmp_path, inputs, minilm_dir
):
  out = tmp_path / "data"
  with pytest.raises(ValueError, match="missing_vocab.txt"):
    generate.generate(
      inputs, str(out), _config(tmp_path / "missing_vocab.txt"), num_workers=1, progress=False
    )
  assert not out.exists() or not _all_files(out)
  result = generate.generate(
    inputs, str(out), _config(minilm_dir / "vocab.txt"), num_workers=1, progress=False
  )
  assert result["stats"]["shards"] == len(inputs)
  assert len(glob.glob(result["files"][128]["train"])) == len(inputs)


def test_output_dir_that_is_a_file_writes_nothing(tmp_path, inputs, minilm_dir):
  out = tmp_path / "data"
  out.write_text("a file")
  with pytest.raises(NotADirectoryError, match="is a file"):
    generate.generate(
      inputs, str(out), _config(minilm_dir / "vocab.txt"), num_workers=1, progress=False
    )
  assert out.read_text() == "a file"


class _DiskFullWrites:
  """write_records that, on call ``fail_at``, writes part of its file, then fails as a full
  disk does."""

  def __init__(self, real, fail_at=3):
    # The files come train, eval (empty: eval_fraction 0) per shard: 3 is shard 1's train.
    self.real, self.fail_at, self.calls = real, fail_at, 0

  def __call__(self, path, records):
    self.calls += 1
    if self.calls != self.fail_at:
      return self.real(path, records)
    records = list(records)
    self.real(path, records[: len(records) // 2])
    raise OSError(errno.ENOSPC, "No space left on device")


def test_failed_shard_write_leaves_no_temp_file_and_the_rerun_matches_a_clean_run(
  tmp_path, inputs, minilm_dir, monkeypatch
):
  config = _config(minilm_dir / "vocab.txt")
  failing = _DiskFullWrites(tfrecord_writer.write_records)
  monkeypatch.setattr(tfrecord_writer, "write_records", failing)
  out = tmp_path / "data"
  with pytest.raises(OSError, match="No space left"):
    generate.generate(inputs, str(out), config, num_workers=1, progress=False)
  assert failing.calls == 3
  assert not [f for f in _all_files(out) if ".tmp" in f], _all_files(out)
  # What a reader's glob sees is only complete shards.
  for path in glob.glob(str(out / "seq_128" / "train-*")):
    tfrecord.check_record_framing(path)
  monkeypatch.undo()
  generate.generate(inputs, str(out), config, num_workers=1, progress=False)
  generate.generate(inputs, str(tmp_path / "clean"), config, num_workers=1, progress=False)
  names = _all_files(tmp_path / "clean")
  assert _all_files(out) == names
  _, mismatch, errors = filecmp.cmpfiles(out, tmp_path / "clean", names, shallow=False)
  assert not mismatch and not errors


def test_temp_files_of_a_killed_run_are_removed_and_never_globbed(tmp_path, inputs, minilm_dir):
  config = _config(minilm_dir / "vocab.txt")
  out = tmp_path / "data"
  first = generate.output_path(str(out), 128, "train", 0, len(inputs))
  os.makedirs(os.path.dirname(first))
  stale = generate.temp_path(first) + "99999"  # as a killed run with another pid leaves it
  open(stale, "wb").write(b"partial")
  assert glob.glob(str(out / "seq_128" / "train-*")) == []
  assert glob.glob(str(out / "seq_128" / "*.tfrecord")) == []
  generate.generate(inputs, str(out), config, num_workers=1, progress=False)
  assert not os.path.exists(stale)
  assert not [f for f in _all_files(out) if ".tmp" in f]


def test_cli_missing_vocab_is_one_line(tmp_path, inputs, subprocess_env):
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.create_pretraining_data",
      f"--input_file={inputs[-1]}",
      f"--output_dir={tmp_path / 'data'}",
      f"--vocab_file={tmp_path / 'nope.txt'}",
    ],
    capture_output=True,
    text=True,
    env=subprocess_env(1),
    timeout=300,
  )
  assert proc.returncode == 1, proc.stderr
  assert "Traceback" not in proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("create_pretraining_data: error: ") and "nope.txt" in last
  assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
def test_build_vocab_on_an_empty_corpus_is_refused(tmp_path, kind):
  corpus = tmp_path / "empty.txt"
  corpus.write_text("\n  \n\n")
  out = tmp_path / "vocab"
  with pytest.raises(ValueError, match=r"empty\.txt.*no non-blank line"):
    vocab.build_vocabulary(str(corpus), str(out), kind=kind, vocab_size=100)
  assert not out.exists()


def test_build_vocab_cli_empty_corpus_is_one_line(tmp_path):
  corpus = tmp_path / "empty.txt"
  corpus.write_text("")
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bert_jax.build_vocab",
      f"--input={corpus}",
      f"--output={tmp_path / 'vocab'}",
      "--vocab_size=100",
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1, proc.stderr
  assert "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("build_vocab: error: the corpus")
