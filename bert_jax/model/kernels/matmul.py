"""Matrix products in bfloat16 that XLA:CPU runs on its native bfloat16 kernels.

XLA:CPU's YNNPACK kernels multiply bfloat16 operands natively only when the product's result is
float32: a bfloat16 x bfloat16 -> bfloat16 dot is upcast to a float32 dot (with two conversion
passes), slower than float32 itself (benchmarks/results/model_numerics.md). So on the CPU a bfloat16 product here is computed with a float32
result and rounded once to bfloat16, which is what a bfloat16 product means anyway (accumulated
in float32, rounded at the end), and its backward pass does the same: the cotangent rounded to
bfloat16, each operand's gradient a product with a float32 result (the products autodiff would
run, in the form XLA:CPU runs fast) returned in that operand's own dtype, so a float32 kernel's
gradient is not rounded to bfloat16 on the way.

Everywhere else (TPU, GPU) and in float32 the product is ``jnp.einsum`` / ``lax.dot_general``
as before, op for op: ``lax.platform_dependent`` picks the CPU form only when lowering for a CPU,
so a step compiled for a TPU topology on a CPU host is unchanged. One float32 exception, also on
the CPU only: the MLM decoder's table gradient (`tied_logits`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


def einsum(equation: str, a: Array, b: Array, dtype, preferred_element_type=None) -> Array:
  """``jnp.einsum(equation, a.astype(dtype), b.astype(dtype), preferred_element_type=...)``.

  On a CPU with ``dtype`` bfloat16: the product with a float32 result, rounded to
  ``preferred_element_type`` (default ``dtype``), and each operand's gradient a product with a
  float32 result returned in that operand's own dtype (a float32 kernel's gradient is not
  rounded to bfloat16 on the way, as autodiff through the cast would).
  """
  dtype = jnp.dtype(dtype)

  def plain(a, b):
    return jnp.einsum(
      equation, a.astype(dtype), b.astype(dtype), preferred_element_type=preferred_element_type
    )

  if dtype != jnp.bfloat16:
    return plain(a, b)
  _check_equation(equation)
  if _has_batch_index(equation):
    return plain(a, b)
  out_dtype = jnp.dtype(preferred_element_type or dtype)
  cpu = functools.partial(_float32_result_einsum, equation, dtype, out_dtype, a.dtype, b.dtype)
  return lax.platform_dependent(a, b, cpu=cpu, default=plain)


def tied_logits(h_xD: Array, table_VxD: Array, dtype) -> Array:
  """Logits against an embedding table, ``einsum("...d,vd->...v", h, table)`` in ``dtype`` (the
  MLM decoder tied to the word embeddings).

  On a CPU in float32 the table's gradient is computed as the transpose of ``h^T g`` ([D, V])
  instead of autodiff's ``g^T h``: for that form XLA:CPU first copies the whole [rows, V]
  cotangent into its transpose for its YNNPACK kernel, where ``h^T g`` runs on its own dot kernel
  with the cotangent as it is (2-3x faster: benchmarks/results/model_numerics.md). The same sums in another order. In bfloat16 that kernel
  does not take bfloat16 operands with a float32 result, so the product is `einsum`'s there, as
  it is off the CPU (a step compiled for a TPU is unchanged).
  """
  rows = "abcefg"[: h_xD.ndim - 1]
  equation = f"{rows}d,vd->{rows}v"
  dtype = jnp.dtype(dtype)
  if dtype == jnp.bfloat16:
    return einsum(equation, h_xD, table_VxD, dtype)
  plain = functools.partial(_logits, rows, dtype)
  cpu = functools.partial(_logits_with_transposed_table_grad, rows, dtype)
  return lax.platform_dependent(h_xD, table_VxD, cpu=cpu, default=plain)


def _logits(rows: str, dtype, h: Array, table: Array) -> Array:
  return jnp.einsum(f"{rows}d,vd->{rows}v", h.astype(dtype), table.astype(dtype))


_logits_with_transposed_table_grad = jax.custom_vjp(_logits, nondiff_argnums=(0, 1))


def _logits_fwd(rows, dtype, h, table):
  return _logits_with_transposed_table_grad(rows, dtype, h, table), (h, table)


def _logits_bwd(rows, dtype, residuals, g):
  h, table = residuals
  g = g.astype(dtype)
  dh = jnp.einsum(f"{rows}v,vd->{rows}d", g, table.astype(dtype))
  dtable = jnp.einsum(f"{rows}d,{rows}v->dv", h.astype(dtype), g).T
  return dh.astype(h.dtype), dtable.astype(table.dtype)


_logits_with_transposed_table_grad.defvjp(_logits_fwd, _logits_bwd)


def add_bias(y: Array, bias: Array) -> Array:
  """``y + bias.astype(y.dtype)``, ``bias`` over ``y``'s trailing axes.

  On a CPU in bfloat16 the bias's gradient is summed in float32 and returned in the bias's own
  dtype: autodiff's sum of a bfloat16 cotangent is a bfloat16 reduction, which XLA:CPU rewrites
  into a tree of reduce-windows, two orders of magnitude slower than the float32 sum of the same
  values (benchmarks/results/model_numerics.md).
  """
  if y.dtype != jnp.bfloat16 or y.shape[y.ndim - bias.ndim :] != bias.shape:
    return y + bias.astype(y.dtype)
  cpu = functools.partial(_add_bias_summed_in_float32, bias.ndim, bias.dtype)
  return lax.platform_dependent(y, bias, cpu=cpu, default=lambda y, b: y + b.astype(y.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _add_bias_summed_in_float32(bias_ndim: int, bias_dtype, y: Array, bias: Array) -> Array:
  return y + bias.astype(y.dtype)


def _add_bias_fwd(bias_ndim, bias_dtype, y, bias):
  return _add_bias_summed_in_float32(bias_ndim, bias_dtype, y, bias), None


def _add_bias_bwd(bias_ndim, bias_dtype, _, g):
  rows = tuple(range(g.ndim - bias_ndim))
  return g, jnp.sum(g, axis=rows, dtype=jnp.float32).astype(bias_dtype)


_add_bias_summed_in_float32.defvjp(_add_bias_fwd, _add_bias_bwd)


def _terms(equation: str) -> list[str]:
  """ "ab,bc->ac" -> ["ab", "bc", "ac"]."""
  return equation.replace(" ", "").replace("->", ",").split(",")


def _has_batch_index(equation: str) -> bool:
  """Whether an index is in both operands and the output (a batched product, e.g. attention's).

  Those stay as they are: XLA:CPU (jax 0.10.2) fails to run one of their gradient's forms with
  bfloat16 operands and a float32 result ("Unsupported element type for DotThunk::Execute: BF16
  x BF16 = F32", ``bqhk,bhqs->bshk``, the key's gradient in attention); with that gradient
  upcast to float32 and the rest in this form, attention's products were no faster
  (benchmarks/results/model_numerics.md).
  """
  a, b, out = _terms(equation)
  return bool(set(a) & set(b) & set(out))


def _check_equation(equation: str) -> None:
  """Each operand's gradient is again an einsum of the other two terms: that needs explicit
  output, no repeated index within a term and no index that only one operand sums over."""
  if "->" not in equation or "." in equation:
    raise ValueError(f"einsum {equation!r}: give the output explicitly, without '...'")
  terms = _terms(equation)
  if len(terms) != 3 or any(len(set(t)) != len(t) for t in terms):
    raise ValueError(f"einsum {equation!r}: two operands, no index repeated within a term")
  a, b, out = map(set, terms)
  if (a - b - out) or (b - a - out) or (out - a - b):
    raise ValueError(f"einsum {equation!r}: an index appears in one term only")


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def _float32_result_einsum(equation, dtype, out_dtype, a_dtype, b_dtype, a, b) -> Array:
  """The CPU form (``a_dtype``, ``b_dtype``: the operands' own dtypes, for their gradients)."""
  a, b = a.astype(dtype), b.astype(dtype)
  return jnp.einsum(equation, a, b, preferred_element_type=jnp.float32).astype(out_dtype)


def _float32_result_einsum_fwd(equation, dtype, out_dtype, a_dtype, b_dtype, a, b):
  y = _float32_result_einsum(equation, dtype, out_dtype, a_dtype, b_dtype, a, b)
  return y, (a.astype(dtype), b.astype(dtype))  # the operands in the compute dtype


def _float32_result_einsum_bwd(equation, dtype, out_dtype, a_dtype, b_dtype, residuals, g):
  del out_dtype
  a, b = residuals
  ta, tb, out = _terms(equation)
  g = g.astype(dtype)
  da = jnp.einsum(f"{out},{tb}->{ta}", g, b, preferred_element_type=jnp.float32)
  db = jnp.einsum(f"{ta},{out}->{tb}", a, g, preferred_element_type=jnp.float32)
  return da.astype(a_dtype), db.astype(b_dtype)


_float32_result_einsum.defvjp(_float32_result_einsum_fwd, _float32_result_einsum_bwd)


def add_vocab_bias(logits_BxNxV: Array, bias_V: Array) -> Array:
  """``logits + bias`` (of one dtype), whose bias gradient (the sum of B x N rows of V) is a
  matrix product with two rows of ones instead of a reduction.

  Same values (summed in float32, rounded to the bias's dtype). On XLA:CPU the sum over the
  rows of a 30,522-wide gradient is a slow pass as a reduction, and a product with a 2-row
  matrix of ones runs on its GEMM kernels (a vector is not a matrix to them); only this bias
  gains (benchmarks/results/model_numerics.md).
  """
  if logits_BxNxV.dtype != bias_V.dtype:
    raise ValueError(f"logits ({logits_BxNxV.dtype}) and bias ({bias_V.dtype}) differ in dtype")
  return _add_bias_summed_by_dot(logits_BxNxV, bias_V)


@jax.custom_vjp
def _add_bias_summed_by_dot(x_BxNxV, b_V):
  return x_BxNxV + b_V


def _add_bias_fwd(x_BxNxV, b_V):
  return x_BxNxV + b_V, None


def _add_bias_bwd(_, g_BxNxV):  # g has the one dtype of logits, bias and output
  g_MxV = g_BxNxV.reshape(-1, g_BxNxV.shape[-1])
  db_2xV = jnp.einsum(
    "mv,km->kv",
    g_MxV,
    jnp.ones((2, g_MxV.shape[0]), g_MxV.dtype),
    preferred_element_type=jnp.float32,
    precision=jax.lax.Precision.HIGHEST,  # a GPU would round float32 inputs to TF32
  )
  return g_BxNxV, db_2xV[0].astype(g_BxNxV.dtype)


_add_bias_summed_by_dot.defvjp(_add_bias_fwd, _add_bias_bwd)
