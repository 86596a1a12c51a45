"""What the GLUE benchmarks share (benchmarks/quality/finetune_glue.py runs, and
benchmarks/speed/finetune_steps.py times): bert_jax's runner config for a task and seed under the
benchmark's flags, the model and params the runner starts from, and the Hugging Face side's
encoding and batching of GLUE rows."""

from __future__ import annotations

import flax
import jax
import numpy as np

from bert_jax.checkpoint import merge_pretrained_params
from bert_jax.formats import load_pretrained
from bert_jax.tasks import create_task
from bert_jax.tasks.glue.data import read_tsv
from configs import glue


def bert_jax_config(task: str, seed: int, args):
  """The runner's config for ``task`` and ``seed`` under this benchmark's flags."""
  c = glue.get_config(task)
  c.data_dir, c.init_checkpoint = args.glue_dir, args.init_checkpoint
  c.max_seq_length, c.train_batch_size = args.max_seq_length, args.train_batch_size
  c.eval_batch_size, c.learning_rate = args.eval_batch_size, args.learning_rate
  c.num_train_epochs, c.seed, c.predict_test = args.num_train_epochs, seed, False
  c.max_train_examples, c.max_eval_examples = args.max_train_examples, args.max_eval_examples
  c.keep_best = False
  c.length_buckets = args.length_buckets
  c.optimizer.schedule = args.schedule
  c.head_init = args.head_init
  c.compilation_cache.dir = args.compilation_cache_dir
  c.logging.log_every_steps = 50
  return c


def hf_encode(tok, spec, path, limit, max_len, pad):
  """The GLUE file at ``path`` (its first ``limit`` rows; 0: all) through the Hugging Face
  tokenizer ``tok`` (padded to ``max_len`` as tensors when ``pad``), and its labels."""
  ex, _ = read_tsv(spec, path, True)
  ex = ex[:limit] if limit else ex
  enc = tok(
    [e.text_a for e in ex],
    [e.text_b for e in ex] if spec.text_b else None,
    truncation="longest_first",
    max_length=max_len,
    padding="max_length" if pad else False,
    return_tensors="pt" if pad else None,
  )
  labels = np.array([e.label for e in ex], np.float32 if spec.is_regression else np.int64)
  return enc, labels


HF_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def hf_batch(enc, idx, pad_to, torch):
  """Rows ``idx`` as tensors: already padded (``pad_to``: tensors indexed directly) or padded
  here to the batch's longest row (``pad_to`` None; 0 is the pad value of all three)."""
  idx = list(idx)
  if pad_to:
    return {k: enc[k][torch.as_tensor(idx)] for k in HF_KEYS}
  length = max(len(enc["input_ids"][i]) for i in idx)
  return {
    k: torch.tensor([list(enc[k][i]) + [0] * (length - len(enc[k][i])) for i in idx])
    for k in HF_KEYS
  }


def bert_jax_setup(task: str, seed: int, args):
  """(config, task, model, params) as bert_jax's runner starts ``task`` for ``seed``: the new
  head drawn from the first half of the split seed key (as ``bert_jax.train.state`` does) under
  ``--head_init``, the encoder from ``--init_checkpoint``; params unboxed, on the host."""
  c = bert_jax_config(task, seed, args)
  pre = load_pretrained(c.init_checkpoint)
  t = create_task(c, pre.tokenizer)
  model = t.build_model(pre.config)
  init_rng, _ = jax.random.split(jax.random.PRNGKey(c.seed))
  params = flax.linen.meta.unbox(
    jax.jit(lambda rng: t.init_variables(model, rng, 1)["params"])(init_rng)
  )
  params, _ = merge_pretrained_params(dict(params), {"bert": pre.params["bert"]}, c.init_checkpoint)
  return c, t, model, params
