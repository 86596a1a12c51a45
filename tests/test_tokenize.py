"""The tokenizer interface: loading, defaults, bad input, saving, vocabulary building, the CLI."""

import json
import pathlib
import subprocess
import sys

import pytest
import transformers

from bert_jax.tokenize import (
  SPECIAL_TOKENS,
  decode_line,
  iter_text_lines,
  load_tokenizer,
)
from bert_jax.tokenize.vocab import build_wordpiece_vocab, corpus_stats

REPO = pathlib.Path(__file__).resolve().parent.parent


def write_vocab(path: pathlib.Path, tokens) -> pathlib.Path:
  path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
  return path


GOOD = list(SPECIAL_TOKENS) + ["hello", "world", "##s", ",", "!", "a", "##b"]


# --- loading and defaults -------------------------------------------------------------------


def test_load_minilm_directory_and_file(minilm_dir):
  tok = load_tokenizer(minilm_dir)
  assert tok.kind == "wordpiece" and tok.do_lower_case  # from its tokenizer_config.json
  assert tok.vocab_size == 30522
  assert tok.special_ids == (0, 100, 101, 102, 103)
  assert load_tokenizer(minilm_dir / "vocab.txt").encode("Hello") == tok.encode("hello")
  assert load_tokenizer(minilm_dir, do_lower_case=False).encode("Hello") != tok.encode("Hello")


def test_case_mismatch_warns(minilm_dir, tmp_path, caplog):
  load_tokenizer(minilm_dir, do_lower_case=False)
  assert "an uncased vocabulary?" in caplog.text
  caplog.clear()
  write_vocab(tmp_path / "vocab.txt", GOOD + [f"Word{i}" for i in range(50)])
  load_tokenizer(tmp_path / "vocab.txt", do_lower_case=True)
  assert "a cased vocabulary?" in caplog.text
  caplog.clear()
  load_tokenizer(minilm_dir)
  assert not caplog.text


