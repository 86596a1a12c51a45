"""TFRecord files written without TensorFlow against TensorFlow's own writer and reader."""

import random
import subprocess
import sys

import tensorflow as tf

from bert_jax.data import tfrecord, tfrecord_writer


def _records():
  rng = random.Random(0)
  out = [b"", b"x", bytes(range(256)) * 3]
  out += [rng.randbytes(rng.randint(0, 2000)) for _ in range(300)]
  out.append(rng.randbytes(5 << 20))  # larger than a write chunk
  return out


def test_bytes_equal_tensorflow_writer(tmp_path):
  records = _records()
  theirs = tmp_path / "tf.tfrecord"
  with tf.io.TFRecordWriter(str(theirs)) as writer:
    for r in records:
      writer.write(r)
  ours = tmp_path / "ours.tfrecord"
  tfrecord_writer.write_records(str(ours), iter(records))  # any iterable
  assert ours.read_bytes() == theirs.read_bytes()


def test_tensorflow_reads_every_record_back(tmp_path):
  records = _records()[:50]
  path = tmp_path / "ours.tfrecord"
  tfrecord_writer.write_records(str(path), records)
  assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == records


def test_no_records_is_an_empty_file_and_rewrites_replace(tmp_path):
  path = tmp_path / "x.tfrecord"
  tfrecord_writer.write_records(str(path), [b"abc"])
  tfrecord_writer.write_records(str(path), [])
  assert path.read_bytes() == b""
  assert list(tf.data.TFRecordDataset(str(path))) == []


def test_generation_imports_no_tensorflow_and_tensorflow_reads_its_files(
  tmp_path, shared_data, minilm_dir, subprocess_env
):
  """The CLI's process (one worker, local files) never imports TensorFlow (6-7 s of start-up);
  TensorFlow parses every record it wrote."""
  out = tmp_path / "data"
  code = (
    "import sys\n"
    "from absl import app\n"
    "from bert_jax import create_pretraining_data as c\n"
    "sys.argv = ['c', f'--input_file={sys.argv[1]}', f'--output_dir={sys.argv[2]}',\n"
    "  f'--vocab_file={sys.argv[3]}', '--dupe_factor=1', '--num_workers=1']\n"
    "try:\n"
    "  app.run(c.main)\n"
    "except SystemExit:\n"
    "  pass\n"
    "print('TF_IMPORTED', 'tensorflow' in sys.modules)\n"
  )
  proc = subprocess.run(
    [
      sys.executable,
      "-c",
      code,
      str(shared_data / "pretrain" / "bert_sample_text.txt"),
      str(out),
      str(minilm_dir / "vocab.txt"),
    ],
    env=subprocess_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert "TF_IMPORTED False" in proc.stdout, proc.stdout + proc.stderr
  files = sorted((out / "seq_128").glob("train-*.tfrecord"))
  assert files
  parsed = tfrecord.parse_batch(
    tf.stack(list(tf.data.TFRecordDataset([str(f) for f in files]))), 128, 20
  )
  assert parsed["input_ids"].shape[0] > 10 and parsed["input_ids"].shape[1] == 128
