"""How far apart two float32 results of one computation may be: bounds derived from float32's
rounding, so that a comparison holds on any CPU, not only on the host whose summation order it was
tuned to.

Two float32 computations of one value that sum in different orders (another kernel, another
XLA:CPU code path or vector width, PyTorch) differ by rounding alone. Two rules, the first
preferred:

1. Against float64 (``float64_bound``, ``assert_close_to_float64``). Compute the value once more
   in float64 and measure the float32 *reference* computation's own error against it. The result
   under test may be off the float64 value by at most ``factor`` (4) times that error, plus a floor
   of ``ulps`` (8) float32 ulps of the largest float64 magnitude (so that a reference which happens
   to round exactly does not demand bit equality): |got - x64| <= 4 |ref - x64|_max + 8 eps32
   max|x64|. The bound follows the computation's actual float32 error, however much it
   accumulates through layers and cancels in sums.

2. A float32 sum's rounding (``sum_bound``, ``assert_sum_close``), where no float64 run exists
   (Hugging Face PyTorch in float32, a kernel without float64). A float32 sum of n terms t_i
   carries one rounding of relative size <= eps32/2 per addition; the errors are independent, so
   they add in quadrature and the sum is off its exact value by about sqrt(n) eps32/2 M, M the
   magnitude of the summed terms: sum |t_i| per element where the terms are known
   (``product_magnitude``), else the output's largest |value| (``assert_model_close``) or, for
   gradients, its module's (``assert_gradients_close``); Higham, *Accuracy and Stability of
   Numerical Algorithms* (2002), sections 2.8 and 4.2. Two float32 results each carry such an
   error, and the tail of their distribution reaches a few standard deviations: |a - b| <=
   k eps32 sqrt(n) M with k = 4. Through a chain of reductions (a model's layers) ``n`` is the
   chain's total reduction length (``encoder_terms``): each stage adds its own rounding.

A real bug (a wrong mask, a missing scale, a dropped term) moves values by orders of magnitude
more than either bound, so both still fail it.
"""

import jax
import numpy as np

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23: the spacing of float32 numbers in [1, 2)


def float64_bound(ref_error: float, magnitude64: float, factor: float = 4.0, ulps: float = 8.0):
  """Rule 1: ``factor`` times the float32 reference's error against float64, plus ``ulps`` float32
  ulps of the float64 value's magnitude."""
  return factor * float(ref_error) + ulps * EPS32 * float(magnitude64)


def assert_close_to_float64(got, ref32, exact64, factor=4.0, ulps=8.0, err_msg=""):
  """Rule 1 for one array: ``got`` (float32, the computation under test) and ``ref32`` (the
  float32 reference computation) against ``exact64`` (the reference computed in float64)."""
  exact64 = np.asarray(exact64, np.float64)
  ref_error = np.abs(np.asarray(ref32, np.float64) - exact64).max(initial=0.0)
  bound = float64_bound(ref_error, np.abs(exact64).max(initial=0.0), factor, ulps)
  np.testing.assert_allclose(
    np.asarray(got, np.float64), exact64, rtol=0, atol=bound, err_msg=err_msg
  )


def sum_bound(magnitude, terms: int, k: float = 4.0):
  """Rule 2: ``k`` eps32 sqrt(``terms``) ``magnitude`` for float32 sums of ``terms`` terms whose
  magnitude is ``magnitude`` (a number, or an array: one per element)."""
  return k * EPS32 * float(np.sqrt(terms)) * np.asarray(magnitude, np.float64)


def product_magnitude(equation: str, a, b):
  """The magnitude of each element's summed terms in ``einsum(equation, a, b)``: the sum of
  |a_i b_i| over its contraction, i.e. the same product of |a| and |b|, in float64."""
  return np.einsum(equation, np.abs(np.asarray(a, np.float64)), np.abs(np.asarray(b, np.float64)))


def encoder_terms(config, length: int) -> int:
  """Rule 2's ``n`` for a BERT encoder's output: the reduction lengths along one path through it,
  summed (each stage adds its own rounding, and LayerNorm keeps the scale from growing). Per
  layer: the query/key/value projection (D), the scores (head dim), the softmax and the
  probabilities' product (2 L), the output projection (D), two LayerNorms (mean and variance:
  4 D), the intermediate (D) and output (I) projections; and the embeddings' LayerNorm (2 D).
  ``config``: ours or Hugging Face's BertConfig (the same field names)."""
  d, i = config.hidden_size, config.intermediate_size
  per_layer = 7 * d + d // config.num_attention_heads + 2 * length + i
  return 2 * d + config.num_hidden_layers * per_layer


def assert_sum_close(actual, desired, magnitude, terms, k=4.0, err_msg=""):
  """Rule 2 for one array, elementwise (no relative part: the bound is the sum's own)."""
  actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
  bound = np.broadcast_to(
    sum_bound(magnitude, terms, k), np.broadcast_shapes(actual.shape, desired.shape)
  )
  error = np.abs(actual - desired)
  bad = ~(error <= bound)
  if bad.any():
    i = np.unravel_index(np.argmax(np.where(bad, error - bound, -np.inf)), bad.shape)
    raise AssertionError(
      f"{err_msg} {int(bad.sum())} of {bad.size} elements off by more than k eps32 sqrt(n) M "
      f"(k={k}, n={terms}); worst at {i}: {np.broadcast_to(actual, bad.shape)[i]!r} vs "
      f"{np.broadcast_to(desired, bad.shape)[i]!r}, |diff| {error[i]:.3g} > bound {bound[i]:.3g}"
    )


def assert_gradients_close(actual, desired, terms: int, k: float = 4.0):
  """Rule 2 for two float32 gradient trees of one loss. Each leaf's magnitude is the largest
  |desired| over its module's leaves (a Dense's kernel and bias, a LayerNorm's scale and bias:
  the same sum over the tokens), since a gradient that is zero in exact arithmetic (a key bias:
  the softmax ignores a shift of a row's scores) is rounding noise of its module's terms, not of
  its own size. ``terms``: the forward and backward chains' reduction lengths and the tokens'
  sum (e.g. 2 ``encoder_terms`` + B L)."""
  leaves = jax.tree_util.tree_leaves_with_path(desired)
  magnitude = {}
  for path, x in leaves:
    magnitude[_module(path)] = max(magnitude.get(_module(path), 0.0), np.abs(x).max())
  for (path, x), y in zip(leaves, jax.tree_util.tree_leaves(actual), strict=True):
    m = magnitude[_module(path)]
    assert_sum_close(y, x, m, terms, k, err_msg=jax.tree_util.keystr(path))


def _module(path) -> tuple:
  """A parameter's module: its path less the parameter's name (and a box's ``.value``)."""
  keys = [p for p in path if isinstance(p, jax.tree_util.DictKey)]
  return tuple(keys[:-1])


def assert_model_close(actual, desired, config, length: int, err_msg=""):
  """Rule 2 for a BERT model's output against another float32 computation of it (Hugging Face
  PyTorch, TensorFlow, another path of ours): magnitude the desired output's largest |value|, n the
  encoder's reductions at ``length`` plus a head's two products over D (pooler and classifier;
  the MLM transform and decoder)."""
  desired = np.asarray(desired, np.float64)
  terms = encoder_terms(config, length) + 2 * config.hidden_size
  assert_sum_close(actual, desired, np.abs(desired).max(initial=0.0), terms, err_msg=err_msg)
