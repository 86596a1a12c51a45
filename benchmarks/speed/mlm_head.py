"""The MLM head alone: what a fused linear + cross-entropy kernel could save on this CPU.

  python -m benchmarks.speed.mlm_head                      # hidden 128 and 256 (tiny, mini)
  python -m benchmarks.speed.mlm_head --hidden=128,256,512 --rows=640

Times, jitted, the loss and gradient (to the hidden rows, the tied table and the bias) of the
MLM decoder over ``--rows`` predictions (640: 32 sequences of 128 with 20 masked, a 4,096-token
step) and BERT's 30,522-word vocabulary, float32, medians of ``--calls`` calls, ``--rounds``
rounds interleaved. Variants:

* ``bert_jax``: the step's head as it runs (``matmul.tied_logits``, ``matmul.add_vocab_bias``,
  the cross-entropy and accuracy of ``tasks/pretraining/loss.py``).
* ``padded_<V>``: the same with the table padded by zero rows and the bias by -1e9 to V words
  (the GEMM-friendly vocabulary sizes other frameworks pad to); the loss is the same.
* ``fused_floor``: the three products (logits, and the gradient's two) with a single
  elementwise pass between them that reads the logits and writes a gradient: what a perfect
  fused linear + cross-entropy kernel would leave (its own arithmetic counted as free).
* ``products``: the three products alone.
* ``torch_products``: the same three products in PyTorch (float32, two threads or the host's
  cores, whichever is fewer), if it is installed: another CPU GEMM library on the same shapes.

``bert_jax`` minus ``fused_floor`` bounds what such a kernel (a custom call; nothing in jax,
XLA:CPU's fusions or optax computes it in one pass) could take off a step. Huge pages as the
entry points use them (bert_jax/hugepages.py).
"""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import flags
from benchmarks.common.timing import Timer
from bert_jax import hugepages
from bert_jax.model.kernels import matmul
from bert_jax.model.kernels.matmul import add_vocab_bias
from bert_jax.tasks.pretraining import loss as pretraining_loss


def _head_loss(padded_to: int | None):
  def loss(h_RxD, table_VxD, bias_V, ids_R):
    if padded_to:
      extra = padded_to - table_VxD.shape[0]
      table_VxD = jnp.concatenate([table_VxD, jnp.zeros((extra, table_VxD.shape[1]))])
      bias_V = jnp.concatenate([bias_V, jnp.full((extra,), -1e9, bias_V.dtype)])
    logits_1xRxV = add_vocab_bias(matmul.tied_logits(h_RxD, table_VxD, jnp.float32), bias_V)[None]
    w_1xR = jnp.ones((1, ids_R.shape[0]), jnp.float32)
    terms = pretraining_loss.xent_terms(logits_1xRxV, ids_R[None], w_1xR, "mlm")
    return terms["mlm_loss_sum"], terms["mlm_correct"]

  return loss


@jax.custom_vjp
def _one_pass(logits_RxV):
  return jnp.sum(logits_RxV)


def _one_pass_fwd(logits_RxV):  # one read of the logits, one write of a "gradient"
  return jnp.sum(logits_RxV), logits_RxV * 0.5


def _one_pass_bwd(grad_RxV, g):
  return (grad_RxV * g,)


_one_pass.defvjp(_one_pass_fwd, _one_pass_bwd)


def _floor_loss(h_RxD, table_VxD, bias_V, ids_R):
  del bias_V, ids_R
  return _one_pass(matmul.tied_logits(h_RxD, table_VxD, jnp.float32)), jnp.float32(0)


def _products_loss(h_RxD, table_VxD, bias_V, ids_R):
  del bias_V, ids_R  # the cotangent of a sum over a few columns: the products, little else
  return jnp.sum(matmul.tied_logits(h_RxD, table_VxD, jnp.float32)[:, :8]), jnp.float32(0)


def _torch_products(operands):
  """The forward product and the gradient's two, in PyTorch, on copies of ``operands``."""
  import torch  # optional (not a bert_jax dependency), heavy

  torch.set_num_threads(min(2, torch.get_num_threads()))
  h_RxD, table_VxD = (torch.from_numpy(np.array(a)) for a in operands[:2])
  g_RxV = torch.from_numpy(np.full((h_RxD.shape[0], table_VxD.shape[0]), 1e-3, np.float32))

  def run(*_):
    with torch.no_grad():
      return (h_RxD @ table_VxD.T, g_RxV @ table_VxD, g_RxV.T @ h_RxD)

  return run


def _median_ms(f, operands, calls: int) -> float:
  return 1000 * Timer(warmup=0, repeats=calls).time(lambda i: f(*operands)).median


def _parser():
  p = flags.parser(__doc__)
  flags.add_list(p, "hidden", ["128", "256"], "hidden sizes (tiny 128, mini 256, ...)")
  p.add_argument("--rows", type=int, default=640, help="masked predictions per step")
  p.add_argument("--vocab", type=int, default=30522, help="vocabulary size")
  flags.add_list(p, "padded", ["30528", "30720"], "padded vocabulary sizes to time")
  p.add_argument("--calls", type=int, default=10, help="timed calls per round (median)")
  p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
  flags.add_bool(p, "torch", True, "also time the products in PyTorch (if installed)")
  return p


def main(argv=None):
  args = _parser().parse_args(argv)
  hugepages.restart_with_hugepages()  # before any work: it re-executes this command
  variants = {"bert_jax": _head_loss(None)}
  variants.update({f"padded_{v}": _head_loss(int(v)) for v in args.padded})
  variants.update(fused_floor=_floor_loss, products=_products_loss)
  print(f"rows {args.rows}, vocab {args.vocab}, float32; medians of {args.calls} calls (ms)")
  for hidden in map(int, args.hidden):
    rng = np.random.default_rng(0)
    operands = (
      jnp.asarray(rng.normal(size=(args.rows, hidden)), jnp.float32),
      jnp.asarray(rng.normal(size=(args.vocab, hidden)) * 0.02, jnp.float32),
      jnp.zeros((args.vocab,), jnp.float32),
      jnp.asarray(rng.integers(0, args.vocab, size=args.rows), jnp.int32),
    )
    fns = {n: jax.jit(jax.value_and_grad(f, (0, 1, 2), has_aux=True)) for n, f in variants.items()}
    losses = {n: float(jax.block_until_ready(f(*operands))[0][0]) for n, f in fns.items()}
    if args.torch and importlib.util.find_spec("torch"):
      fns["torch_products"] = _torch_products(operands)
      fns["torch_products"]()
    for name in variants:
      if name.startswith("padded_") and losses[name] != losses["bert_jax"]:
        raise AssertionError(f"{name}: loss {losses[name]} != {losses['bert_jax']}")
    times = {n: [] for n in fns}
    for _ in range(args.rounds):
      for n, f in fns.items():
        times[n].append(_median_ms(f, operands, args.calls))
    for n, ts in times.items():
      print(f"hidden {hidden:4d}  {n:14s} " + "  ".join(f"{t:6.1f}" for t in ts), flush=True)


if __name__ == "__main__":
  main()
