"""Where pre-training batches come from: configured TFRecords, the built-in corpus, or random.

  sources = resolve_data(config, workdir)      # tokenizer + per-phase train/eval files
  make_input = input_factory(config, sources, phase_cfg, host_batch_size)
  for batch in eval_batches(config, sources, phase_cfg): ...

With ``config.packing.enabled`` each training row holds several instances (first fit within
the batch, in the reader's order; ``bert_jax.data.packing``): the files are read at their own
record length (``config.max_seq_length`` may be longer, e.g. seq-128 files packed into rows of
512) and packed into rows of ``max_seq_length``; held-out batches stay one instance per row (padded to
the row length), so evaluations compare packed and unpacked runs on the same examples.

With ``config.input_files`` empty (and ``synthetic_data`` off) the default corpus of
``bert_jax.data.default_corpus`` is prepared once (by process 0; idempotent) under
``config.default_corpus_dir`` (default ``<workdir>/default_corpus``): its vocabulary and its
TFRecords at both phases' lengths.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax.data.default_corpus import prepare_default_data
from bert_jax.data.masking import MaskRates
from bert_jax.data.packing import (
  CLS_POSITIONS,
  POSITION_IDS,
  SEQUENCE_IDS,
  SEQUENCE_WEIGHTS,
  PackedPretrainInput,
)
from bert_jax.tasks.pretraining.synthetic_input import SyntheticPretrainInput
from bert_jax.tokenize import load_tokenizer


@dataclasses.dataclass
class PhaseData:
  """One phase's data. ``max_sequences_per_row > 0``: packed rows of up to that many instances
  and ``max_predictions_per_row`` predictions, read from records of ``record_seq_length`` tokens
  and ``record_predictions`` predictions (the files' own shapes)."""

  max_seq_length: int
  max_predictions_per_seq: int
  input_files: str
  eval_input_files: str
  max_sequences_per_row: int = 0
  max_predictions_per_row: int = 0
  record_seq_length: int = 0
  record_predictions: int = 0

  @property
  def packed(self) -> bool:
    return self.max_sequences_per_row > 0

  @property
  def row_predictions(self) -> int:
    """Prediction slots of a training row."""
    return self.max_predictions_per_row if self.packed else self.max_predictions_per_seq


@dataclasses.dataclass
class DataSources:
  tokenizer: Any  # bert_jax.tokenize.Tokenizer, or None for synthetic data
  vocab_size: int
  phases: list[PhaseData]


def _phase_settings(config) -> list[tuple[int, int, str, str, str]]:
  out = [
    (
      config.max_seq_length,
      config.max_predictions_per_seq,
      config.input_files,
      config.eval_input_files,
      "",
    )
  ]
  if config.phase2.fraction > 0:
    p2 = config.phase2
    out.append(
      (
        p2.max_seq_length,
        p2.max_predictions_per_seq,
        p2.input_files,
        p2.eval_input_files,
        "phase2.",
      )
    )
  return out


def _prepare_default(config, workdir: str, lengths, predictions, vocab_file: str):
  out_dir = config.default_corpus_dir or os.path.join(workdir, "default_corpus")
  kwargs = dict(
    max_seq_lengths=tuple(lengths),
    max_predictions_per_seq=tuple(predictions),
    random_seed=config.seed,
    vocab_file=vocab_file,
    **_default_corpus_settings(config),
  )
  if jax.process_index() == 0:
    logging.info("No input_files configured: preparing the built-in corpus in %s", out_dir)
    data = prepare_default_data(out_dir, progress=True, **kwargs)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("bert_jax default corpus prepared")
    if jax.process_index() != 0:
      data = prepare_default_data(out_dir, **kwargs)
  return data


def mask_rates(config):
  """``config.mask_rates`` as the data layer's MaskRates (ValueError naming the keys)."""
  r = config.mask_rates
  try:
    return MaskRates(mask=r.mask, same=r.same, random=r.random)
  except ValueError as e:
    raise ValueError(f"config.mask_rates (mask / same / random): {e}") from None


def _default_corpus_settings(config) -> dict[str, Any]:
  """How the built-in corpus is generated for this objective: NSP sentence pairs only for
  mlm_nsp (the others read documents packed into full-length segments); static masks with the
  configured probability, rates and whole-word masking (no masks needed for ltr)."""
  rates = mask_rates(config)
  return dict(
    sentence_pairs=config.objective == "mlm_nsp",
    masked_lm_prob=config.masked_lm_prob,
    mask_rates=(rates.mask, rates.same, rates.random),
    whole_word_mask=config.whole_word_mask,
  )


def check_sentence_pairs(config, phases: list[PhaseData]) -> None:
  """NSP needs sentence-pair data: refuse packed (single-segment) files for mlm_nsp."""
  if config.objective != "mlm_nsp":
    return
  from bert_jax.data.tfrecord import records_have_sentence_pairs  # noqa: PLC0415 (imports TensorFlow)

  for phase, prefix in zip(phases, ("", "phase2.")):
    if not records_have_sentence_pairs(
      phase.input_files,
      phase.record_seq_length or phase.max_seq_length,
      phase.record_predictions or phase.max_predictions_per_seq,
    ):
      raise ValueError(
        f"config.objective='mlm_nsp' needs sentence pairs for next-sentence prediction, but "
        f"config.{prefix}input_files ({phase.input_files}) holds single segments (no segment "
        "1): generate pairs (create_pretraining_data --sentence_pairs=true) or set "
        "config.objective='mlm' (no NSP) / 'ltr'"
      )


def _packing_settings(config) -> list[tuple[int, int, str]]:
  """(max_sequences_per_row, max_predictions_per_row, config key prefix) per phase."""
  out = [(config.packing.max_sequences_per_row, config.packing.max_predictions_per_row, "packing.")]
  if config.phase2.fraction > 0:
    p2 = config.phase2
    out.append((p2.max_sequences_per_row, p2.max_predictions_per_row, "phase2."))
  return out


MIN_INSTANCE_TOKENS = 3  # [CLS] x [SEP]: the shortest instance a row can hold


def check_row_sizes(config) -> None:
  """A one-line ValueError naming the key (phase 2's with its ``phase2.`` prefix) of a size no
  row of its phase can use, before any data is read or any memory taken for it: prediction
  slots (per sequence, or per packed row) beyond the row's ``L - 2`` non-special tokens, and
  sequences per packed row beyond ``L // 3`` (each instance at least [CLS] x [SEP])."""
  phases = [("", "packing", config.max_seq_length, config.max_predictions_per_seq)]
  if config.phase2.fraction > 0:
    p2 = config.phase2
    phases.append(("phase2.", "phase2", p2.max_seq_length, p2.max_predictions_per_seq))
  for prefix, group, length, predictions in phases:
    length = int(length)
    length_key = f"config.{prefix}max_seq_length={length}"
    if length < MIN_INSTANCE_TOKENS:
      raise ValueError(f"{length_key} is shorter than the {MIN_INSTANCE_TOKENS} tokens of "
                       "the shortest instance ([CLS] x [SEP])")  # fmt: skip
    tokens = length - 2
    sizes = [(f"{prefix}max_predictions_per_seq", predictions, tokens, "predictions")]
    if config.packing.enabled:
      packing = config.packing if group == "packing" else config.phase2
      sizes += [
        (f"{group}.max_sequences_per_row", packing.max_sequences_per_row, length // 3, "seq"),
        (
          f"{group}.max_predictions_per_row",
          packing.max_predictions_per_row,
          tokens,
          "predictions",
        ),
      ]
    for key, value, bound, kind in sizes:
      if int(value) <= bound:
        continue
      what = (
        f"the {bound} non-special tokens of a row ({length_key}, less [CLS] and [SEP])"
        if kind == "predictions"
        else f"the {bound} sequences of at least {MIN_INSTANCE_TOKENS} tokens ([CLS] x [SEP]) "
        f"a row holds ({length_key})"
      )
      raise ValueError(f"config.{key}={int(value)} is more than {what}; set it to <= {bound}")


def default_predictions_per_row(
  max_seq_length: int, max_predictions_per_seq: int, sequences: int, masked_lm_prob: float
) -> int:
  """A packed row's prediction slots when not configured: what ``sequences`` instances masked
  at ``masked_lm_prob`` can hold (each masks round(prob x length), at least 1, so a row at most
  ceil(prob x max_seq_length) + sequences), and no more than max_predictions_per_seq each."""
  return min(
    max_predictions_per_seq * sequences,
    int(np.ceil(masked_lm_prob * max_seq_length)) + sequences,
  )


def pack_phases(config, phases: list[PhaseData], record_shapes=None) -> list[PhaseData]:
  """``phases`` with their packing settings when ``config.packing.enabled`` (else as given);
  ``record_shapes``: each phase's files' (length, predictions), None = the phase's own. One-line
  ValueErrors name the keys: sequences per row < 1, records longer than a row, a row with
  fewer prediction slots than a record."""
  if not config.packing.enabled:
    return phases
  out = []
  settings = _packing_settings(config)
  for i, (phase, (sequences, predictions, prefix)) in enumerate(zip(phases, settings)):
    sequences, predictions = int(sequences), int(predictions)
    phase_prefix = "phase2." if prefix == "phase2." else ""
    length_key = f"config.{phase_prefix}max_seq_length"
    files_key = f"config.{phase_prefix}input_files"
    preds_key = f"config.{phase_prefix}max_predictions_per_seq"
    if sequences < 1:
      raise ValueError(
        f"config.{prefix}max_sequences_per_row must be >= 1 with config.packing.enabled, "
        f"got {sequences}"
      )
    rec_len, rec_preds = (
      record_shapes[i] if record_shapes else (phase.max_seq_length, phase.max_predictions_per_seq)
    )
    if rec_len > phase.max_seq_length:
      raise ValueError(
        f"{length_key}={phase.max_seq_length} is shorter than the records of {files_key} "
        f"({phase.input_files}: {rec_len} tokens): a packed row must hold a whole instance; "
        f"set {length_key} >= {rec_len}"
      )
    if rec_preds > phase.max_predictions_per_seq and config.objective != "ltr":
      raise ValueError(
        f"{preds_key}={phase.max_predictions_per_seq} is less than the {rec_preds} "
        f"predictions per record of {files_key} ({phase.input_files}); set it to >= {rec_preds}"
      )
    if predictions == 0:
      predictions = max(
        rec_preds,
        default_predictions_per_row(
          phase.max_seq_length, phase.max_predictions_per_seq, sequences, config.masked_lm_prob
        ),
      )
    elif predictions < rec_preds and config.objective != "ltr":
      raise ValueError(
        f"config.{prefix}max_predictions_per_row={predictions} is less than the "
        f"{rec_preds} predictions per record of {files_key} ({phase.input_files}); set it to "
        f">= {rec_preds}, or 0 for the default"
      )
    out.append(
      dataclasses.replace(
        phase,
        max_sequences_per_row=sequences,
        max_predictions_per_row=predictions,
        record_seq_length=rec_len,
        record_predictions=rec_preds,
      )
    )
  return out


def abstract_sources(config) -> DataSources:
  """Each phase's shapes without reading or writing anything (for compiling a run's steps):
  no tokenizer; the vocabulary size is BERT's 30,522 unless config.bert_config_file sets it."""
  phases = [PhaseData(l, p, "", "") for l, p, *_ in _phase_settings(config)]
  return DataSources(None, 30522, pack_phases(config, phases))


def _record_shapes(config, phases: list[PhaseData]):
  """Each phase's files' (record length, predictions) when packing (None otherwise)."""
  if not config.packing.enabled or config.synthetic_data:
    return None
  from bert_jax.data.tfrecord import record_shape  # noqa: PLC0415 (imports TensorFlow)

  return [record_shape(p.input_files) for p in phases]


def resolve_data(config, workdir: str, resume_vocab: str = "") -> DataSources:
  """The tokenizer and each phase's files; ValueError naming the config key when missing.
  ``resume_vocab``: the vocabulary the workdir's checkpoint was trained with (the built-in
  corpus is then tokenized with it, whatever it holds for other arguments)."""
  settings = _phase_settings(config)
  if config.synthetic_data:
    vocab = 30522 if not config.vocab_file else None
    tokenizer = None
    if config.vocab_file:
      tokenizer = load_tokenizer(config.vocab_file, do_lower_case=config.do_lower_case)
      vocab = tokenizer.vocab_size
    phases = [PhaseData(l, p, "", "") for l, p, *_ in settings]
    return DataSources(tokenizer, vocab, pack_phases(config, phases))

  if not config.input_files:
    lengths = [s[0] for s in settings]
    predictions = [s[1] for s in settings]
    if len(set(lengths)) != len(lengths):
      raise ValueError(
        "the built-in corpus needs distinct max_seq_length per phase; got "
        f"{lengths} (config.max_seq_length, config.phase2.max_seq_length)"
      )
    data = _prepare_default(config, workdir, lengths, predictions, resume_vocab)
    tokenizer = load_tokenizer(config.vocab_file or data.vocab_file, do_lower_case=True)
    phases = [
      PhaseData(l, p, data.train_files[l], data.eval_files[l]) for l, p in zip(lengths, predictions)
    ]
    phases = pack_phases(config, phases, _record_shapes(config, phases))
    return DataSources(tokenizer, tokenizer.vocab_size, phases)

  if not config.vocab_file:
    raise ValueError(
      "config.vocab_file is empty: with config.input_files set, name the "
      "vocabulary (vocab.txt, SentencePiece .model, or a directory) the "
      "TFRecords were made with"
    )
  phases = []
  for length, preds, files, eval_files, prefix in settings:
    if not files:
      raise ValueError(
        f"config.{prefix}input_files is empty but phase 2 is on "
        f"(config.phase2.fraction={config.phase2.fraction}); set it to "
        f"TFRecords at seq {length}, or set config.phase2.fraction=0"
      )
    phases.append(PhaseData(length, preds, files, eval_files))
  phases = pack_phases(config, phases, _record_shapes(config, phases))
  check_sentence_pairs(config, phases)
  tokenizer = load_tokenizer(config.vocab_file, do_lower_case=config.do_lower_case)
  return DataSources(tokenizer, tokenizer.vocab_size, phases)


class TokenShare:
  """Real tokens / row slots of the training rows an input delivered (packed or not), and the
  sequences they held; ``log`` writes one line, ``summary`` the figures for summary.json."""

  def __init__(self, name: str, packed: bool):
    self.name, self.packed = name, packed
    self.rows = self.real = self.slots = self.sequences = 0

  def add(self, batch: dict) -> None:
    mask = batch["input_mask"]
    self.rows += mask.shape[0]
    self.real += int(np.count_nonzero(mask))
    self.slots += mask.size
    if SEQUENCE_WEIGHTS in batch:
      self.sequences += int(np.count_nonzero(batch[SEQUENCE_WEIGHTS]))
    elif SEQUENCE_IDS in batch:
      self.sequences += int(np.count_nonzero(np.diff(batch[SEQUENCE_IDS], axis=1) > 0))
      self.sequences += int(np.count_nonzero(batch[SEQUENCE_IDS][:, 0]))
    else:
      self.sequences += int(np.count_nonzero(mask[:, 0]))

  @property
  def share(self) -> float:
    return self.real / self.slots if self.slots else 0.0

  def summary(self) -> dict:
    return dict(
      real_token_share=self.share,
      packed=self.packed,
      rows=self.rows,
      sequences_per_row=self.sequences / self.rows if self.rows else 0.0,
    )

  def log(self) -> None:
    logging.info(
      "%s input: real-token share of rows %.4f (%s, %.2f sequences per row, %d rows)",
      self.name,
      self.share,
      "packed" if self.packed else "not packed",
      self.summary()["sequences_per_row"],
      self.rows,
    )


def input_factory(
  config, sources: DataSources, phase: PhaseData, host_batch: int, share: TokenShare | None = None
):
  """A function making this host's resumable training iterator for ``phase``; ``share``, if
  given, counts the real tokens of the rows it delivers."""

  def make():
    keys = batch_keys(config.objective, phase.packed)
    # Packed: instances are read in batches of host_batch records (any fixed count would do:
    # the packed position is (reader position before such a batch, instances used of it)).
    length = phase.record_seq_length or phase.max_seq_length
    predictions = phase.record_predictions or phase.max_predictions_per_seq
    if config.synthetic_data:
      mask_id = sources.tokenizer.mask_id if sources.tokenizer is not None else 4
      inp = SyntheticPretrainInput(
        host_batch,
        length,
        predictions,
        sources.vocab_size,
        seed=config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        mask_id=mask_id,
      )
    else:
      from bert_jax.data.pipeline import PretrainInput, log_input  # noqa: PLC0415 (imports TensorFlow)

      ltr = config.objective == "ltr"
      inp = PretrainInput(
        phase.input_files,
        host_batch,
        length,
        predictions,
        seed=config.seed,
        shuffle_buffer_size=config.shuffle_buffer_size,
        dynamic_masking=config.dynamic_masking and not ltr,
        tokenizer=sources.tokenizer,
        masked_lm_prob=config.masked_lm_prob,
        whole_word_mask=config.whole_word_mask,
        mask_rates=mask_rates(config),
        unmask=ltr,
      )
      log_input(inp)
    if phase.packed:
      inp = PackedPretrainInput(
        inp,
        host_batch,
        phase.max_seq_length,
        phase.max_sequences_per_row,
        phase.max_predictions_per_row,
      )
      logging.info(
        "packing: rows of %d tokens, up to %d sequences and %d predictions per row, from "
        "records of %d tokens",
        phase.max_seq_length,
        phase.max_sequences_per_row,
        phase.max_predictions_per_row,
        length,
      )
    return KeyFilter(inp, keys, share)

  return make


def batch_keys(objective: str, packed: bool = False) -> tuple[str, ...]:
  """The batch features ``objective`` reads (packed rows: with position_ids and sequence_ids,
  and for mlm_nsp cls_positions and sequence_weights: ``bert_jax.data.packing``'s layout)."""
  keys = ("input_ids", "input_mask", "segment_ids")
  if packed:
    keys += (POSITION_IDS, SEQUENCE_IDS)
  if objective == "ltr":
    return keys
  keys += ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
  if objective != "mlm_nsp":
    return keys
  keys += ("next_sentence_labels",)
  return keys + (CLS_POSITIONS, SEQUENCE_WEIGHTS) if packed else keys


class KeyFilter:
  """An input iterator passing on only ``keys`` (and ``example_weights``) of each batch; its
  position (get_state / set_state) is the wrapped iterator's. ``share``, if given, counts each
  batch's real tokens (logged at the first batch and every 1,000th)."""

  def __init__(self, inner, keys: tuple[str, ...], share: TokenShare | None = None):
    self.inner = inner
    self.keys = frozenset(keys) | {"example_weights"}
    self.share = share
    self._batches = 0

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = {k: v for k, v in next(self.inner).items() if k in self.keys}
    if self.share is not None:
      self.share.add(batch)
      self._batches += 1
      if self._batches == 1 or self._batches % 1000 == 0:
        self.share.log()
    return batch

  def get_state(self) -> dict:
    return self.inner.get_state()

  def set_state(self, state: dict) -> None:
    self.inner.set_state(state)


def pad_instances(batch: dict, max_seq_length: int, max_predictions_per_seq: int) -> dict:
  """Instance batch padded with zeros to ``max_seq_length`` tokens and ``max_predictions_per_seq``
  prediction slots (held-out data read at the records' shorter shape, for a packed phase)."""
  out = dict(batch)
  for key, width in (
    ("input_ids", max_seq_length),
    ("masked_lm_positions", max_predictions_per_seq),
  ):
    group = (
      ("input_ids", "input_mask", "segment_ids")
      if key == "input_ids"
      else ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
    )
    for k in group:
      v = batch[k]
      if v.shape[1] > width:
        raise ValueError(
          f"held-out records have {v.shape[1]} slots of {k}, more than the {width} of the phase"
        )
      out[k] = np.pad(v, ((0, 0), (0, width - v.shape[1])))
  return out


def eval_batches(
  config, sources: DataSources, phase: PhaseData, host_batch: int
) -> Iterator[dict[str, np.ndarray]]:
  """Up to ``config.max_eval_steps`` held-out batches of this host (same count on every host:
  a host that runs out feeds all-zero-weight batches until every host has)."""
  if config.synthetic_data:
    it = SyntheticPretrainInput(
      host_batch,
      phase.max_seq_length,
      phase.max_predictions_per_seq,
      sources.vocab_size,
      seed=config.seed + 1_000_003,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
    )
    keys = KeyFilter(it, batch_keys(config.objective))
    for _ in range(config.max_eval_steps):
      yield next(keys)
    return
  if not phase.eval_input_files:
    return
  from bert_jax.data.pipeline import eval_batches as data_eval_batches  # noqa: PLC0415 (imports TensorFlow)

  it = data_eval_batches(
    phase.eval_input_files,
    host_batch,
    phase.record_seq_length or phase.max_seq_length,
    phase.record_predictions or phase.max_predictions_per_seq,
    unmask=config.objective == "ltr",
  )
  if phase.packed:  # one instance per row, padded from the files' shapes to the phase's
    it = (pad_instances(b, phase.max_seq_length, phase.max_predictions_per_seq) for b in it)
  it = KeyFilter(it, batch_keys(config.objective))
  template = None
  for _ in range(config.max_eval_steps):
    batch = next(it, None)
    if jax.process_count() == 1:
      if batch is None:
        return
      yield batch
      continue
    if not np.any(multihost_utils.process_allgather(np.int32(batch is not None))):
      return  # every host is done
    if batch is not None:
      template = batch
    elif template is None:
      raise ValueError(
        f"{phase.eval_input_files}: no eval records for host "
        f"{jax.process_index()} of {jax.process_count()}"
      )
    else:  # this host is done, others are not: all-zero weights count for nothing
      batch = {k: np.zeros_like(v) for k, v in template.items()}
    yield batch
