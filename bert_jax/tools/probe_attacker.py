"""The privacy probe's models and training: r(x) from a frozen encoder, the attacker, the direct
baseline, and training with selection of the dev-worst-privacy epoch (``bert_jax.tools.probe``
describes the probe; ``bert_jax.tasks.privacy.metrics`` the metrics).

``represent`` turns a ``BertEncoder`` output into r(x) (pooled, [CLS] or masked mean of one hidden
state, or every hidden state pooled for a scalar mix); ``compute_representations`` runs the frozen
encoder over every row once (jitted, length-cut batches) into a numpy cache. ``Attacker``: [a
``ScalarMix`` over the pooled layers,] Dense(hidden), ReLU, Dense(K) logits, the seed's
feed-forward attacker with sigmoid outputs. ``fit_and_select`` trains any (params, batch) ->
logits function on the summed sigmoid log-loss of the K attributes, scores dev after every epoch
and keeps the epoch whose dev privacy is lowest. ``train_attacker`` does so on cached r(x);
``train_direct`` on the encoder itself (``DirectModel``: the encoder is trained too).

Long work is never silent: extracting representations and training log a progress line
(``bert_jax.train.progress``: done / total, rate, eta) at most every ``INTERVAL_SEC``, and a
compilation or a scoring pass that runs longer logs that it is still running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax.linen import meta

from bert_jax.data.inference_batches import InferenceBatches
from bert_jax.data.length_buckets import parse_buckets
from bert_jax.model import BertConfig, BertEncoder
from bert_jax.model import scalar_mix as scalar_mix_lib
from bert_jax.tasks.base import INPUT_KEYS
from bert_jax.tasks.privacy import metrics as pm
from bert_jax.train import progress as progress_lib
from bert_jax.train.optimizers import warmup_linear_decay
from bert_jax.train.progress import Heartbeat, Progress


def _interval() -> float:
  """The progress interval, read when the work starts (``progress.INTERVAL_SEC``)."""
  return progress_lib.INTERVAL_SEC


def _pool(h_BxLxD, mask_BxL, how: str):
  h = h_BxLxD.astype(jnp.float32)
  if how == "cls":
    return h[:, 0]
  m = mask_BxL.astype(jnp.float32)[..., None]
  return (h * m).sum(1) / jnp.maximum(m.sum(1), 1.0)


def represent(encoder_out: Mapping[str, Any], mask_BxL, mode: str, layer: int, pooling: str):
  """r(x) from a ``BertEncoder`` output (with hidden states unless ``pooled``): BxD, or BxKxD
  (every hidden state pooled, K = layers + 1) for ``scalar_mix``."""
  if mode == "pooled":
    return encoder_out["pooled_output"].astype(jnp.float32)
  hidden = encoder_out["hidden_states"]
  if mode == "scalar_mix":
    return jnp.stack([_pool(h, mask_BxL, pooling) for h in hidden], axis=1)
  return _pool(hidden[layer], mask_BxL, mode)


class Attacker(nn.Module):
  """r(x) -> K logits: [ScalarMix over axis 1 of a BxKxD input,] Dense(hidden), ReLU, Dense(K)."""

  num_attributes: int
  hidden_size: int = 64
  scalar_mix: bool = False

  @nn.compact
  def __call__(self, r):
    if self.scalar_mix:
      r = scalar_mix_lib.ScalarMix(name="scalar_mix")([r[:, k] for k in range(r.shape[1])])
    h = nn.relu(nn.Dense(self.hidden_size, name="hidden")(r.astype(jnp.float32)))
    return nn.Dense(self.num_attributes, name="output")(h)


class DirectModel(nn.Module):
  """The direct baseline: encoder (params["bert"], trained) -> r(x) -> Attacker."""

  config: BertConfig
  mode: str
  layer: int
  pooling: str
  num_attributes: int
  hidden_size: int = 64

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
    out = BertEncoder(self.config, name="bert")(
      input_ids,
      input_mask,
      segment_ids,
      deterministic=deterministic,
      output_hidden_states=self.mode != "pooled",
    )
    r = represent(out, input_mask, self.mode, self.layer, self.pooling)
    attacker = Attacker(
      self.num_attributes, self.hidden_size, self.mode == "scalar_mix", name="attacker"
    )
    return attacker(r)


@functools.lru_cache(maxsize=8)
def _representation_fn(bert_config: BertConfig, mode: str, layer: int, pooling: str):
  """The jitted (params, batch) -> r(x), one per encoder and representation (so the splits of a
  probe share its compilations)."""
  encoder = BertEncoder(bert_config)
  hidden = mode != "pooled"

  def run(params, batch):
    ids, mask, seg = (batch[k] for k in INPUT_KEYS)
    out = encoder.apply({"params": params}, ids, mask, seg, output_hidden_states=hidden)
    return represent(out, mask, mode, layer, pooling)

  return jax.jit(run)


def compute_representations(
  bert_config: BertConfig,
  bert_params,
  arrays: Mapping[str, np.ndarray],
  mode: str,
  layer: int,
  pooling: str = "mean",
  batch_size: int = 32,
  name: str = "",
  progress: Progress | None = None,
) -> np.ndarray:
  """r(x) of every row of ``arrays`` (input_ids, input_mask, segment_ids) under the frozen
  encoder: float32 [N, D] (or [N, K, D] for scalar_mix), in row order. Rows are sorted by length
  and each jitted batch is cut to the multiple of 32 holding its longest row (padding is masked,
  so r(x) does not change); the last batch is padded with copies of a row
  (``bert_jax.data.inference_batches``: each batch of ``batch_size`` rows split over as many of
  this host's devices as divide it). Progress counts the batches (by default its own, logged as
  'probe: representations of <name> (N rows): b/B batches ...')."""
  run = _representation_fn(bert_config, mode, layer, pooling)
  ids, mask, seg = (np.asarray(arrays[k]) for k in INPUT_KEYS)
  n, max_length = ids.shape
  if n == 0:
    raise ValueError(f"no rows to represent{' in ' + name if name else ''}")
  # The batches are the caller's batch_size rows (its progress counts them), split over as many
  # of this host's devices as divide it.
  local = jax.local_devices()
  devices = local[: math.gcd(batch_size, len(local))]
  batches = InferenceBatches(batch_size, parse_buckets("32", max_length), devices=devices)
  bert_params = batches.replicate(bert_params)  # once, not with every batch
  what = f"probe: representations{' of ' + name if name else ''} ({n} rows)"
  total = -(-n // batch_size)
  if progress is None:
    ctx = Progress(what, total=total, unit="batches", interval_sec=_interval())
  else:  # the caller's, counting the batches of several row sets
    ctx = contextlib.nullcontext(progress)

  def make(index, length):
    return {
      "input_ids": ids[index, :length],
      "input_mask": mask[index, :length],
      "segment_ids": seg[index, :length],
    }

  def compiling(length):  # a new length compiles (unless an earlier split compiled it)
    return Heartbeat(
      f"{what}: first batch of {length} tokens (compiling)", interval_sec=_interval()
    )

  done = [0]  # rows

  def counted(batch):  # in batches of batch_size rows, whatever the devices round it to
    before = -(-done[0] // batch_size)
    done[0] += batch.rows.size
    progress.update(-(-done[0] // batch_size) - before)

  with ctx as progress:
    return batches.run_in_order(
      run, bert_params, mask.sum(1), make, compiling=compiling, on_batch=counted
    )


# --- training with selection on dev ----------------------------------------------------------
@dataclasses.dataclass
class Attributes:
  """What the metrics need of the task's private attributes."""

  names: tuple[str, ...]
  privacy_metric: str


