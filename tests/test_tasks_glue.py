"""GLUE: metrics against scikit-learn/scipy, TSV and TFDS readers, packing, bad input."""

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from bert_jax.tasks import create_task
from bert_jax.tasks import metrics as M
from bert_jax.tasks.glue.data import SPECS, GlueInputError, read_tfds, read_tsv
from bert_jax.tasks.glue.features import encode_texts
from configs import glue


# --- metrics --------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classification_metrics_match_sklearn(seed):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 2, 500)
  p = np.where(rng.random(500) < 0.7, y, 1 - y)
  assert M.accuracy(y, p) == pytest.approx(sklearn.metrics.accuracy_score(y, p), abs=1e-12)
  assert M.f1_binary(y, p) == pytest.approx(sklearn.metrics.f1_score(y, p), abs=1e-12)
  assert M.matthews_corrcoef(y, p) == pytest.approx(
    sklearn.metrics.matthews_corrcoef(y, p), abs=1e-12
  )
  y3, p3 = rng.integers(0, 3, 300), rng.integers(0, 3, 300)
  assert M.matthews_corrcoef(y3, p3) == pytest.approx(
    sklearn.metrics.matthews_corrcoef(y3, p3), abs=1e-12
  )


def test_degenerate_metrics_match_sklearn():
  y = np.array([1, 0, 1, 1])
  const = np.ones(4, int)
  assert M.matthews_corrcoef(y, const) == sklearn.metrics.matthews_corrcoef(y, const) == 0.0
  zeros = np.zeros(4, int)
  assert M.f1_binary(y, zeros) == sklearn.metrics.f1_score(y, zeros, zero_division=0) == 0.0


@pytest.mark.parametrize("seed", [0, 1])
def test_correlations_match_scipy(seed):
  rng = np.random.default_rng(seed)
  x = np.round(rng.uniform(0, 5, 400), 1)  # many ties, as STS-B's gold scores
  y = x + rng.normal(0, 1.0, 400)
  y[:50] = np.round(y[:50])  # ties in the predictions too
  assert M.pearson(x, y) == pytest.approx(scipy.stats.pearsonr(x, y)[0], abs=1e-10)
  assert M.spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y)[0], abs=1e-10)


# --- TSV readers on the shared data ---------------------------------------------------------
@pytest.mark.parametrize(
  "name,split_file,labelled,count",
  [
    ("cola", "train.tsv", True, 8551),
    ("cola", "dev.tsv", True, 1043),
    ("cola", "test.tsv", False, 1063),
    ("sst2", "dev.tsv", True, 872),
    ("mrpc", "train.tsv", True, 3667),
    ("mrpc", "test.tsv", False, 1725),
    ("stsb", "dev.tsv", True, 1500),
    ("rte", "dev.tsv", True, 277),
    ("wnli", "train.tsv", True, 635),
    ("wnli", "test.tsv", False, 146),
  ],
)
def test_shared_glue_tsvs(shared_data, name, split_file, labelled, count):
  spec = SPECS[name]
  examples, skipped = read_tsv(
    spec, str(shared_data / "glue" / spec.dir_name / split_file), labelled
  )
  assert (len(examples), skipped) == (count, 0)
  assert all(e.text_a for e in examples)
  assert all((e.text_b is not None) == (spec.text_b is not None) for e in examples)
  if labelled and not spec.is_regression:
    assert {e.label for e in examples} == set(range(len(spec.labels)))
  if not labelled:
    assert [e.index for e in examples[:3]] == ["0", "1", "2"]


def test_cola_headerless_and_mrpc_bom(shared_data):
  cola, _ = read_tsv(SPECS["cola"], str(shared_data / "glue/CoLA/train.tsv"), True)
  first = (shared_data / "glue/CoLA/train.tsv").read_text().split("\n")[0].split("\t")
  assert (cola[0].text_a, cola[0].label) == (first[3], int(first[1]))  # no header row eaten
  mrpc, _ = read_tsv(SPECS["mrpc"], str(shared_data / "glue/MRPC/train.tsv"), True)
  assert mrpc[0].label == 1 and mrpc[0].text_a.startswith("Amrozi accused")


