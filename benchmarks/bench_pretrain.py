r"""Pre-training train-step throughput: bert_jax vs Hugging Face's FlaxBertForPreTraining.

  python -m benchmarks.bench_pretrain        # tiny..base, seq 128 and 512 (from the repo root)
  python -m benchmarks.bench_pretrain --sizes=tiny,mini --seq_lens=128 --repeats=3
  python -m benchmarks.bench_pretrain --sizes=base --tokens_per_step=1024   # a smaller batch
  python -m benchmarks.bench_pretrain --dtype=bfloat16     # mixed precision on every side
  python -m benchmarks.bench_pretrain --sizes=base --seq_lens=128 --profile \
      --peers=torch_masked --steps=2          # where each step's time goes, per op and kind
  python -m benchmarks.bench_pretrain --sizes=base --dtype=bfloat16 --tokens_per_step=32768 \
      --peers=hf_flax_masked,torch_masked --peak_flops=989e12   # on a GPU host (H100 / H200)

Both sides train the same BERT (vocab 30,522, dropout 0.1) on the same batches (random tokens,
15% masked, at most max_predictions_per_seq predictions) with the same optimizer (bert_jax's
AdamW: clip 1.0, weight decay 0.01 without LayerNorm/bias) and the same MLM + NSP loss, each
step one jitted function with donated params/optimizer state, on one device (jax's default
device; PyTorch runs on the GPU when jax does, else on the CPU). The differences
are bert_jax's: it computes MLM logits only at the masked positions (as google-research/bert),
and so the last encoder layer too (only [CLS] and the masked rows are read), while HF's model
computes them at every position and the loss masks the rest; and its dropout draws 16 random
bits per element instead of 32 (bert_jax/model/kernels/dropout.py), which matters where the attention
probabilities (B x H x L x L) are large next to the matmuls (small models, seq 512). Runs are
interleaved (ours, HF, ours, HF, ...) and the median of ``--repeats`` timings of ``--steps``
steps, each after one untimed step, is reported. MFU uses bert_jax's model-FLOPs formula
(bert_jax/train/flops.py, MLM head at the masked positions) for both, so it compares useful
work; the peak is measured here with a large float32 matmul (or given with --peak_flops), also
for ``--dtype=bfloat16`` runs. ``--profile``: instead of the table, each implementation's step
profiled per op (benchmarks/step_profile.py: XLA:CPU's thunks, PyTorch's
profiler) and grouped into matmul / reduce / elementwise / random bits / gather-scatter / copy,
with the ``--profile_ops`` longest ops listed.

Like the entry points, the benchmark first restarts itself with glibc's malloc on transparent
huge pages where that helps (bert_jax/hugepages.py), so every implementation in the process
runs with the same host allocator; ``BERT_JAX_HUGEPAGES=0`` measures them all without it.
"""

from __future__ import annotations

import os
import statistics
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from benchmarks import peers, step_profile
from benchmarks.host_peak import measure_peak_flops
from bert_jax import hugepages, parallel
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.tasks.pretraining.loss import make_pretraining_loss
from bert_jax.tasks.pretraining.synthetic_input import SyntheticPretrainInput
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
_PEERS = flags.DEFINE_list(
  "peers",
  ["hf_flax", "hf_flax_masked", "torch_masked"],
  "peers run beside bert_jax (benchmarks/peers.py): hf_flax, hf_flax_masked, torch_masked, "
  "torch_compiled (torch_masked under torch.compile)",
)
_DTYPE = flags.DEFINE_enum(
  "dtype",
  "float32",
  ["float32", "bfloat16"],
  "compute dtype of every implementation (params and optimizer state stay float32): bert_jax's "
  "config.dtype, HF Flax's dtype, PyTorch's autocast to bfloat16",
)
_PROFILE = flags.DEFINE_bool("profile", False, "profile each step per op instead of timing it")
_PROFILE_OPS = flags.DEFINE_integer(
  "profile_ops", 10, "with --profile: how many of the longest ops (and non-matmul ops) to list"
)
_PREDICTIONS = {128: 20, 512: 80}


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

  def hlo(batch) -> str:
    with parallel.mesh_context(mesh, rules):
      return step.jitted.lower(holder["state"], batch).compile().as_text()

  run.hlo = hlo
  return run


def _hf(variant: str, bert: BertConfig):
  model = peers.hf_model(bert, dtype=jnp.dtype(bert.dtype))
  tx = optimizers.create_optimizer(common.optimizer_config(), 1e-4)
  step = jax.jit(peers.hf_train_step(model, variant, tx), donate_argnums=(0, 1))
  holder = {"params": model.params, "opt_state": tx.init(model.params), "i": 0}

  def run(batch):
    holder["i"] += 1
    holder["params"], holder["opt_state"], loss = step(
      holder["params"], holder["opt_state"], batch, jax.random.PRNGKey(holder["i"])
    )
    return loss

  run.hlo = lambda batch: (
    step.lower(holder["params"], holder["opt_state"], batch, jax.random.PRNGKey(0))
    .compile()
    .as_text()
  )
  return run


