"""Pre-training configs: presets tiny..large; base and large are the paper's recipes.

  python -m bert_jax.pretrain --config configs/pretrain.py:tiny --workdir workdir/tiny
  python -m bert_jax.pretrain --config configs/pretrain.py:tiny --workdir workdir/tiny_ltr \
      --config.objective=ltr
  python -m bert_jax.pretrain --config configs/pretrain.py:base --workdir gs://b/base \
      --config.input_files='gs://b/data/seq128/*.tfrecord' \
      --config.phase2.input_files='gs://b/data/seq512/*.tfrecord' --config.mesh.fsdp=8

The preset picks the model size (``bert_jax.model.PRESETS``) and a run sized for it; ``base`` and
``large`` run the paper's recipe (appendix A.2): batch 256, 1M steps, lr 1e-4, 10k warmup steps,
weight decay 0.01, the last 10% of the steps at seq 512 with batch 256. Key names
follow google-research/bert's flags. The config is locked: overriding a key that does not exist
is an error. With no ``input_files`` the built-in default corpus is prepared under the workdir
(tokenizer, TFRecords at both phase lengths) and used.

Ablations (paper section 5, Tables 5, 6 and 8; docs/ablations.md):

* ``objective``: "mlm_nsp" (BERT: masked LM + next sentence), "mlm" (Table 5 "No NSP": no NSP
  head or loss; the built-in corpus is then generated as documents packed into full-length
  single segments), "ltr" (Table 5 "LTR & No NSP": left-to-right attention, next-token loss
  at every position on the unmasked text, same encoder and checkpoint layout);
* ``mask_rates``: what a chosen position becomes (Table 8: [MASK] / same / random token,
  80/10/10 by default), for static (built-in corpus) and dynamic masking alike; must sum to 1;
* ``whole_word_mask``: mask whole words (static generation of the built-in corpus, and
  ``dynamic_masking``);
* Table 6's sizes as presets: L3_H768_A12, L6_H768_A3, L6_H768_A12, L12_H768_A12 (= base),
  L12_H1024_A16, L24_H1024_A16 (= large), with the base recipe; held-out masked-LM perplexity is
  reported at each evaluation (``mlm_perplexity``; ``lm_perplexity`` for ltr);
* fine-tuning from any saved step (appendix C.1): keep the steps with
  ``checkpoint.keep_period`` and give the fine-tuning run
  ``--config.init_checkpoint=<workdir>/checkpoints/<step>``.

Curriculum (paper, appendix A.2): ``phase2.fraction`` of ``num_train_steps`` run last at
``phase2.max_seq_length`` with its own data, batch size and learning-rate schedule.

Packing (``packing.enabled``): each training row of ``max_seq_length`` holds several instances
of the files (first fit within the batch, in the reader's order), each with its own
[CLS] A [SEP] B [SEP], token types, positions from 0 and NSP label, and attending only to
itself; the losses are the unpacked ones over the same sequences (MLM: weighted mean over the masked tokens; NSP: mean
over the sequences). ``train_batch_size`` counts rows. The share of real tokens in the rows
(packed or not) is logged and written to summary.json (``input_token_share``).

Presets beyond the paper's: ``base_fast`` (see ``get_config``).
"""

from __future__ import annotations

import ml_collections

from configs import common

# name: (train_batch_size, num_train_steps, num_warmup_steps, learning_rate); base and large are
# Devlin et al. 2019, appendix A.2.
_RUNS = {
  "tiny": (32, 300, 30, 2e-3),
  "mini": (64, 10_000, 1_000, 5e-4),
  "small": (128, 100_000, 10_000, 3e-4),
  "medium": (128, 200_000, 10_000, 2e-4),
  "base": (256, 1_000_000, 10_000, 1e-4),
  "large": (256, 1_000_000, 10_000, 1e-4),
}
# Table 6's sizes: "the same hyperparameters and training procedure" as base (section 5.2).
_RUNS.update(
  {
    name: _RUNS["base"]
    for name in (
      "L3_H768_A12",
      "L6_H768_A3",
      "L6_H768_A12",
      "L12_H768_A12",
      "L12_H1024_A16",
      "L24_H1024_A16",
    )
  }
)