# --- official layouts not in the shared data (MNLI, QQP, QNLI) -------------------------------
MNLI_HEADER = (
  "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
  "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"
)


def _write_glue(root, files):
  for rel, text in files.items():
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")


def _mnli_dir(root):
  row = lambda i, a, b: f"{i}\t1\t1a\tfiction\t( a )\t( b )\t(ROOT a)\t(ROOT b)\t{a}\t{b}"
  _write_glue(
    root,
    {
      "MNLI/train.tsv": f"{MNLI_HEADER}\tlabel1\tgold_label\n"
      + "\n".join(
        row(i, f"premise {i}", f"hypothesis {i}") + "\t" + l + "\t" + l
        for i, l in enumerate(["neutral", "entailment", "contradiction"])
      )
      + "\n",
      "MNLI/dev_matched.tsv": f"{MNLI_HEADER}\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\t"
      "gold_label\n" + row(0, "a cat", "an animal") + "\tentailment" * 6 + "\n",
      "MNLI/dev_mismatched.tsv": f"{MNLI_HEADER}\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\t"
      "gold_label\n" + row(0, "a dog", "no dog") + "\tcontradiction" * 6 + "\n",
      "MNLI/test_matched.tsv": f"{MNLI_HEADER}\n" + row(0, "x", "y") + "\n" + row(1, "u", "v"),
      "MNLI/test_mismatched.tsv": f"{MNLI_HEADER}\n" + row(5, "x", "y") + "\n",
      "MNLI/diagnostic/diagnostic.tsv": "index\tsentence1\tsentence2\n0\tThe cat sat.\tA cat "
      "sat.\n",
      "QQP/dev.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
      "1\t1\t2\tHow are you?\tHow do you do?\t1\n2\t3\t4\tWhy?\tWhen?\t0\n",
      "QQP/test.tsv": "id\tquestion1\tquestion2\n0\tWhat?\tWho?\n",
      "QNLI/dev.tsv": "index\tquestion\tsentence\tlabel\n0\tWho?\tHe did.\tentailment\n",
    },
  )


def _config(task, data_dir, **kw):
  """The task's real config (every key with its default) with the test's settings."""
  c = glue.get_config(task)
  settings = dict(data_dir=str(data_dir), max_seq_length=32)
  settings.update(kw)
  for key, value in settings.items():
    setattr(c, key, value)
  return c


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
  from bert_jax.tokenize import load_tokenizer

  return load_tokenizer(minilm_dir)


def test_official_layouts_mnli_qqp_qnli(tmp_path, tokenizer):
  _mnli_dir(tmp_path)
  mnli = create_task(_config("mnli", tmp_path), tokenizer)
  assert mnli.eval_splits == ("dev_matched", "dev_mismatched")
  assert mnli.test_splits == ("test_matched", "test_mismatched", "ax")
  train = mnli.load_split("train")
  assert train.arrays["label"].tolist() == [2, 1, 0]  # contradiction, entailment, neutral
  assert mnli.load_split("dev_mismatched").arrays["label"].tolist() == [0]
  paths = []
  for split, n in (("test_matched", 2), ("test_mismatched", 1), ("ax", 1)):
    data = mnli.load_split(split)
    assert not data.has_labels and data.num_rows == n
    metrics, preds = mnli.evaluate(data, {"logits": np.eye(3)[np.arange(n) % 3]})
    assert metrics == {}
    paths += mnli.write_predictions(data, preds, str(tmp_path / "out"))
  assert [p.split("/")[-1] for p in paths] == ["MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"]
  assert (tmp_path / "out/MNLI-m.tsv").read_text() == (
    "index\tprediction\n0\tcontradiction\n1\tentailment\n"
  )
  assert (tmp_path / "out/MNLI-mm.tsv").read_text() == "index\tprediction\n5\tcontradiction\n"
  qqp = create_task(_config("qqp", tmp_path), tokenizer)
  dev = qqp.load_split("dev")
  assert dev.arrays["label"].tolist() == [1, 0]
  metrics, _ = qqp.evaluate(dev, {"logits": np.array([[0.0, 1.0], [0.0, 1.0]])})
  assert metrics["accuracy"] == 0.5 and metrics["f1"] == pytest.approx(2 / 3)
  assert qqp.load_split("test").examples[0].text_b == "Who?"
  qnli = create_task(_config("qnli", tmp_path), tokenizer)
  assert qnli.load_split("dev").arrays["label"].tolist() == [0]


