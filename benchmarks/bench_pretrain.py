r"""Pre-training train-step throughput: bert_jax vs Hugging Face's FlaxBertForPreTraining.

  python -m benchmarks.bench_pretrain        # tiny..base, seq 128 and 512 (from the repo root)
  python -m benchmarks.bench_pretrain --sizes=tiny,mini --seq_lens=128 --repeats=3
  python -m benchmarks.bench_pretrain --sizes=base --tokens_per_step=1024   # a smaller batch

Both sides train the same BERT (vocab 30,522, dropout 0.1) on the same batches (random tokens,
15% masked, at most max_predictions_per_seq predictions) with the same optimizer (bert_jax's
AdamW: clip 1.0, weight decay 0.01 without LayerNorm/bias) and the same MLM + NSP loss, each
step one jitted function with donated params/optimizer state, on one device. The differences
are bert_jax's: it computes MLM logits only at the masked positions (as google-research/bert),
and so the last encoder layer too (only [CLS] and the masked rows are read), while HF's model
computes them at every position and the loss masks the rest; and its dropout draws 16 random
bits per element instead of 32 (bert_jax/model/dropout.py), which matters where the attention
probabilities (B x H x L x L) are large next to the matmuls (small models, seq 512). Runs are
interleaved (ours, HF, ours, HF, ...) and the median of ``--repeats`` timings of ``--steps``
steps is reported. MFU uses bert_jax's model-FLOPs formula (bert_jax/train/flops.py, MLM head at the
masked positions) for both, so it compares useful work; the peak is measured here with a large
float32 matmul (or given with --peak_flops).
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import optax
from absl import app, flags

from bert_jax import parallel
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.tasks.pretraining_loss import make_pretraining_loss
from bert_jax.tasks.synthetic_input import SyntheticPretrainInput
from bert_jax.train import flops as flops_lib
from bert_jax.train import optimizers
from bert_jax.train.state import init_train_state
from bert_jax.train.train_step import jit_train_step, make_train_step
from configs import common

_SIZES = flags.DEFINE_list("sizes", ["tiny", "mini", "small", "base"], "BertConfig presets")
_SEQ_LENS = flags.DEFINE_list("seq_lens", ["128", "512"], "sequence lengths")
_STEPS = flags.DEFINE_integer("steps", 5, "timed steps per run")
_REPEATS = flags.DEFINE_integer("repeats", 3, "interleaved runs per implementation")
_PEAK = flags.DEFINE_float("peak_flops", 0.0, "peak FLOP/s of the device; 0 = measure")
_TOKENS = flags.DEFINE_integer(
  "tokens_per_step",
  4096,
  "batch = tokens_per_step / seq (the same for both implementations); "
  "4096 is 32 sequences at 128 (the paper's 256 over 8 devices) and 8 at 512",
)
_PREDICTIONS = {128: 20, 512: 80}


def measure_peak_flops() -> float:
  n = 2048
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(5):
    t = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 / best


def _ours(bert: BertConfig, batch_size: int, seq: int, preds: int):
  model = BertForPreTraining(bert)
  mesh = parallel.create_mesh({"data": 1}, jax.devices()[:1])
  rules = parallel.normalize_rules(common.logical_axis_rules())
  tx = optimizers.create_optimizer(common.optimizer_config(), 1e-4)
  init = lambda rng: model.init(
    rng, *[jnp.zeros((1, seq), jnp.int32)] * 3, jnp.zeros((1, preds), jnp.int32)
  )["params"]
  state = init_train_state(init, tx, mesh, rules, seed=0)
  step = jit_train_step(
    make_train_step(make_pretraining_loss(model), tx, None, 1, mesh),
    jax.tree_util.tree_map(lambda x: x.sharding, state),
    mesh,
    rules,
  )
  holder = {"state": state}

  def run(batch):
    holder["state"], metrics = step(holder["state"], batch)
    return metrics["loss"]

  return run


def _hf(bert: BertConfig, batch_size: int, seq: int, preds: int):
  from transformers import BertConfig as HFConfig
  from transformers import FlaxBertForPreTraining

  hf_config = HFConfig(
    vocab_size=bert.vocab_size,
    hidden_size=bert.hidden_size,
    num_hidden_layers=bert.num_hidden_layers,
    num_attention_heads=bert.num_attention_heads,
    intermediate_size=bert.intermediate_size,
    hidden_act="gelu",
    max_position_embeddings=bert.max_position_embeddings,
  )
  model = FlaxBertForPreTraining(hf_config, seed=0)
  tx = optimizers.create_optimizer(common.optimizer_config(), 1e-4)
  params = model.params
  opt_state = tx.init(params)

  def loss_fn(params, batch, rng):
    out = model(
      batch["input_ids"],
      attention_mask=batch["input_mask"],
      token_type_ids=batch["segment_ids"],
      params=params,
      dropout_rng=rng,
      train=True,
    )
    logits_BxLxV = out.prediction_logits.astype(jnp.float32)
    b = batch["input_ids"].shape[0]
    # Labels at every position, -100-style: only masked positions (with weight 1) count.
    w_BxL = (
      jnp.zeros(batch["input_ids"].shape, jnp.float32)
      .at[jnp.arange(b)[:, None], batch["masked_lm_positions"]]
      .add(batch["masked_lm_weights"])
    )
    labels_BxL = (
      jnp.zeros(batch["input_ids"].shape, jnp.int32)
      .at[jnp.arange(b)[:, None], batch["masked_lm_positions"]]
      .set(batch["masked_lm_ids"])
    )
    xent = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, labels_BxL)
    mlm = jnp.sum(xent * w_BxL) / (jnp.sum(w_BxL) + 1e-5)
    nsp = optax.softmax_cross_entropy_with_integer_labels(
      out.seq_relationship_logits.astype(jnp.float32), batch["next_sentence_labels"]
    ).mean()
    return mlm + nsp

  def train_step(params, opt_state, batch, rng):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  step = jax.jit(train_step, donate_argnums=(0, 1))
  holder = {"params": params, "opt_state": opt_state, "i": 0}

  def run(batch):
    holder["i"] += 1
    holder["params"], holder["opt_state"], loss = step(
      holder["params"], holder["opt_state"], batch, jax.random.PRNGKey(holder["i"])
    )
    return loss

  return run


def _time(run, batches, steps) -> float:
  loss = None
  t = time.perf_counter()
  for i in range(steps):
    loss = run(batches[i % len(batches)])
  jax.block_until_ready(loss)
  return (time.perf_counter() - t) / steps


def main(argv):
  del argv
  peak = _PEAK.value or measure_peak_flops()
  print(
    f"device: {jax.devices()[0].device_kind} x1, jax {jax.__version__}; "
    f"peak (measured f32 matmul): {peak / 1e9:.1f} GFLOP/s"
  )
  rows = []
  for size in _SIZES.value:
    for seq in map(int, _SEQ_LENS.value):
      preds, batch_size = _PREDICTIONS[seq], max(1, _TOKENS.value // seq)
      bert = BertConfig.from_preset(size, vocab_size=30522)
      data = SyntheticPretrainInput(batch_size, seq, preds, bert.vocab_size, seed=0)
      host = [next(data) for _ in range(2)]
      batches = [{k: jnp.asarray(v) for k, v in b.items()} for b in host]
      runners = {
        "bert_jax": _ours(bert, batch_size, seq, preds),
        "hf_flax": _hf(bert, batch_size, seq, preds),
      }
      for run in runners.values():  # compile + warm up
        jax.block_until_ready(run(batches[0]))
        jax.block_until_ready(run(batches[1]))
      times = {name: [] for name in runners}
      for _ in range(_REPEATS.value):  # interleaved
        for name, run in runners.items():
          times[name].append(_time(run, batches, _STEPS.value))
      flops = flops_lib.train_flops_per_example(bert, seq, preds) * batch_size
      result = {}
      for name, ts in times.items():
        t = statistics.median(ts)
        result[name] = (batch_size * seq / t, flops / t / peak)
      speedup = result["bert_jax"][0] / result["hf_flax"][0]
      rows.append((size, seq, batch_size, result, speedup))
      print(
        f"{size:6s} seq {seq:3d} batch {batch_size:2d}: bert_jax "
        f"{result['bert_jax'][0]:9,.0f} tok/s (MFU {100 * result['bert_jax'][1]:5.1f}%)  "
        f"HF {result['hf_flax'][0]:9,.0f} tok/s (MFU {100 * result['hf_flax'][1]:5.1f}%)  "
        f"x{speedup:.2f}",
        flush=True,
      )
      del runners
  print(
    "\n| model | seq | batch | bert_jax tokens/s | bert_jax MFU | HF Flax tokens/s | HF MFU "
    "| speed-up |\n|---|---|---|---|---|---|---|---|"
  )
  for size, seq, b, r, s in rows:
    print(
      f"| {size} | {seq} | {b} | {r['bert_jax'][0]:,.0f} | {100 * r['bert_jax'][1]:.1f}% | "
      f"{r['hf_flax'][0]:,.0f} | {100 * r['hf_flax'][1]:.1f}% | {s:.2f}x |"
    )


if __name__ == "__main__":
  app.run(main)
