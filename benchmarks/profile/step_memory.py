r"""Per-chip memory of the compiled pre-training step on a TPU: bert_jax vs Hugging Face Flax BERT.

  python -m benchmarks.profile.step_memory                       # BERT-large, seq 512, v5e:2x2
  python -m benchmarks.profile.step_memory --size=base --seq=128 --per_chip_batch=64
  python -m benchmarks.profile.step_memory --topology=v4:2x2x1 --dtype=float32

Compiles each step with the XLA TPU compiler for the named topology (libtpu, no TPU: the
``tpu`` extra) and prints ``memory_analysis()`` per chip: arguments (params + optimizer state +
batch), temporaries (activations kept for the backward pass, gradients, workspace) and the total.
Data parallel over every chip, the same global batch of random pre-training inputs, params in
float32 and compute in ``--dtype``, AdamW (bert_jax's optimizer for all). bert_jax's step is
the one ``python -m bert_jax.pretrain`` runs (``bert_jax.plan.compiler``, configs/pretrain.py);
the peers are benchmarks/common/peers.py: Hugging Face's ``FlaxBertForPreTraining`` as shipped (MLM
logits at every position) and with the MLM head at the masked positions only. One semantic
difference is HF's, and it saves memory: its attention-probability dropout is
``broadcast_dropout=True``, one mask shared by every sequence and head of the batch, where BERT
(and bert_jax) drop each probability independently.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks.common import flags, peers
from bert_jax.model import BertConfig
from bert_jax.parallel.topology import parse_topology, topology_devices
from bert_jax.plan.compiler import compile_for_topology
from bert_jax.plan.report import compiled_memory
from bert_jax.train import optimizers
from configs import common, pretrain

_GB = 1e9


def _bert_jax(args, batch: int, seq: int, preds: int, num_chips: int) -> dict:
  """The run's own step (vocab 30,522 when compiling without data)."""
  c = pretrain.get_config(args.size)
  c.unlock()
  c.dtype = args.dtype
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = num_chips, 1, 1
  c.phase2.fraction = 0.0
  c.train_batch_size = batch
  c.max_seq_length = seq
  c.max_predictions_per_seq = preds
  result = compile_for_topology(c, parse_topology(args.topology), with_eval=False)
  return result["steps"][0]["memory"]


def _hf(args, variant: str, batch: int, seq: int, preds: int, devices, hbm_bytes: int) -> dict:
  bert = BertConfig.from_preset(args.size, vocab_size=30522)
  model = peers.hf_model(bert, dtype=jnp.dtype(args.dtype), do_init=False)
  tx = optimizers.create_optimizer(common.optimizer_config(), 1e-4)
  mesh = Mesh(np.asarray(devices), ("data",))
  rep, by_row = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

  def abstract(tree, sharding):
    return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree
    )

  params = abstract(
    jax.eval_shape(lambda r: model.init_weights(r, (1, seq)), jax.random.key(0)), rep
  )
  opt_state = abstract(jax.eval_shape(tx.init, params), rep)
  i32, f32 = jnp.int32, jnp.float32
  shapes = dict(
    input_ids=((batch, seq), i32),
    input_mask=((batch, seq), i32),
    segment_ids=((batch, seq), i32),
    masked_lm_positions=((batch, preds), i32),
    masked_lm_ids=((batch, preds), i32),
    masked_lm_weights=((batch, preds), f32),
    next_sentence_labels=((batch,), i32),
  )
  data = {k: jax.ShapeDtypeStruct(s, d, sharding=by_row) for k, (s, d) in shapes.items()}
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep)
  step = jax.jit(
    peers.hf_train_step(model, variant, tx),
    out_shardings=(rep, rep, rep),
    donate_argnums=(0, 1),
  )
  compiled = step.lower(params, opt_state, data, rng).compile()
  return compiled_memory(compiled, hbm_bytes)


def _parser():
  p = flags.parser(__doc__)
  p.add_argument("--size", default="large", help="pre-training preset (configs/pretrain.py)")
  p.add_argument("--seq", type=int, default=512, help="sequence length")
  p.add_argument(
    "--predictions", type=int, default=0, help="masked positions per sequence; 0: 20 / 80"
  )
  p.add_argument("--per_chip_batch", type=int, default=16, help="sequences per chip")
  p.add_argument("--topology", default="v5e:2x2", help="TPU topology (bert_jax.compile's names)")
  p.add_argument("--dtype", default="bfloat16", help="compute dtype (params stay float32)")
  flags.add_list(p, "which", ["bert_jax", *peers.VARIANTS], "steps to compile")
  return p


def main(argv=None):
  args = _parser().parse_args(argv)
  topo = parse_topology(args.topology)
  devices = topology_devices(topo)
  seq = args.seq
  preds = args.predictions or (20 if seq <= 128 else 80)
  batch = args.per_chip_batch * len(devices)
  print(
    f"{args.size}, seq {seq}, {preds} predictions, {args.dtype} compute, "
    f"{args.per_chip_batch} sequences per chip on {topo.describe()} (data parallel), jax {jax.__version__}"
  )
  rows = []
  for name in args.which:
    t = time.perf_counter()
    try:
      if name == "bert_jax":
        mem = _bert_jax(args, batch, seq, preds, len(devices))
      else:
        mem = _hf(args, name, batch, seq, preds, devices, topo.chip.hbm_bytes)
    except Exception as e:
      print(f"{name}: does not compile: {str(e).splitlines()[0][:300]}")
      continue
    secs = time.perf_counter() - t
    rows.append((name, mem))
    print(
      f"{name:15s} arguments {mem['argument_bytes'] / _GB:6.2f} GB  temporaries "
      f"{mem['temp_bytes'] / _GB:6.2f} GB  total {mem['total_bytes'] / _GB:6.2f} GB  "
      f"({secs:.0f} s to compile)",
      flush=True,
    )
  print("\n| step | arguments (GB) | temporaries (GB) | total (GB) |\n|---|---|---|---|")
  for name, mem in rows:
    print(
      f"| {name} | {mem['argument_bytes'] / _GB:.2f} | {mem['temp_bytes'] / _GB:.2f} | "
      f"{mem['total_bytes'] / _GB:.2f} |"
    )


if __name__ == "__main__":
  main()