LogitsFn = Callable[..., jax.Array]  # (params, batch, rng, deterministic) -> BxK logits


def _batches(arrays: Mapping[str, np.ndarray], idx: np.ndarray, size: int):
  """Rows ``idx`` padded to ``size`` with copies of the first; (batch, weight) with weight 0 on
  the padding."""
  pad = size - idx.size
  weight = np.concatenate([np.ones(idx.size, np.float32), np.zeros(pad, np.float32)])
  idx = np.concatenate([idx, np.full(pad, idx[0], idx.dtype)])
  return {k: v[idx] for k, v in arrays.items()}, weight


def predictor(logits_fn: LogitsFn):
  """``(params, arrays, batch_size) -> int32 [N, K]`` 0/1 predictions: sigmoid(logit) > 0.5, i.e.
  logit > 0, in jitted batches of ``batch_size`` (one compilation per predictor)."""
  step = jax.jit(lambda p, b: logits_fn(p, b, None, True) > 0)
  return lambda params, arrays, batch_size: _predict(step, params, arrays, batch_size)


def _predict(step, params, arrays: Mapping[str, np.ndarray], batch_size: int) -> np.ndarray:
  params = jax.device_put(params)  # once, not with every batch
  n = len(next(iter(arrays.values())))
  outs = []
  for start in range(0, n, batch_size):
    batch, _ = _batches(arrays, np.arange(start, min(start + batch_size, n)), batch_size)
    outs.append(np.asarray(step(params, batch)))
  return np.concatenate(outs)[:n].astype(np.int32)


