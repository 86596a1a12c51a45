r"""Pre-training train-step throughput: bert_jax vs Hugging Face's FlaxBertForPreTraining.

  python -m benchmarks.speed.pretrain        # tiny..base, seq 128 and 512 (from the repo root)
  python -m benchmarks.speed.pretrain --sizes=tiny,mini --seq_lens=128 --repeats=3
  python -m benchmarks.speed.pretrain --sizes=base --tokens_per_step=1024   # a smaller batch
  python -m benchmarks.speed.pretrain --dtype=bfloat16     # mixed precision on every side
  python -m benchmarks.speed.pretrain --sizes=base --seq_lens=128 --profile \
      --peers=torch_masked --steps=2          # where each step's time goes, per op and kind
  python -m benchmarks.speed.pretrain --sizes=base --dtype=bfloat16 --tokens_per_step=32768 \
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
profiled per op (benchmarks/profile/step_profile.py: XLA:CPU's thunks, PyTorch's
profiler) and grouped into matmul / reduce / elementwise / random bits / gather-scatter / copy,
with the ``--profile_ops`` longest ops listed.

Like the entry points, the benchmark first restarts itself with glibc's malloc on transparent
huge pages where that helps (bert_jax/hugepages.py), so every implementation in the process
runs with the same host allocator; ``BERT_JAX_HUGEPAGES=0`` measures them all without it.
"""

from __future__ import annotations

import os
import statistics

import jax
import jax.numpy as jnp

from benchmarks.common import flags, peers
from benchmarks.common.pretrain_step import PretrainingStepper
from benchmarks.common.timing import Timer
from benchmarks.profile import step_profile
from benchmarks.profile.host_peak import measure_peak_flops
from bert_jax import hugepages, parallel
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.tasks.pretraining.loss import make_pretraining_loss
from bert_jax.tasks.pretraining.synthetic_input import SyntheticPretrainInput
from bert_jax.train import flops as flops_lib
from bert_jax.train import optimizers
from configs import common

_PREDICTIONS = {128: 20, 512: 80}


def bert_jax_step(bert: BertConfig, batch_size: int, seq: int, preds: int):
  model = BertForPreTraining(bert)
  mesh = parallel.create_mesh({"data": 1}, jax.devices()[:1])
  rules = parallel.normalize_rules(common.logical_axis_rules())
  tx = optimizers.create_optimizer(common.optimizer_config(), 1e-4)
  return PretrainingStepper(model, make_pretraining_loss(model), tx, mesh, rules, seq, preds)


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
  return Timer(calls=steps).time(lambda i: run(batches[i % len(batches)])).mean


def _runner(name: str, bert: BertConfig, batch_size: int, seq: int, preds: int):
  """``(run, wants_host_batch)``: torch takes numpy batches, the JAX steps device arrays."""
  if name == "bert_jax":
    return bert_jax_step(bert, batch_size, seq, preds), False
  if name in ("torch_masked", "torch_compiled"):
    return _torch(bert, compiled=name == "torch_compiled"), True
  return _hf(name, bert), False


def _profile(args, runners, host, device) -> None:
  profiles = {}
  for name, (run, wants_host) in runners.items():
    if wants_host:
      profiles[name] = step_profile.torch_profile(run, host, args.steps, args.profile_ops)
    else:
      text = run.hlo(device[0])
      profiles[name] = step_profile.jax_profile(run, device, args.steps, text, args.profile_ops)
  print(step_profile.format_profiles(profiles), flush=True)


def _parser():
  p = flags.parser(__doc__)
  flags.add_list(p, "sizes", ["tiny", "mini", "small", "base"], "BertConfig presets")
  flags.add_list(p, "seq_lens", ["128", "512"], "sequence lengths")
  p.add_argument("--steps", type=int, default=5, help="timed steps per run")
  p.add_argument("--repeats", type=int, default=3, help="interleaved runs per implementation")
  p.add_argument(
    "--peak_flops", type=float, default=0.0, help="peak FLOP/s of the device; 0 = measure"
  )
  p.add_argument(
    "--tokens_per_step",
    type=int,
    default=4096,
    help="batch = tokens_per_step / seq (the same for both implementations); "
    "4096 is 32 sequences at 128 (the paper's 256 over 8 devices) and 8 at 512",
  )
  flags.add_list(
    p,
    "peers",
    ["hf_flax", "hf_flax_masked", "torch_masked"],
    "peers run beside bert_jax (benchmarks/common/peers.py): hf_flax, hf_flax_masked, "
    "torch_masked, torch_compiled (torch_masked under torch.compile)",
  )
  p.add_argument(
    "--dtype",
    default="float32",
    choices=["float32", "bfloat16"],
    help="compute dtype of every implementation (params and optimizer state stay float32): "
    "bert_jax's config.dtype, HF Flax's dtype, PyTorch's autocast to bfloat16",
  )
  flags.add_bool(p, "profile", False, "profile each step per op instead of timing it")
  p.add_argument(
    "--profile_ops",
    type=int,
    default=10,
    help="with --profile: how many of the longest ops (and non-matmul ops) to list",
  )
  return p


def main(argv=None):
  args = _parser().parse_args(argv)
  hugepages.restart_with_hugepages()  # before any work: it re-executes this command
  if args.profile:  # before JAX starts its CPU backend
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {step_profile.TRACEME_FLAG}"
  peak = args.peak_flops or measure_peak_flops()
  print(
    f"device: {jax.devices()[0].device_kind} x1, jax {jax.__version__}, {args.dtype}; "
    f"peak (measured f32 matmul): {peak / 1e9:.1f} GFLOP/s; "
    f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}"
  )
  names = ["bert_jax", *args.peers]
  rows = []
  for size in args.sizes:
    for seq in map(int, args.seq_lens):
      preds, batch_size = _PREDICTIONS[seq], max(1, args.tokens_per_step // seq)
      bert = BertConfig.from_preset(size, vocab_size=30522, dtype=args.dtype)
      data = SyntheticPretrainInput(batch_size, seq, preds, bert.vocab_size, seed=0)
      host = [next(data) for _ in range(2)]
      device = [{k: jnp.asarray(v) for k, v in b.items()} for b in host]
      runners = {n: _runner(n, bert, batch_size, seq, preds) for n in names}
      for run, wants_host in runners.values():  # compile + warm up
        for b in host if wants_host else device:
          float(run(b))
      if args.profile:
        print(f"\n{size}, seq {seq}, batch {batch_size}:")
        _profile(args, runners, host, device)
        continue
      times = {name: [] for name in runners}
      for _ in range(args.repeats):  # interleaved
        for name, (run, wants_host) in runners.items():
          times[name].append(_time(run, host if wants_host else device, args.steps))
      flops = flops_lib.train_flops_per_example(bert, seq, preds) * batch_size
      result = {}
      for name, ts in times.items():
        t = statistics.median(ts)
        result[name] = (batch_size * seq / t, flops / t / peak)
      best_peer = max((result[n][0] for n in args.peers), default=float("nan"))
      rows.append((size, seq, batch_size, result, result["bert_jax"][0] / best_peer))
      print(
        f"{size:6s} seq {seq:3d} batch {batch_size:2d}: "
        + "  ".join(f"{n} {result[n][0]:,.0f} tok/s ({100 * result[n][1]:.1f}%)" for n in names)
        + f"  bert_jax / best peer x{rows[-1][-1]:.2f}",
        flush=True,
      )
      del runners
  if args.profile:
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
  main()