def test_stsb_regression_and_submission(shared_data, tmp_path, tokenizer):
  task = create_task(_config("stsb", shared_data / "glue", max_eval_examples=50), tokenizer)
  assert task.num_labels == 1 and task.labels == []
  dev = task.load_split("dev")
  gold = dev.arrays["label"]
  metrics, preds = task.evaluate(dev, {"logits": (gold + np.linspace(0, 1, 50))[:, None]})
  assert metrics["pearson"] == pytest.approx(scipy.stats.pearsonr(gold, preds)[0], abs=1e-6)
  assert metrics["spearman"] == pytest.approx(scipy.stats.spearmanr(gold, preds)[0], abs=1e-6)
  test = task.load_split("test")
  _, p = task.evaluate(test, {"logits": np.full((test.num_rows, 1), 2.5)})
  (path,) = task.write_predictions(test, p, str(tmp_path))
  lines = open(path).read().splitlines()
  assert path.endswith("STS-B.tsv") and lines[:2] == ["index\tprediction", "0\t2.500"]
  assert len(lines) == 1 + 50  # max_eval_examples slices test splits too


# --- packing --------------------------------------------------------------------------------
def _original_truncate(a, b, max_length):
  """google-research/bert run_classifier._truncate_seq_pair, transcribed."""
  a, b = list(a), list(b)
  while len(a) + len(b) > max_length:
    if len(a) > len(b):
      a.pop()
    else:
      b.pop()
  return a, b


def test_pair_packing_matches_hf_and_original_truncation(minilm_dir, tokenizer):
  from transformers import BertTokenizer

  hf = BertTokenizer(str(minilm_dir / "vocab.txt"), do_lower_case=True)
  a = [
    "The cat sat on the mat.",
    "Hello there!",
    "A much longer first sentence that goes on and on and on for a while.",
    "short",
  ]
  b = [
    "A cat is sitting.",
    "General Kenobi, you are a bold one.",
    "tiny",
    "and a second text that is clearly very much longer than the first one",
  ]
  arrays, cut = encode_texts(tokenizer, a, b, 64)
  assert cut == 0
  for i in range(len(a)):
    ref = hf(a[i], b[i], padding="max_length", max_length=64)
    assert arrays["input_ids"][i].tolist() == ref["input_ids"]
    assert arrays["segment_ids"][i].tolist() == ref["token_type_ids"]
    assert arrays["input_mask"][i].tolist() == ref["attention_mask"]
  arrays, cut = encode_texts(tokenizer, a, b, 12)
  assert cut == 4
  for i in range(len(a)):
    ta, tb = _original_truncate(
      hf.encode(a[i], add_special_tokens=False), hf.encode(b[i], add_special_tokens=False), 12 - 3
    )
    want = [hf.cls_token_id] + ta + [hf.sep_token_id] + tb + [hf.sep_token_id]
    n = int(arrays["input_mask"][i].sum())
    assert arrays["input_ids"][i, :n].tolist() == want
    assert arrays["segment_ids"][i, :n].tolist() == [0] * (len(ta) + 2) + [1] * (len(tb) + 1)


def test_single_sentence_truncation_counted(shared_data, tokenizer):
  task = create_task(
    _config("sst2", shared_data / "glue", max_seq_length=8, max_eval_examples=100), tokenizer
  )
  dev = task.load_split("dev")
  lengths = [len(tokenizer.encode(e.text_a)) for e in dev.examples]
  assert dev.stats["truncated"] == sum(n > 6 for n in lengths) > 0
  assert (dev.arrays["input_mask"].sum(1) == np.minimum(np.array(lengths) + 2, 8)).all()
  assert (dev.arrays["input_ids"][:, 0] == tokenizer.cls_id).all()