def fit_and_select(
  logits_fn: LogitsFn,
  params,
  tx: optax.GradientTransformation,
  data: Mapping[str, tuple[Mapping[str, np.ndarray], np.ndarray]],
  attrs: Attributes,
  epochs: int,
  batch_size: int,
  seed: int,
  eval_batch_size: int = 0,
  what: str = "probe: attacker",
) -> dict[str, Any]:
  """Trains on ``data["train"]`` (inputs, z) with the summed sigmoid log-loss; after each epoch
  scores ``data["dev"]``; keeps the epoch with the worst dev privacy and reports it on
  ``data["test"]``. Returns {"selected_epoch" (1-based), "epochs", "dev", "test", "params"}.
  Progress is logged as '<what>: training: s/S steps ...'."""
  inputs, z = data["train"]
  n = len(z)
  if n == 0:
    raise ValueError(f"{what}: no training rows")
  size = min(batch_size, n)
  eval_size = eval_batch_size or size
  names, metric = dataclasses.astuple(attrs)

  def score(split: str, p, epoch: str) -> dict[str, Any]:
    with Heartbeat(f"{what}: scoring {epoch} on the {split} rows", interval_sec=_interval()):
      pred = predict(p, data[split][0], eval_size)
    where = f"the {what.removeprefix('probe: ')}'s {split} rows"
    return pm.attack_metrics(data[split][1], pred, names, metric, where)

  def loss_fn(p, batch, z_BxK, w_B, rng):
    logits = logits_fn(p, batch, rng, False).astype(jnp.float32)
    nll_B = optax.sigmoid_binary_cross_entropy(logits, z_BxK.astype(jnp.float32)).sum(-1)
    return (nll_B * w_B).sum() / jnp.maximum(w_B.sum(), 1.0)

  @jax.jit
  def step(p, opt_state, batch, z_BxK, w_B, rng):
    loss, grads = jax.value_and_grad(loss_fn)(p, batch, z_BxK, w_B, rng)
    updates, opt_state = tx.update(grads, opt_state, p)
    return optax.apply_updates(p, updates), opt_state, loss

  opt_state = tx.init(params)
  predict = predictor(logits_fn)
  key = jax.random.PRNGKey(seed)
  history, best, best_params = [], None, params
  steps_per_epoch = -(-n // size)
  logging.info(
    "%s: training on %d rows, %d epochs of %d steps, each scored on %d dev rows",
    what,
    n,
    epochs,
    steps_per_epoch,
    len(data["dev"][1]),
  )
  with Progress(
    f"{what}: training", total=epochs * steps_per_epoch, unit="steps", interval_sec=_interval()
  ) as progress:
    for epoch in range(epochs):
      order = np.random.default_rng([seed, epoch]).permutation(n)
      losses = []
      for start in range(0, n, size):
        batch, w = _batches({**inputs, "_z": z}, order[start : start + size], size)
        key, rng = jax.random.split(key)
        zb = batch.pop("_z")
        if epoch or start:
          params, opt_state, loss = step(params, opt_state, batch, zb, w, rng)
        else:
          with Heartbeat(f"{what}: first training step (compiling)", interval_sec=_interval()):
            params, opt_state, loss = step(params, opt_state, batch, zb, w, rng)
            loss.block_until_ready()
        losses.append(float(loss))  # waits for the step: progress counts steps done
        progress.update()
      dev = score("dev", params, f"epoch {epoch + 1}")
      history.append(
        {"epoch": epoch + 1, "train_loss": float(np.mean(losses)), "dev_privacy": dev["privacy"]}
      )
      if best is None or dev["privacy"] < best["privacy"]:
        best, best_params = dev, params  # immutable device arrays: no copy needed
  selected = pm.select_epoch([h["dev_privacy"] for h in history])
  test = score("test", best_params, f"epoch {selected + 1}")
  return {
    "selected_epoch": selected + 1,
    "epochs": history,
    "dev": best,
    "test": test,
    "params": best_params,
  }


def train_attacker(
  r: Mapping[str, np.ndarray],
  z: Mapping[str, np.ndarray],
  attrs: Attributes,
  hidden_size: int = 64,
  epochs: int = 16,
  learning_rate: float = 1e-3,
  batch_size: int = 32,
  seed: int = 0,
  scalar_mix: bool = False,
) -> dict[str, Any]:
  """Phase 3 on cached representations: ``r`` and ``z`` keyed by "train", "dev", "test"."""
  model = Attacker(len(attrs.names), hidden_size, scalar_mix)
  params = jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.asarray(r["train"][:1]))["params"]

  def logits_fn(p, batch, rng, deterministic):
    del rng, deterministic
    return model.apply({"params": p}, batch["r"])

  data = {
    s: ({"r": np.asarray(r[s], np.float32)}, np.asarray(z[s])) for s in ("train", "dev", "test")
  }
  return fit_and_select(
    logits_fn, params, optax.adam(learning_rate), data, attrs, epochs, batch_size, seed, 1024
  )