def _torch(bert: BertConfig, compiled: bool):
  """On jax's platform: a CPU, or the GPU when jax runs on one (CUDA)."""
  device = "cuda" if jax.default_backend() == "gpu" else "cpu"
  return peers.torch_step(bert, dtype=bert.dtype, device=device, compiled=compiled)


def _time(run, batches, steps) -> float:
  """Seconds per step over ``steps`` steps, after one untimed step: each run is timed in its
  steady state, not paying for the memory the implementation before it left behind (an HF
  Flax run right after bert_jax's measured 12-19% slower without it)."""
  float(run(batches[-1]))
  loss = None
  t = time.perf_counter()
  for i in range(steps):
    loss = run(batches[i % len(batches)])
  float(loss)  # waits for the last step: a jax array or a torch tensor, on any device
  return (time.perf_counter() - t) / steps


def _runner(name: str, bert: BertConfig, batch_size: int, seq: int, preds: int):
  """``(run, wants_host_batch)``: torch takes numpy batches, the JAX steps device arrays."""
  if name == "bert_jax":
    return _ours(bert, batch_size, seq, preds), False
  if name in ("torch_masked", "torch_compiled"):
    return _torch(bert, compiled=name == "torch_compiled"), True
  return _hf(name, bert), False


def _profile(runners, host, device) -> None:
  profiles = {}
  for name, (run, wants_host) in runners.items():
    if wants_host:
      profiles[name] = step_profile.torch_profile(run, host, _STEPS.value, _PROFILE_OPS.value)
    else:
      text = run.hlo(device[0])
      profiles[name] = step_profile.jax_profile(run, device, _STEPS.value, text, _PROFILE_OPS.value)
  print(step_profile.format_profiles(profiles), flush=True)


def main(argv):
  del argv
  hugepages.restart_with_hugepages()  # before any work: it re-executes this command
  if _PROFILE.value:  # before JAX starts its CPU backend
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {step_profile.TRACEME_FLAG}"
  peak = _PEAK.value or measure_peak_flops()
  print(
    f"device: {jax.devices()[0].device_kind} x1, jax {jax.__version__}, {_DTYPE.value}; "
    f"peak (measured f32 matmul): {peak / 1e9:.1f} GFLOP/s; "
    f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}"
  )
  names = ["bert_jax", *_PEERS.value]
  rows = []
  for size in _SIZES.value:
    for seq in map(int, _SEQ_LENS.value):
      preds, batch_size = _PREDICTIONS[seq], max(1, _TOKENS.value // seq)
      bert = BertConfig.from_preset(size, vocab_size=30522, dtype=_DTYPE.value)
      data = SyntheticPretrainInput(batch_size, seq, preds, bert.vocab_size, seed=0)
      host = [next(data) for _ in range(2)]
      device = [{k: jnp.asarray(v) for k, v in b.items()} for b in host]
      runners = {n: _runner(n, bert, batch_size, seq, preds) for n in names}
      for run, wants_host in runners.values():  # compile + warm up
        for b in host if wants_host else device:
          float(run(b))
      if _PROFILE.value:
        print(f"\n{size}, seq {seq}, batch {batch_size}:")
        _profile(runners, host, device)
        continue
      times = {name: [] for name in runners}
      for _ in range(_REPEATS.value):  # interleaved
        for name, (run, wants_host) in runners.items():
          times[name].append(_time(run, host if wants_host else device, _STEPS.value))
      flops = flops_lib.train_flops_per_example(bert, seq, preds) * batch_size
      result = {}
      for name, ts in times.items():
        t = statistics.median(ts)
        result[name] = (batch_size * seq / t, flops / t / peak)
      best_peer = max((result[n][0] for n in _PEERS.value), default=float("nan"))
      rows.append((size, seq, batch_size, result, result["bert_jax"][0] / best_peer))
      print(
        f"{size:6s} seq {seq:3d} batch {batch_size:2d}: "
        + "  ".join(f"{n} {result[n][0]:,.0f} tok/s ({100 * result[n][1]:.1f}%)" for n in names)
        + f"  bert_jax / best peer x{rows[-1][-1]:.2f}",
        flush=True,
      )
      del runners
  if _PROFILE.value:
    return
  print(
    "\n| model | seq | batch | "
    + " | ".join(f"{n} tokens/s (MFU)" for n in names)
    + " | bert_jax / best peer |\n|"
    + "---|" * (len(names) + 4)
  )
  for size, seq, b, r, s in rows:
    cells = " | ".join(f"{r[n][0]:,.0f} ({100 * r[n][1]:.1f}%)" for n in names)
    print(f"| {size} | {seq} | {b} | {cells} | {s:.2f}x |")


if __name__ == "__main__":
  app.run(main)