# Presets that change a size's recipe: name -> model size.
_RECIPES = {"base_fast": "base"}


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
  """The preset's config. ``base_fast`` is ``base`` (model, data, batch 256, 1M steps, lr 1e-4,
  the 128 -> 512 curriculum) departing from the paper's recipe in exactly these keys:

  * ``dtype="bfloat16"``: mixed-precision compute (parameters and optimizer state stay float32);
    the paper trains in float32;
  * ``attention_probs_dropout_prob=0.0``: no dropout on the attention probabilities (the paper:
    0.1); ``hidden_dropout_prob`` stays 0.1;
  * ``packing.enabled=True``: several instances per row (up to 4 at seq 128, 8 at seq 512),
    so a batch of 256 rows holds more sequences than the paper's 256;
  * ``attention_kernel="auto"``: a fused attention kernel where the platform has one (splash
    on TPUs, cuDNN's on GPUs; the reference path on CPUs), possible since attention dropout is 0.
  """
  if preset not in _RUNS and preset not in _RECIPES:
    raise ValueError(
      f"unknown pre-training preset {preset!r}; choose one of {sorted(_RUNS) + sorted(_RECIPES)} "
      "(base and large are the paper's recipes)"
    )
  size = _RECIPES.get(preset, preset)
  batch, steps, warmup, lr = _RUNS[size]

  config = ml_collections.ConfigDict()
  # Model: architecture from the BertConfig preset (vocab_size comes from the tokenizer);
  # bert_config_file (a bert_config.json / HF config.json) replaces the preset when set.
  config.model_preset = size
  config.bert_config_file = ""
  config.dtype = "float32"  # compute dtype: "bfloat16" for mixed precision (params stay fp32)
  config.remat = False  # rematerialise each layer in the backward pass
  # Dropout (the paper's 0.1 both); they replace bert_config_file's values. Attention dropout
  # > 0 needs the reference attention kernel (config.attention_kernel).
  config.hidden_dropout_prob = 0.1  # embeddings, attention output and feed-forward output
  config.attention_probs_dropout_prob = 0.1  # on the attention probabilities

  # Data. Empty input_files -> the built-in default corpus, prepared under default_corpus_dir
  # ('' = <workdir>/default_corpus). synthetic_data=True feeds random batches (benchmarks).
  config.input_files = ""
  config.eval_input_files = ""
  config.vocab_file = ""  # vocab.txt / SentencePiece .model / directory with either
  config.do_lower_case = True
  config.default_corpus_dir = ""
  config.synthetic_data = False
  config.shuffle_buffer_size = 10_000
  config.dynamic_masking = False  # re-draw the masks at every read (RoBERTa) instead of static

  # Objective and masking (the paper's ablations; see the module docstring).
  config.objective = "mlm_nsp"  # "mlm_nsp" (BERT) | "mlm" (no NSP) | "ltr" (left-to-right LM)
  config.mask_rates = ml_collections.ConfigDict(dict(mask=0.8, same=0.1, random=0.1))
  config.whole_word_mask = False

  # Packing: several instances per training row (see the module docstring). The files are read
  # at their own record length, which may be shorter than max_seq_length (never longer).
  config.packing = ml_collections.ConfigDict(
    dict(
      enabled=False,
      # phase 1: at most this many instances in a row (<= max_seq_length // 3: each instance
      # is at least [CLS] x [SEP]); a resume cannot change it, nor packing.enabled
      max_sequences_per_row=4,
      # prediction slots of a phase-1 row; 0 = min(max_predictions_per_seq x sequences,
      # ceil(masked_lm_prob x max_seq_length) + sequences): what the instances can mask;
      # at most max_seq_length - 2 (a row's non-special tokens)
      max_predictions_per_row=0,
    )
  )

  # Phase 1 (google-research/bert flag names).
  config.train_batch_size = batch  # global, over all hosts and devices
  config.eval_batch_size = min(batch, 64)
  config.max_seq_length = 128
  config.max_predictions_per_seq = 20
  config.masked_lm_prob = 0.15
  config.learning_rate = lr
  config.num_train_steps = steps  # total, both phases
  config.num_warmup_steps = warmup
  config.grad_accum_steps = 1  # micro-batches per step; each has train_batch_size / this

  # Phase 2: the last `fraction` of the steps at longer sequences. learning_rate < 0 continues
  # phase 1's schedule; >= 0 starts a new warmup (num_warmup_steps) then linear decay to 0.
  config.phase2 = ml_collections.ConfigDict(
    dict(
      fraction=0.1,
      max_seq_length=512,
      max_predictions_per_seq=80,
      train_batch_size=batch // 4 if size in ("tiny", "mini") else batch,
      learning_rate=-1.0,
      num_warmup_steps=0,
      input_files="",
      eval_input_files="",
      grad_accum_steps=1,
      max_sequences_per_row=8,  # with config.packing.enabled: phase 2's (as packing's)
      max_predictions_per_row=0,
    )
  )
  if size == "tiny":  # short enough for CI: phase 2 covers the last 10% at seq 512
    config.phase2.train_batch_size = 8

  config.save_checkpoints_steps = max(steps // 10, 1) if size == "tiny" else 5_000
  config.eval_every_steps = max(steps // 5, 1) if size == "tiny" else 10_000
  config.max_eval_steps = 10 if size == "tiny" else 100
  config.init_checkpoint = ""  # bert_jax workdir / HF directory / TF checkpoint (params only)

  common.add_common(config)
  if size == "tiny":
    config.logging.log_every_steps = 50
  if preset == "base_fast":
    config.dtype = "bfloat16"
    config.attention_probs_dropout_prob = 0.0
    config.packing.enabled = True
    config.attention_kernel = "auto"

  config.lock()
  return config