def train_direct(
  bert_config: BertConfig,
  bert_params,
  inputs: Mapping[str, Mapping[str, np.ndarray]],
  z: Mapping[str, np.ndarray],
  attrs: Attributes,
  mode: str,
  layer: int,
  pooling: str,
  hidden_size: int = 64,
  epochs: int = 3,
  learning_rate: float = 2e-5,
  batch_size: int = 32,
  warmup_proportion: float = 0.1,
  seed: int = 0,
  eval_batch_size: int = 32,
) -> dict[str, Any]:
  """The direct baseline: encoder + representation + attacker trained together on z (the
  encoder starts from ``bert_params`` and is updated), selected per epoch on dev."""
  model = DirectModel(bert_config, mode, layer, pooling, len(attrs.names), hidden_size)
  dummy = [np.asarray(inputs["train"][k][:1]) for k in INPUT_KEYS]
  params = meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(seed), *dummy)["params"])
  params = {**params, "bert": jax.tree_util.tree_map(jnp.asarray, bert_params)}

  def logits_fn(p, batch, rng, deterministic):
    rngs = None if deterministic or rng is None else {"dropout": rng}
    args = (batch[k] for k in INPUT_KEYS)
    return model.apply({"params": p}, *args, deterministic=deterministic, rngs=rngs)

  n = len(z["train"])
  total = max(1, epochs * -(-n // min(batch_size, n)))
  tx = optax.adam(warmup_linear_decay(learning_rate, int(warmup_proportion * total), total))
  data = {s: ({k: np.asarray(inputs[s][k]) for k in INPUT_KEYS}, np.asarray(z[s])) for s in z}
  out = fit_and_select(
    logits_fn,
    params,
    tx,
    data,
    attrs,
    epochs,
    batch_size,
    seed,
    eval_batch_size,
    what="probe: direct baseline",
  )
  out.pop("params")
  return out
