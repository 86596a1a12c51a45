"""SentencePiece models built from shared text: fixed special ids, round trips, word starts."""

import pytest
import sentencepiece as spm

from bert_jax.tokenize import SPECIAL_TOKENS, SentencePieceTokenizer, load_tokenizer
from bert_jax.tokenize.vocab import build_sentencepiece_model

PLAYS = ("hamlet_gut.txt", "macbeth_gut.txt")


@pytest.fixture(scope="module")
def corpus_files(shared_data):
  return [str(shared_data / "pretrain/shakespeare" / p) for p in PLAYS]


@pytest.fixture(scope="module")
def corpus_lines(corpus_files):
  lines = []
  for f in corpus_files:
    lines += [l.strip() for l in open(f, encoding="utf-8") if l.strip()]
  return lines[::7]


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def model(request, corpus_files, tmp_path_factory):
  out = tmp_path_factory.mktemp(f"sp_{request.param}")
  tok = build_sentencepiece_model(
    corpus_files,
    out / "sentencepiece",
    vocab_size=1000,
    model_type=request.param,
    character_coverage=1.0,
  )
  return tok, out


def test_special_ids_fixed(model):
  tok, out = model
  assert tok.kind == "sentencepiece" and tok.vocab_size == 1000
  assert tok.special_ids == (0, 1, 2, 3, 4)
  sp = spm.SentencePieceProcessor(model_file=str(out / "sentencepiece.model"))  # independent
  assert [sp.id_to_piece(i) for i in range(5)] == list(SPECIAL_TOKENS)
  assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, -1, -1)
  assert all(sp.is_control(i) for i in (2, 3, 4))
  assert tok.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2, 3, 4]


def test_encode_is_sentencepiece_and_round_trips(model, corpus_lines):
  tok, out = model
  sp = spm.SentencePieceProcessor(model_file=str(out / "sentencepiece.model"))
  ids = tok.encode_batch(corpus_lines)
  assert ids == [sp.encode(line) for line in corpus_lines]
  assert [tok.encode(l) for l in corpus_lines[:50]] == ids[:50]
  assert tok.tokenize_batch(corpus_lines[:50]) == [
    sp.encode(l, out_type=str) for l in corpus_lines[:50]
  ]
  for line, row in zip(corpus_lines, ids):
    assert tok.decode(row) == " ".join(line.split())  # NFKC-stable text, spaces collapsed
  assert tok.encode("") == [] and tok.tokenize("") == [] and tok.encode_batch([]) == []


def test_special_strings_in_text_stay_text(model):
  tok, _ = model
  ids = tok.encode("[PAD] [UNK] [CLS] [SEP] [MASK]")
  assert not set(ids) & {0, 2, 3, 4}
  assert tok.decode([2] + tok.encode("To be") + [3], skip_special_tokens=False) == (
    "[CLS] To be [SEP]"
  )
  assert tok.decode([2] + tok.encode("To be") + [3]) == "To be"


def test_word_starts(model, corpus_lines):
  tok, _ = model
  for line, tokens in zip(corpus_lines, tok.tokenize_batch(corpus_lines)):
    # One piece opens each whitespace-separated word.
    assert sum(map(tok.is_word_start, tokens)) == len(line.split()), line
  assert tok.is_word_start("[CLS]") and tok.is_word_start("\u2581the")
  assert not tok.is_word_start("ing")


def test_save_and_load(model, tmp_path):
  tok, out = model
  assert load_tokenizer(out).encode("Something is rotten") == tok.encode("Something is rotten")
  written = tok.save(tmp_path / "workdir")
  assert {p.rsplit("/", 1)[1] for p in written} == {"sentencepiece.model", "tokenizer_config.json"}
  again = load_tokenizer(tmp_path / "workdir")
  assert isinstance(again, SentencePieceTokenizer) and again.do_lower_case is False
  # A model under another name is recognised by its content.
  other = tmp_path / "spm.bin"
  other.write_bytes((out / "sentencepiece.model").read_bytes())
  assert isinstance(load_tokenizer(other), SentencePieceTokenizer)


def test_lower_case(corpus_files, tmp_path):
  tok = build_sentencepiece_model(
    corpus_files, tmp_path / "sp", vocab_size=600, model_type="bpe", do_lower_case=True
  )
  assert tok.do_lower_case and load_tokenizer(tmp_path).do_lower_case
  assert tok.encode("HAMLET Speaks") == tok.encode("hamlet speaks")


def test_bad_models(corpus_files, tmp_path):
  bad = tmp_path / "bad.model"
  bad.write_bytes(b"\x00\x01 not a model")
  with pytest.raises(ValueError, match=rf"{bad}: not a SentencePiece model"):
    load_tokenizer(bad)
  # A model trained without BERT's tokens (SentencePiece's defaults: <unk>, <s>, </s>).
  spm.SentencePieceTrainer.train(
    input=corpus_files[0], model_prefix=str(tmp_path / "plain"), vocab_size=300, minloglevel=2
  )
  with pytest.raises(
    ValueError,
    match=r"plain\.model: vocabulary lacks BERT special token\(s\) "
    r"\[PAD\], \[CLS\], \[SEP\], \[MASK\]",
  ):
    load_tokenizer(tmp_path / "plain.model")
  with pytest.raises(ValueError, match="model_type must be one of"):
    build_sentencepiece_model(corpus_files, tmp_path / "x", 500, model_type="char")
  with pytest.raises(ValueError, match="exists; pass overwrite=True"):
    build_sentencepiece_model(corpus_files, tmp_path / "plain", 500)