def test_do_lower_case_defaults(tmp_path):
  write_vocab(tmp_path / "vocab.txt", GOOD + ["Hello"])
  assert load_tokenizer(tmp_path).do_lower_case is True  # no config: BERT-uncased
  (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": false}')
  cased = load_tokenizer(tmp_path)
  assert cased.do_lower_case is False and cased.tokenize("Hello") == ["Hello"]
  assert load_tokenizer(tmp_path, do_lower_case=True).tokenize("Hello") == ["hello"]


def test_bad_tokenizer_config(tmp_path):
  write_vocab(tmp_path / "vocab.txt", GOOD)
  (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": tru')
  with pytest.raises(ValueError, match=r"tokenizer_config\.json: not a valid JSON"):
    load_tokenizer(tmp_path)
  (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": "yes"}')
  with pytest.raises(ValueError, match=r"tokenizer_config\.json: key 'do_lower_case'"):
    load_tokenizer(tmp_path)


def test_missing_paths(tmp_path):
  with pytest.raises(ValueError, match="no tokenizer found"):
    load_tokenizer(tmp_path)
  with pytest.raises(ValueError, match="no such tokenizer file"):
    load_tokenizer(tmp_path / "nope.txt")


# --- bad vocabularies -----------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["[CLS]", "[SEP]", "[UNK]", "[MASK]", "[PAD]"])
def test_vocab_missing_special_token(tmp_path, missing):
  path = write_vocab(tmp_path / "vocab.txt", [t for t in GOOD if t != missing])
  with pytest.raises(ValueError) as e:
    load_tokenizer(path)
  assert str(path) in str(e.value) and missing in str(e.value)


def test_vocab_duplicate_names_lines(tmp_path):
  path = write_vocab(tmp_path / "vocab.txt", GOOD + ["world"])
  with pytest.raises(
    ValueError, match=rf"{path}:13: duplicate token 'world' \(already on line 7\)"
  ):
    load_tokenizer(path)


def test_vocab_empty_line_and_bad_bytes(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_bytes(b"[PAD]\n[UNK]\n\n[CLS]\n")
  with pytest.raises(ValueError, match=rf"{path}:3: empty line"):
    load_tokenizer(path)
  path.write_bytes(b"[PAD]\n[UNK]\n[CLS]\n[SEP]\nab\xff\n[MASK]\n")
  with pytest.raises(ValueError, match=rf"{path}:5: not valid UTF-8"):
    load_tokenizer(path)
  path.write_bytes(b"")
  with pytest.raises(ValueError, match="empty"):
    load_tokenizer(path)


def test_vocab_with_crlf_line_ends(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_bytes("\r\n".join(GOOD).encode() + b"\r\n")
  assert load_tokenizer(path).convert_ids_to_tokens(range(len(GOOD))) == GOOD


# --- text input -----------------------------------------------------------------------------


def test_decode_line_policy(tmp_path, minilm_dir):
  with pytest.raises(ValueError, match=r"corpus\.txt:7: not valid UTF-8 \(bytes b'\\xff'"):
    decode_line(b"caf\xff latte", "corpus.txt", 7)
  replaced = decode_line(b"caf\xff latte", "corpus.txt", 7, errors="replace")
  assert replaced == "caf\ufffd latte"
  # BERT's clean-up deletes U+FFFD: as the reference does with the replaced line.
  tok = load_tokenizer(minilm_dir)
  ref = transformers.BertTokenizer(str(minilm_dir / "vocab.txt"))
  assert tok.tokenize(replaced) == ref.tokenize(replaced) == ref.tokenize("caf latte")
  path = tmp_path / "corpus.txt"
  path.write_bytes(b"ok\nfine\nbad \xc3\x28 here\n")
  with pytest.raises(ValueError, match=rf"{path}:3: not valid UTF-8"):
    list(iter_text_lines(path))
  assert list(iter_text_lines(path, errors="replace"))[2] == "bad \ufffd( here"


def test_text_types_and_empty(minilm_dir):
  tok = load_tokenizer(minilm_dir)
  with pytest.raises(TypeError, match="decode_line"):
    tok.encode(b"bytes")
  with pytest.raises(TypeError, match="got NoneType"):
    tok.encode_batch(["ok", None])
  assert tok.tokenize("") == [] and tok.encode("") == [] and tok.encode(" \n\t") == []
  assert tok.encode_batch([]) == [] and tok.tokenize_batch([]) == []
  assert tok.encode_batch(["", "hello", ""]) == [[], tok.encode("hello"), []]


def test_batch_equals_single_and_keeps_order(minilm_dir):
  tok = load_tokenizer(minilm_dir)
  texts = ["plain ascii", "naïve café", "", "中文", "more ascii, here!", "Ångström"] * 7
  assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
  assert tok.tokenize_batch(texts) == [tok.tokenize(t) for t in texts]


def test_unicode_pipeline_is_built_for_the_first_non_ascii_text(minilm_dir):
  """ASCII text never pays for the Unicode tables; the first other text builds them. Pieces
  are the reference's either way (HF's BertTokenizer: accents stripped, CJK spaced out)."""
  reference = transformers.BertTokenizer(str(minilm_dir / "vocab.txt"), do_lower_case=True)
  tok = load_tokenizer(minilm_dir, backend="reference")
  ascii_text = "plain ascii, here!"
  assert tok.tokenize_batch([ascii_text]) == [reference.tokenize(ascii_text)]
  assert "_rust" not in vars(tok)
  for text in ("naïve café", "中文 Ångström"):
    assert tok.tokenize(text) == reference.tokenize(text)
  assert "_rust" in vars(tok)


def test_ids_tokens_and_word_starts(minilm_dir):
  tok = load_tokenizer(minilm_dir)
  assert tok.convert_tokens_to_ids(["[CLS]", "hello", "no-such-token"]) == [101, 7592, 100]
  assert tok.convert_ids_to_tokens([101, 7592]) == ["[CLS]", "hello"]
  with pytest.raises(ValueError, match="outside the vocabulary"):
    tok.convert_ids_to_tokens([30522])
  tokens = tok.tokenize("unaffable rockets")
  assert tokens == ["una", "##ffa", "##ble", "rockets"]
  assert [tok.is_word_start(t) for t in tokens] == [True, False, False, True]
  assert tok.is_word_start("[CLS]") and tok.is_word_start("[UNK]")


def test_long_word_cap(minilm_dir):
  tok = load_tokenizer(minilm_dir)
  assert tok.tokenize("a" * 101) == ["[UNK]"]
  assert len(tok.tokenize("a" * 100)) > 1 and "[UNK]" not in tok.tokenize("a" * 100)


def test_save_round_trip(tmp_path, minilm_dir):
  cased = load_tokenizer(minilm_dir, do_lower_case=False)
  written = cased.save(tmp_path / "workdir")
  assert sorted(pathlib.Path(p).name for p in written) == ["tokenizer_config.json", "vocab.txt"]
  # The vocabulary file is the original, byte for byte.
  assert (tmp_path / "workdir/vocab.txt").read_bytes() == (minilm_dir / "vocab.txt").read_bytes()
  assert (
    json.loads((tmp_path / "workdir/tokenizer_config.json").read_text())["do_lower_case"] is False
  )
  again = load_tokenizer(tmp_path / "workdir")
  assert again.do_lower_case is False and again.get_vocab() == cased.get_vocab()
  text = "Hello Ångström, [MASK] 中文!"
  assert again.encode(text) == cased.encode(text)


def test_decode(minilm_dir):
  tok = load_tokenizer(minilm_dir)
  ids = [tok.cls_id] + tok.encode("Hello, unaffable world!") + [tok.sep_id]
  assert tok.decode(ids) == "hello, unaffable world!"
  assert tok.decode(ids, skip_special_tokens=False) == "[CLS] hello, unaffable world! [SEP]"


# --- vocabulary building --------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(shared_data):
  return [
    str(shared_data / "pretrain/bert_sample_text.txt"),
    str(shared_data / "glue/CoLA/train.tsv"),
  ]


def test_build_wordpiece_layout(corpus, tmp_path):
  tok = build_wordpiece_vocab(corpus, tmp_path / "vocab.txt", vocab_size=2000, num_unused=3)
  lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").split("\n")
  assert lines[-1] == "" and len(lines) - 1 == tok.vocab_size <= 2000
  tokens = lines[:-1]
  assert tokens[:8] == list(SPECIAL_TOKENS) + ["[unused0]", "[unused1]", "[unused2]"]
  assert len(set(tokens)) == len(tokens)
  assert all(t.strip() == t and t for t in tokens)
  assert any(t.startswith("##") for t in tokens)
  assert not any(t != t.lower() for t in tokens[8:])  # uncased: no capitals
  assert tok.special_ids == (0, 1, 2, 3, 4)
  assert json.loads((tmp_path / "tokenizer_config.json").read_text())["do_lower_case"] is True
  # Every character of the corpus is in the vocabulary: nothing of it tokenizes to [UNK].
  assert corpus_stats(tok, corpus)["unk_share"] == 0
  with pytest.raises(ValueError, match="exists; pass overwrite=True"):
    build_wordpiece_vocab(corpus, tmp_path / "vocab.txt", vocab_size=2000)


def test_build_wordpiece_cased_and_hf_agrees(corpus, tmp_path):
  tok = build_wordpiece_vocab(corpus, tmp_path, vocab_size=1500, do_lower_case=False)
  assert any(t != t.lower() for t in tok.get_vocab())
  ref = transformers.BertTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=False)
  text = "The Quick brown fox didn't jump over Mr. Smith's dog."
  assert tok.tokenize(text) == ref.tokenize(text)
  assert load_tokenizer(tmp_path).do_lower_case is False


def test_build_bad_inputs(tmp_path):
  with pytest.raises(ValueError, match="matches no file"):
    build_wordpiece_vocab(str(tmp_path / "*.nothing"), tmp_path / "v", vocab_size=100)
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"good line\nanother good line\nbad \xff line\n" * 3)
  with pytest.raises(ValueError, match=rf"{bad}:3: not valid UTF-8"):
    build_wordpiece_vocab([bad], tmp_path / "v1", vocab_size=100)
  assert not (tmp_path / "v1" / "vocab.txt").exists()  # nothing half-written
  tok = build_wordpiece_vocab(
    [bad], tmp_path / "v2", vocab_size=100, decode_errors="replace", min_frequency=1
  )
  assert tok.tokenize("bad line") == ["bad", "line"]
  with pytest.raises(ValueError, match="leaves no room"):
    build_wordpiece_vocab([bad], tmp_path / "v3", vocab_size=5)


def test_build_vocab_command(shared_data, tmp_path):
  out = tmp_path / "vocab_cased"
  cmd = [
    sys.executable,
    "-m",
    "bert_jax.build_vocab",
    f"--input={shared_data / 'pretrain/bert_sample_text.txt'}",
    f"--output={out}",
    "--kind=wordpiece",
    "--vocab_size=400",
    "--cased",
  ]
  run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr
  summary = json.loads(run.stdout)
  assert summary["vocab_size"] == 400 and summary["do_lower_case"] is False
  assert summary["lines"] == 31 and 1 < summary["tokens_per_word"] < 3
  tok = load_tokenizer(out)
  assert tok.do_lower_case is False and tok.vocab_size == 400
  again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
  assert again.returncode != 0 and "exists; pass overwrite=True" in again.stderr
  assert "Traceback" not in again.stderr


def test_hugging_face_config_keys(tmp_path, minilm_dir):
  """strip_accents and tokenize_chinese_chars from a Hugging Face tokenizer_config.json."""
  (tmp_path / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())
  (tmp_path / "tokenizer_config.json").write_text(
    json.dumps({"do_lower_case": True, "strip_accents": False, "tokenize_chinese_chars": False})
  )
  ours = load_tokenizer(tmp_path)
  ref = transformers.BertTokenizer(
    str(tmp_path / "vocab.txt"),
    do_lower_case=True,
    strip_accents=False,
    tokenize_chinese_chars=False,
  )
  texts = ["Naïve CAFÉ résumé", "中文字符 and 日本語", "Ångström e\u0301"]
  assert [ours.tokenize(t) for t in texts] == [ref.tokenize(t) for t in texts]
  assert ours.tokenize("café") != load_tokenizer(minilm_dir).tokenize("café")
  saved = tmp_path / "saved"
  ours.save(saved)
  assert load_tokenizer(saved).tokenize(texts[0]) == ours.tokenize(texts[0])
