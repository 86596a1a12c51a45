"""GLUE fine-tuning configs (all nine tasks), and the base every fine-tuning config builds on.

  python -m bert_jax.finetune --config configs/glue.py:rte --workdir /tmp/rte \
      --config.data_dir=../shared/data/glue --config.init_checkpoint=PATH_TO_BERT
  python -m bert_jax.evaluate --workdir /tmp/rte --split test      # writes RTE.tsv

The argument is the task: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli. Defaults are the
paper's fine-tuning recipe (appendix A.3): batch 32, 3 epochs, lr 2e-5 (the grid is lr in
{5e-5, 4e-5, 3e-5, 2e-5}, batch {16, 32}, epochs {2, 3, 4}: override ``learning_rate``,
``train_batch_size``, ``num_train_epochs`` and ``seed``), warmup 10% of the steps, dropout 0.1,
max_seq_length 128. ``init_checkpoint`` is a bert_jax workdir, a Hugging Face directory or a
google-research/bert TF checkpoint; its encoder is loaded, the head is new. Without one the
encoder is initialised from scratch with ``model_preset`` and a tokenizer from ``vocab_file``.
"""

from __future__ import annotations

import ml_collections

from bert_jax.tasks import GLUE_TASKS  # the task registry's names, defined once there
from configs import common


def finetune_base(task: str) -> ml_collections.ConfigDict:
  """Every knob of a fine-tuning run with its default (unlocked; callers add and lock)."""
  config = ml_collections.ConfigDict()
  config.task = task
  # Initialisation. init_checkpoint: bert_jax workdir / HF dir / TF checkpoint (encoder only).
  config.init_checkpoint = ""
  config.model_preset = "tiny"  # encoder size when init_checkpoint is empty (from scratch)
  config.vocab_file = ""  # tokenizer when init_checkpoint has none (or to override it)
  # A left-to-right (causal, is_decoder) checkpoint, e.g. pre-trained with objective=ltr:
  # "error" refuses it (the paper's tasks read bidirectional context), "causal" fine-tunes it with
  # its left-to-right attention, "bidirectional" uses its weights with full attention.
  config.causal_checkpoint = "error"
  config.do_lower_case = ml_collections.config_dict.placeholder(bool)  # None: the tokenizer's
  config.dtype = "float32"  # compute dtype; "bfloat16" for mixed precision
  config.remat = False  # rematerialise each layer in the backward pass
  config.hidden_dropout_prob = 0.1
  config.attention_probs_dropout_prob = 0.1
  # The new head's kernel: "normal" N(0, initializer_range^2) as Hugging Face initialises it, or
  # "truncated_normal" as google-research/bert does (std ~0.88 x initializer_range). At lr 2e-5
  # Adam moves a head weight by at most ~lr per step, so a short fine-tune keeps the head near
  # its initial scale, and the smaller one learns measurably less
  # (benchmarks/RESULTS_finetune_glue.md).
  config.head_init = "normal"
  # Training (google-research/bert flag names).
  config.max_seq_length = 128
  config.train_batch_size = 32  # global, over all hosts and devices
  config.eval_batch_size = 32
  config.learning_rate = 2e-5
  config.num_train_epochs = 3.0
  config.num_train_steps = 0  # > 0 overrides num_train_epochs
  config.warmup_proportion = 0.1
  config.num_warmup_steps = -1  # >= 0 overrides warmup_proportion
  config.grad_accum_steps = 1
  # Length bucketing (bert_jax/data/length_buckets.py): each train/eval batch is cut to the
  # shortest bucket holding its longest row; results are unchanged (padding is masked), and
  # each bucket compiles once. "32": multiples of 32 up to max_seq_length; "16,64,128": these
  # lengths; "": off (every batch at max_seq_length).
  config.length_buckets = "32"
  # Packing (bert_jax/runs/finetuning/inputs.py: Packer; GLUE and NER only, not with a defence):
  # each training step's rows (the same ones as unpacked) are packed several to a row of
  # max_seq_length, each its own [CLS] ... [SEP] attending only to itself, and the loss is the
  # same mean over them; dev/test rows are packed the same way and their predictions unpacked,
  # so the metrics are those of the unpacked model. Replaces length_buckets when on.
  config.packing = ml_collections.ConfigDict(
    dict(
      enabled=False,
      max_sequences_per_row=16,  # at most this many sequences in one packed row
    )
  )
  # Evaluation / checkpoints: evaluate on the dev split(s) every eval_every_steps (0 = at the
  # end of each epoch) and keep the best checkpoint by the task's primary metric.
  config.eval_every_steps = 0
  config.save_checkpoints_steps = 0  # 0 = only at evaluations
  config.keep_best = True
  config.predict_test = True  # after training, write test-set predictions (if the split exists)
  # Data slices for quick runs (0 = all).
  config.max_train_examples = 0
  config.max_eval_examples = 0
  common.add_common(config)
  config.seed = 42
  config.checkpoint.keep_checkpoint_max = 1
  config.checkpoint.async_save = False
  config.logging.log_every_steps = 50
  return config


def privacy_fields(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Private attributes and defences (docs/privacy.md), e.g. for CoLA:
  --config.private_attributes=cola_source --config.defence.name=multidetasking"""
  # "" none | "cola_source" (CoLA's source column) | "stsb_genre" (STS-B's genre column) |
  # "conll_per" (the top PER entities of private_attributes_file, present in the text or not).
  config.private_attributes = ""
  config.num_private_attributes = 5  # K: the K most frequent values of the training split
  config.private_attributes_file = ""  # conll_per: a CoNLL-2003 file (e.g. its train.txt)
  config.defence = ml_collections.ConfigDict()
  # "" none | "multidetasking" | "declustering" | "gradient_reversal" (not from the seed)
  config.defence.name = ""
  config.defence.alpha = 1.0  # weight of the main task's loss
  config.defence.beta = 1.0  # weight of the encoder's adversarial term
  config.defence.declustering_lambda = 0.1
  config.defence.adversary_hidden_size = 64
  config.defence.adversary_learning_rate = 1e-3  # the adversary's own Adam
  return config


def get_config(task: str = "sst2") -> ml_collections.ConfigDict:
  if task not in GLUE_TASKS:
    raise ValueError(f"unknown GLUE task {task!r}; choose one of {GLUE_TASKS}")
  config = finetune_base(task)
  config.data_source = "tsv"  # "tsv": GLUE TSV directory; "tfds": glue/<task> in tfds_data_dir
  config.data_dir = ""  # GLUE root (holding CoLA/, SST-2/, ...) or the task's folder
  config.tfds_data_dir = ""  # local TFDS data_dir with glue/* prepared (no download)
  config.skip_malformed_rows = False  # True: skip (and count) rows with missing fields / labels
  # With max_train_examples: -1 takes the first rows of the file; a seed >= 0 a uniform sample of
  # that many (in file order). GLUE files can be grouped (CoLA's train.tsv is sorted by source).
  config.train_sample_seed = -1
  privacy_fields(config)
  config.lock()
  return config