# --- bad input ------------------------------------------------------------------------------
def test_bad_tsv_errors_name_file_and_line(tmp_path, tokenizer):
  spec = SPECS["rte"]
  p = tmp_path / "missing_col.tsv"
  p.write_text("index\tsentence1\tlabel\n0\ta\tentailment\n")
  with pytest.raises(GlueInputError, match=r"missing_col\.tsv:1: missing column.*sentence2"):
    read_tsv(spec, str(p), True)
  p = tmp_path / "bad_label.tsv"
  p.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\tmaybe\n")
  with pytest.raises(GlueInputError, match=r"bad_label\.tsv:3: unknown label 'maybe'"):
    read_tsv(spec, str(p), True)
  p = tmp_path / "short_row.tsv"
  p.write_text(
    "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tonly one\n"
    "2\tc\td\tnot_entailment\n"
  )
  with pytest.raises(GlueInputError, match=r"short_row\.tsv:3: 2 field"):
    read_tsv(spec, str(p), True)
  examples, skipped = read_tsv(spec, str(p), True, skip_malformed_rows=True)
  assert (len(examples), skipped) == (2, 1)
  p = tmp_path / "score.tsv"
  p.write_text("sentence1\tsentence2\tscore\na\tb\tfive\n")
  with pytest.raises(GlueInputError, match=r"score\.tsv:2: score 'five'"):
    read_tsv(SPECS["stsb"], str(p), True)
  p = tmp_path / "binary.tsv"  # e.g. a gzipped file under a .tsv name
  p.write_bytes(
    "index\tsentence1\tsentence2\tlabel\n0\tcaf\u00e9\tb\tentailment\n".encode() + b"1\t\x8b\n"
  )
  with pytest.raises(GlueInputError, match=r"binary\.tsv:3: not UTF-8 text \(byte 0x8b\)"):
    read_tsv(spec, str(p), True)
  config = _config("sst2", tmp_path)
  config.task = "glue_nope"
  with pytest.raises(ValueError, match="unknown task"):
    create_task(config, tokenizer)


# --- TFDS source ----------------------------------------------------------------------------
def test_tfds_source_maps_label_names(tmp_path, tokenizer):
  import tensorflow_datasets as tfds

  rows = [
    {"premise": b"A man sleeps.", "hypothesis": b"A person rests.", "label": 0, "idx": 7},
    {"premise": b"A dog.", "hypothesis": b"No dog.", "label": 2, "idx": 8},
    {"premise": b"A car.", "hypothesis": b"Blue.", "label": 1, "idx": 9},
  ]
  with tfds.testing.mock_data(
    policy=tfds.testing.MockPolicy.USE_CODE, as_data_source_fn=lambda self, split, **kw: rows
  ):
    examples = read_tfds(SPECS["mnli"], "dev_matched", str(tmp_path))
    # TFDS orders MNLI labels entailment, neutral, contradiction; the TSV order differs.
    assert [e.label for e in examples] == [1, 0, 2]
    assert [e.index for e in examples] == ["7", "8", "9"]
    task = create_task(
      _config("mnli", "", data_source="tfds", tfds_data_dir=str(tmp_path)), tokenizer
    )
    data = task.load_split("dev_matched")
    assert data.arrays["label"].tolist() == [1, 0, 2] and data.has_labels
    assert not task.load_split("test_matched").has_labels
  with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
    for name in ("cola", "sst2", "stsb", "qqp", "rte", "wnli"):
      split = "train"
      examples = read_tfds(SPECS[name], split, str(tmp_path))
      assert len(examples) == 4 and all(isinstance(e.text_a, str) for e in examples)


def test_a_run_config_that_is_not_json_text_names_the_file(tmp_path):
  from bert_jax.runs.finetuning.runner_io import read_run_config

  (tmp_path / "config.json").write_bytes(b"\x1f\x8b\x08\x00")
  with pytest.raises(ValueError, match=r"config\.json: not UTF-8 text"):
    read_run_config(str(tmp_path))
  (tmp_path / "config.json").write_text('{"task": "rte",')
  with pytest.raises(ValueError, match=r"config\.json: not valid JSON"):
    read_run_config(str(tmp_path))
  (tmp_path / "config.json").write_text("[1, 2]")
  with pytest.raises(ValueError, match=r"config\.json: not a JSON object"):
    read_run_config(str(tmp_path))
