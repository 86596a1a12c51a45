"""Where pre-training batches come from: configured TFRecords, the built-in corpus, or random.

  sources = resolve_data(config, workdir)      # tokenizer + per-phase train/eval files
  make_input = input_factory(config, sources, phase_cfg, host_batch_size)
  for batch in eval_batches(config, sources, phase_cfg): ...

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

from bert_jax.tasks.synthetic_input import SyntheticPretrainInput


@dataclasses.dataclass
class PhaseData:
  max_seq_length: int
  max_predictions_per_seq: int
  input_files: str
  eval_input_files: str


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


def _prepare_default(config, workdir: str, lengths, predictions):
  from bert_jax.data.default_corpus import prepare_default_data  # noqa: PLC0415

  out_dir = config.default_corpus_dir or os.path.join(workdir, "default_corpus")
  kwargs = dict(
    max_seq_lengths=tuple(lengths),
    max_predictions_per_seq=tuple(predictions),
    random_seed=config.seed,
    **_default_corpus_settings(config),
  )
  if jax.process_index() == 0:
    logging.info("No input_files configured: preparing the built-in corpus in %s", out_dir)
    data = prepare_default_data(out_dir, progress=True, **kwargs)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # noqa: PLC0415

    multihost_utils.sync_global_devices("bert_jax default corpus prepared")
    if jax.process_index() != 0:
      data = prepare_default_data(out_dir, **kwargs)
  return data


def mask_rates(config):
  """``config.mask_rates`` as the data layer's MaskRates (ValueError naming the keys)."""
  from bert_jax.data.masking import MaskRates  # noqa: PLC0415

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
  from bert_jax.data.tfrecord import records_have_sentence_pairs  # noqa: PLC0415

  for phase, prefix in zip(phases, ("", "phase2.")):
    if not records_have_sentence_pairs(
      phase.input_files, phase.max_seq_length, phase.max_predictions_per_seq
    ):
      raise ValueError(
        f"config.objective='mlm_nsp' needs sentence pairs for next-sentence prediction, but "
        f"config.{prefix}input_files ({phase.input_files}) holds single segments (no segment "
        "1): generate pairs (create_pretraining_data --sentence_pairs=true) or set "
        "config.objective='mlm' (no NSP) / 'ltr'"
      )


def abstract_sources(config) -> DataSources:
  """Each phase's shapes without reading or writing anything (for compiling a run's steps):
  no tokenizer; the vocabulary size is BERT's 30,522 unless config.bert_config_file sets it."""
  return DataSources(None, 30522, [PhaseData(l, p, "", "") for l, p, *_ in _phase_settings(config)])


def resolve_data(config, workdir: str) -> DataSources:
  """The tokenizer and each phase's files; ValueError naming the config key when missing."""
  settings = _phase_settings(config)
  if config.synthetic_data:
    vocab = 30522 if not config.vocab_file else None
    tokenizer = None
    if config.vocab_file:
      from bert_jax.tokenize import load_tokenizer  # noqa: PLC0415

      tokenizer = load_tokenizer(config.vocab_file, do_lower_case=config.do_lower_case)
      vocab = tokenizer.vocab_size
    return DataSources(tokenizer, vocab, [PhaseData(l, p, "", "") for l, p, *_ in settings])

  from bert_jax.tokenize import load_tokenizer  # noqa: PLC0415

  if not config.input_files:
    lengths = [s[0] for s in settings]
    predictions = [s[1] for s in settings]
    if len(set(lengths)) != len(lengths):
      raise ValueError(
        "the built-in corpus needs distinct max_seq_length per phase; got "
        f"{lengths} (config.max_seq_length, config.phase2.max_seq_length)"
      )
    data = _prepare_default(config, workdir, lengths, predictions)
    tokenizer = load_tokenizer(config.vocab_file or data.vocab_file, do_lower_case=True)
    phases = [
      PhaseData(l, p, data.train_files[l], data.eval_files[l]) for l, p in zip(lengths, predictions)
    ]
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
  check_sentence_pairs(config, phases)
  tokenizer = load_tokenizer(config.vocab_file, do_lower_case=config.do_lower_case)
  return DataSources(tokenizer, tokenizer.vocab_size, phases)


def input_factory(config, sources: DataSources, phase: PhaseData, host_batch: int):
  """A function making this host's resumable training iterator for ``phase``."""

  def make():
    if config.synthetic_data:
      mask_id = sources.tokenizer.mask_id if sources.tokenizer is not None else 4
      synthetic = SyntheticPretrainInput(
        host_batch,
        phase.max_seq_length,
        phase.max_predictions_per_seq,
        sources.vocab_size,
        seed=config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        mask_id=mask_id,
      )
      return KeyFilter(synthetic, batch_keys(config.objective))
    from bert_jax.data.pipeline import PretrainInput, log_input  # noqa: PLC0415

    ltr = config.objective == "ltr"
    inp = PretrainInput(
      phase.input_files,
      host_batch,
      phase.max_seq_length,
      phase.max_predictions_per_seq,
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
    return KeyFilter(inp, batch_keys(config.objective))

  return make


def batch_keys(objective: str) -> tuple[str, ...]:
  """The batch features ``objective`` reads."""
  keys = ("input_ids", "input_mask", "segment_ids")
  if objective == "ltr":
    return keys
  keys += ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
  return keys + ("next_sentence_labels",) if objective == "mlm_nsp" else keys


class KeyFilter:
  """An input iterator passing on only ``keys`` (and ``example_weights``) of each batch; its
  position (get_state / set_state) is the wrapped iterator's."""

  def __init__(self, inner, keys: tuple[str, ...]):
    self.inner = inner
    self.keys = frozenset(keys) | {"example_weights"}

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return {k: v for k, v in next(self.inner).items() if k in self.keys}

  def get_state(self) -> dict:
    return self.inner.get_state()

  def set_state(self, state: dict) -> None:
    self.inner.set_state(state)


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
  from bert_jax.data.pipeline import eval_batches as data_eval_batches  # noqa: PLC0415

  it = data_eval_batches(
    phase.eval_input_files,
    host_batch,
    phase.max_seq_length,
    phase.max_predictions_per_seq,
    unmask=config.objective == "ltr",
  )
  it = KeyFilter(it, batch_keys(config.objective))
  template = None
  for _ in range(config.max_eval_steps):
    batch = next(it, None)
    if jax.process_count() == 1:
      if batch is None:
        return
      yield batch
      continue
    from jax.experimental import multihost_utils  # noqa: PLC0415

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
