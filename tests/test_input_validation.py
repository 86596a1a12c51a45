"""Every fine-tuning input is refused when read if it cannot train or be evaluated.

Empty splits (a GLUE dev.tsv with only its header, an empty CoNLL file, a SQuAD file with
``"data": []``, a SWAG file with no rows) and rows with more fields than the task's columns (a
tab inside GLUE's last text column: CoLA's sentence, RTE's sentence2, test files too) are
errors naming the file (and line), instead of training every step and then failing, or reading
the text cut at the tab. The expected field counts are the official files' (GLUE's README and
the files in ../shared/data/glue: CoLA train/dev 4 headerless columns, RTE 4, CoLA test 2).
"""

from __future__ import annotations

import json

import pytest

from bert_jax.tasks.glue.data import SPECS, GlueInputError, read_tsv
from bert_jax.tasks.ner.data import ConllInputError, read_conll, split_sentences
from bert_jax.tasks.squad.examples import SquadFormatError, read_squad_examples
from bert_jax.tasks.swag.task import SwagInputError, read_swag


# --- GLUE -----------------------------------------------------------------------------------
def test_glue_dev_with_only_its_header_is_refused(tmp_path):
  p = tmp_path / "dev.tsv"
  p.write_text("index\tsentence1\tsentence2\tlabel\n")
  with pytest.raises(GlueInputError, match=r"dev\.tsv.*no examples"):
    read_tsv(SPECS["rte"], str(p), labelled=True)


def test_glue_headerless_cola_empty_file_is_refused(tmp_path):
  p = tmp_path / "dev.tsv"
  p.write_text("")
  with pytest.raises(GlueInputError, match=r"dev\.tsv.*no examples"):
    read_tsv(SPECS["cola"], str(p), labelled=True)


def test_glue_all_rows_skipped_is_refused(tmp_path):
  p = tmp_path / "dev.tsv"
  p.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\n")
  with pytest.raises(GlueInputError, match=r"dev\.tsv.*no examples.*1 malformed row"):
    read_tsv(SPECS["rte"], str(p), labelled=True, skip_malformed_rows=True)


def test_tab_inside_cola_sentence_is_an_error_naming_file_and_line(tmp_path):
  p = tmp_path / "dev.tsv"
  p.write_text("gj04\t1\t\tThe cat sat.\ngj04\t0\t*\tThe cat\tsat the.\n")
  with pytest.raises(GlueInputError, match=r"dev\.tsv:2: 5 fields, expected 4"):
    read_tsv(SPECS["cola"], str(p), labelled=True)


def test_tab_inside_cola_test_sentence_is_an_error(tmp_path):
  p = tmp_path / "test.tsv"
  p.write_text("index\tsentence\n0\tfine\n1\tcut\there\n")
  with pytest.raises(GlueInputError, match=r"test\.tsv:3: 3 fields, expected 2"):
    read_tsv(SPECS["cola"], str(p), labelled=False)


def test_tab_inside_rte_sentence2_is_an_extra_field_not_an_unknown_label(tmp_path):
  p = tmp_path / "dev.tsv"
  p.write_text(
    "index\tsentence1\tsentence2\tlabel\n0\tA man sleeps.\tA man\tis asleep.\tentailment\n"
  )
  with pytest.raises(GlueInputError, match=r"dev\.tsv:2: 5 fields, expected 4") as e:
    read_tsv(SPECS["rte"], str(p), labelled=True)
  assert "unknown label" not in str(e.value)


def test_extra_field_skipped_and_counted_with_skip_malformed_rows(tmp_path):
  p = tmp_path / "dev.tsv"
  p.write_text("gj04\t1\t\tThe cat sat.\ngj04\t0\t*\tThe cat\tsat the.\n")
  examples, skipped = read_tsv(SPECS["cola"], str(p), labelled=True, skip_malformed_rows=True)
  assert [e.text_a for e in examples] == ["The cat sat."]
  assert skipped == 1


def test_well_formed_rows_unchanged(tmp_path):
  p = tmp_path / "dev.tsv"
  p.write_text("index\tsentence1\tsentence2\tlabel\n0\tA b.\tC d.\tnot_entailment\n")
  examples, skipped = read_tsv(SPECS["rte"], str(p), labelled=True)
  assert (examples[0].text_a, examples[0].text_b, examples[0].label, skipped) == (
    "A b.",
    "C d.",
    1,
    0,
  )


# --- NER ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "\n\n", "-DOCSTART- -X- O O\n\n"])
def test_empty_conll_file_is_refused(tmp_path, text):
  p = tmp_path / "dev.txt"
  p.write_text(text)
  with pytest.raises(ConllInputError, match=r"dev\.txt.*no sentences"):
    read_conll(str(p))


def test_conll_all_lines_skipped_is_refused(tmp_path):
  p = tmp_path / "dev.txt"
  p.write_text("word\n\n")
  with pytest.raises(ConllInputError, match=r"dev\.txt.*no sentences.*1 malformed line"):
    read_conll(str(p), skip_malformed=True)


def test_dev_fraction_that_leaves_no_training_sentence_is_refused(tmp_path):
  p = tmp_path / "train.txt"
  p.write_text("EU B-ORG\n")
  (sentence,) = read_conll(str(p))
  with pytest.raises(ValueError, match="at least 2 sentences"):
    split_sentences([sentence], 0.5, 0)


# --- SQuAD ----------------------------------------------------------------------------------
@pytest.mark.parametrize("is_training", [True, False])
def test_squad_file_with_no_data_is_refused(tmp_path, is_training):
  p = tmp_path / "dev-v1.1.json"
  p.write_text(json.dumps({"version": "1.1", "data": []}))
  with pytest.raises(SquadFormatError, match=r"dev-v1\.1\.json.*no questions"):
    read_squad_examples(str(p), is_training=is_training, version_2_with_negative=False)


def test_squad_training_file_whose_answers_all_mismatch_is_refused(tmp_path):
  p = tmp_path / "train.json"
  qa = {"id": "q1", "question": "who?", "answers": [{"text": "Bob", "answer_start": 0}]}
  p.write_text(json.dumps({"data": [{"paragraphs": [{"context": "Ann ran.", "qas": [qa]}]}]}))
  with pytest.raises(SquadFormatError, match=r"train\.json.*no questions.*1 answer"):
    read_squad_examples(str(p), is_training=True, version_2_with_negative=False)


# --- SWAG -----------------------------------------------------------------------------------
_SWAG_HEADER = ",fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"


def test_swag_file_with_only_its_header_is_refused(tmp_path):
  p = tmp_path / "val.csv"
  p.write_text(_SWAG_HEADER + "\n")
  with pytest.raises(SwagInputError, match=r"val\.csv.*no examples"):
    read_swag(str(p), labelled=True)


def test_swag_row_with_an_extra_field_is_an_error(tmp_path):
  p = tmp_path / "val.csv"
  p.write_text(_SWAG_HEADER + "\n0,1,x,He,walks,gold,a,b,c,d,2,extra\n")
  with pytest.raises(SwagInputError, match=r"val\.csv:2: 12 fields, expected 11"):
    read_swag(str(p), labelled=True)
