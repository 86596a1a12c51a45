"""The privacy probe: what a frozen encoder's representation r(x) reveals about private attributes.

Coavoux, Narayan and Cohen (2018, "Privacy-preserving Neural Representations of Text"): phase 1
trains a main model on (x, y) (here: any checkpoint, e.g. a bert_jax fine-tuning workdir);
phase 2 builds pairs (r(x), z), z a vector of K binary private attributes of x; phase 3 trains
an attacker to recover z from r(x) and measures privacy by how well it does.

  result = run_probe(config, workdir)   # configs/probe.py; writes probe.json and metrics.json

The encoder (``config.init_checkpoint``: anything ``load_pretrained`` reads; of a fine-tuning
workdir its ``best/`` checkpoint unless ``config.which_checkpoint='latest'``) is frozen and run
once over every row (jitted batches of ``eval_batch_size``, cut to multiples of 32 tokens). The
representation ``config.representation``:

  ``pooled``      the pooler's output, tanh(W h_[CLS] + b) of the last layer
  ``cls``         the hidden state of [CLS] at ``config.layer`` (0 = embeddings, -1 = last)
  ``mean``        the mean of the hidden states of the real tokens (input_mask) at ``config.layer``
  ``scalar_mix``  ELMo's learned mix over the embeddings and every layer, trained jointly with the
                  attacker, then pooled (``config.scalar_mix_pooling``: mean or cls). Pooling is
                  linear, so the mix of the pooled layers equals the pooling of the mixed token
                  states exactly: the cache holds every layer's pooled vector (N x (L+1) x D).

The attacker (section 2.2, 4.2): a feed-forward net, one hidden layer of ``attacker_hidden_size``
(64) ReLU units, K sigmoid outputs; loss: the sum over the attributes of their negative
log-likelihoods (mean over rows); Adam (``attacker_learning_rate``, Dynet's default 1e-3) for
``attacker_epochs`` (16) epochs of ``attacker_batch_size`` rows. After each epoch it is scored on
the attacker's dev rows and the epoch with the worst privacy there (the most successful
attacker) is kept and reported on test. Metrics: ``bert_jax.tasks.privacy.metrics``.

Splits. The task's data with private attributes (``task.private_attributes``, the
``private`` array of a split): the attacker trains on the task's train split minus a seeded
held-out fraction ``dev_fraction``, which is its dev set for epoch selection; test is the task's
(first) dev split, since GLUE's test split has neither labels nor attributes. With
``config.require_attribute`` only rows with at least one attribute are kept (the seed's filtering
of its entity-presence data); a split it leaves (nearly) empty is an error naming the key. Every
attribute must have a positive row in each of the three row sets (attacker train, attacker dev,
test): one that has none there is refused, naming it and the rows, before the encoder runs,
since the attacker cannot learn it and a privacy figure including it would be computed from zero
positives.

Baselines (section 4.3.1): ``majority``, each attribute's most frequent value on the attacker's
training rows; ``direct`` (``config.direct_baseline``), the seed's trained upper bound, "a
classifier that can optimize the hidden representations for the attacker's tasks": the same
representation and attacker, but the encoder is fine-tuned with it on z (``learning_rate``,
``num_train_epochs``, ``train_batch_size``, dropout as configured; Adam with BERT's warmup and
linear decay), selected per epoch on dev as the attacker is.

Main-task metric: when ``init_checkpoint`` is a bert_jax fine-tuning workdir of ``config.task``,
the checkpoint the encoder was read from (encoder and classifier) is evaluated on the test rows
by the task's own ``evaluate`` (the fine-tuning workdir is only read, never locked, so probes of
one workdir can run in parallel); otherwise (a pre-training workdir, another task's, a Hugging
Face directory) it is null, with a note saying why, which is also logged. Whether it can be
scored is decided from the workdir's JSON files before the attacker trains, so an unreadable one
fails the probe before any training.

Reliability: a probe that fails leaves no workdir it created; long work logs progress at least
every 30 s (``bert_jax.train.progress``): loading, reading the task's data, the representations
of each row set, the attacker's and the direct baseline's training, the main-task evaluation.

Models and training: ``bert_jax.tools.probe_attacker``; metrics: ``bert_jax.tasks.privacy.metrics``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging

from bert_jax.checkpoint import read_json, write_json
from bert_jax.checkpoint.lock import WorkdirLock
from bert_jax.formats import load_pretrained
from bert_jax.model import BertConfig
from bert_jax.model import scalar_mix as scalar_mix_lib
from bert_jax.model.kernels.attention import platform_of
from bert_jax.model.run_settings import run_bert_config
from bert_jax.parallel.compilation_cache import enable_compilation_cache
from bert_jax.tasks.privacy import attributes as PA
from bert_jax.tasks.privacy import metrics as pm
from bert_jax.tasks.registry import create_task
from bert_jax.tokenize import load_tokenizer
from bert_jax.tools.probe_attacker import (
  Attributes,
  compute_representations,
  train_attacker,
  train_direct,
)
from bert_jax.train import progress as progress_lib
from bert_jax.train.best_checkpoint import CHOICES, checkpoint_dir
from bert_jax.train.progress import Heartbeat, Progress

REPRESENTATIONS = ("pooled", "cls", "mean", "scalar_mix")
POOLINGS = ("mean", "cls")
PROBE_FILE = "probe.json"


# --- representations --------------------------------------------------------------------------
def layer_index(layer: int, num_hidden_layers: int) -> int:
  """``config.layer`` as an index into the num_hidden_layers + 1 hidden states (0 = embeddings,
  -1 = last); out of range is an error naming the key."""
  n = num_hidden_layers + 1
  if not -n <= int(layer) < n:
    raise ValueError(
      f"config.layer={layer} is out of range for an encoder of {num_hidden_layers} layers: use "
      f"0..{num_hidden_layers} (0 = embeddings) or -{n}..-1 (-1 = the last layer)"
    )
  return int(layer) % n


def check_config(config, num_hidden_layers: int | None = None) -> int | None:
  """Validates the probe's own keys (before anything is loaded); with the encoder's
  ``num_hidden_layers``, also ``config.layer``, and returns it as a hidden-state index."""
  if config.representation not in REPRESENTATIONS:
    raise ValueError(
      f"config.representation={config.representation!r} is not one of {REPRESENTATIONS}"
    )
  if config.scalar_mix_pooling not in POOLINGS:
    raise ValueError(
      f"config.scalar_mix_pooling={config.scalar_mix_pooling!r} is not one of {POOLINGS}"
    )
  if not 0.0 < float(config.dev_fraction) < 1.0:
    raise ValueError(f"config.dev_fraction={config.dev_fraction} must be in (0, 1)")
  for key in ("attacker_epochs", "attacker_hidden_size", "attacker_batch_size", "eval_batch_size"):
    if int(config[key]) < 1:
      raise ValueError(f"config.{key}={config[key]} must be >= 1")
  if num_hidden_layers is None:
    return None
  return layer_index(config.layer, num_hidden_layers)


# --- the probe ---------------------------------------------------------------------------------
def split_rows(
  num_rows: int, fraction: float, seed: int, which: str = ""
) -> tuple[np.ndarray, np.ndarray]:
  """(attacker-train rows, attacker-dev rows) of the task's train split: a seeded
  ``fraction`` held out, both sorted. ``which`` qualifies the rows in the error (e.g. " with a
  private attribute")."""
  n_dev = int(round(num_rows * float(fraction)))
  if n_dev < 1 or num_rows - n_dev < 1:
    raise ValueError(
      f"config.dev_fraction={fraction} of {num_rows} training rows{which} leaves "
      f"{n_dev} attacker-dev and {num_rows - n_dev} attacker-train rows; both need at least one"
    )
  perm = np.random.default_rng(seed).permutation(num_rows)
  return np.sort(perm[n_dev:]), np.sort(perm[:n_dev])


def select_rows(
  z_train_NxK: np.ndarray,
  z_test_NxK: np.ndarray,
  dev_fraction: float,
  seed: int,
  require_attribute: bool = False,
  names: Sequence[str] = (),
  where: tuple[str, str] = ("the train split", "the test split"),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Rows of the task's train split for the attacker's train and dev sets, and of its test split.
  ``require_attribute`` keeps only rows with at least one attribute, as the seed does for its
  entity-presence attributes ("only keep examples containing at least one of these named
  entities", to avoid a very unbalanced data set); the held-out fraction is drawn from those.
  A split left with too few rows is an error naming it (``where``: the train and test splits),
  the attributes (``names``) and ``config.require_attribute``."""
  keep_train = np.arange(len(z_train_NxK))
  keep_test = np.arange(len(z_test_NxK))
  which = ""
  if require_attribute:
    keep_train = np.flatnonzero(np.asarray(z_train_NxK).sum(1) > 0)
    keep_test = np.flatnonzero(np.asarray(z_test_NxK).sum(1) > 0)
    listed = f" ({', '.join(map(repr, names))})" if len(names) else ""
    for keep, z, split, need, limit in (
      (keep_train, z_train_NxK, where[0], 2, "max_train_examples"),
      (keep_test, z_test_NxK, where[1], 1, "max_eval_examples"),
    ):
      if len(keep) < need:
        raise ValueError(
          f"config.require_attribute keeps {len(keep)} of the {len(z)} rows of {split}: only "
          f"those with one of the private attributes{listed}, and the probe needs at least "
          f"{need} there; use rows that have them (config.{limit} takes the first rows of a "
          "file, and CoLA's and STS-B's files are ordered by attribute) or "
          "config.require_attribute=False"
        )
    which = " with a private attribute (config.require_attribute)"
  train_rows, dev_rows = split_rows(len(keep_train), dev_fraction, seed, which)
  return keep_train[train_rows], keep_train[dev_rows], keep_test


def check_support(
  z: Mapping[str, np.ndarray],
  names: Sequence[str],
  where: Mapping[str, tuple[str, str]] | None = None,
) -> None:
  """Refuses (one line naming the attribute and the rows) a split of ``z`` ("train", "dev",
  "test": the attacker's train and dev rows, the test rows) in which an attribute has no
  positive: the attacker cannot learn it there, and its recall and F1, and a privacy figure
  including it, would be computed from zero positives. ``where[split]`` is (the rows described,
  what to do), for the message."""
  where = where or {}
  for split in ("train", "dev", "test"):
    described, advice = where.get(split, (f"the probe's {split} rows", ""))
    PA.check_support(z[split], names, described, advice)


def probe_arrays(
  config,
  bert_config: BertConfig,
  bert_params,
  splits: Mapping[str, Mapping[str, np.ndarray]],
  attrs: Attributes,
  where: Mapping[str, tuple[str, str]] | None = None,
) -> dict[str, Any]:
  """Phases 2 and 3 on featurised rows: ``splits["train" | "dev" | "test"]`` hold the model
  inputs and ``private`` (int [N, K] 0/1). Returns the attacker's report, the baselines and the
  scalar-mix summary (probe.json's sections). A split without a positive of some attribute is
  refused first (``check_support``; ``where`` describes the splits in its message)."""
  layer = check_config(config, bert_config.num_hidden_layers)
  mode, pooling = config.representation, config.scalar_mix_pooling
  z = {s: np.asarray(splits[s]["private"], np.int32) for s in ("train", "dev", "test")}
  for s, zs in z.items():
    if zs.ndim != 2 or zs.shape[1] != len(attrs.names):
      raise ValueError(
        f"{s}: private attributes of shape {zs.shape}, expected N x {len(attrs.names)}"
      )
  check_support(z, attrs.names, where)  # before any work
  batch_size = int(config.eval_batch_size)
  rows = {"train": "attacker train", "dev": "attacker dev", "test": "test"}
  what = f"probe: representations ({mode})"
  logging.info(
    "%s of %s rows, in batches of %d",
    what,
    ", ".join(f"{rows[s]} {len(z[s])}" for s in z),
    batch_size,
  )
  total = sum(-(-len(z[s]) // batch_size) for s in z)
  with Progress(what, total=total, unit="batches", interval_sec=_interval()) as progress:
    r = {
      s: compute_representations(
        bert_config,
        bert_params,
        splits[s],
        mode,
        layer,
        pooling,
        batch_size,
        name=f"the attacker's {s} rows" if s != "test" else "the test rows",
        progress=progress,
      )
      for s in z
    }
  logging.info("Representations (%s): %s", mode, {s: v.shape for s, v in r.items()})
  attacker = train_attacker(
    r,
    z,
    attrs,
    int(config.attacker_hidden_size),
    int(config.attacker_epochs),
    float(config.attacker_learning_rate),
    int(config.attacker_batch_size),
    int(config.seed),
    scalar_mix=mode == "scalar_mix",
  )
  params = attacker.pop("params")
  mix = scalar_mix_lib.summary(params["scalar_mix"]) if mode == "scalar_mix" else None
  values = pm.majority_values(z["train"])
  majority = {
    "values": dict(zip(attrs.names, values.tolist())),
    **{
      s: pm.attack_metrics(
        z[s],
        pm.majority_predictions(z["train"], len(z[s])),
        *dataclasses.astuple(attrs),
        f"the majority baseline's {s} rows",
      )
      for s in ("dev", "test")
    },
  }
  logging.info(
    "Attacker: epoch %d of %d kept, test privacy %.4f (majority %.4f)",
    attacker["selected_epoch"],
    len(attacker["epochs"]),
    attacker["test"]["privacy"],
    majority["test"]["privacy"],
  )
  direct = None
  if config.direct_baseline:
    direct = train_direct(
      bert_config,
      bert_params,
      splits,
      z,
      attrs,
      mode,
      layer,
      pooling,
      int(config.attacker_hidden_size),
      max(1, int(round(float(config.num_train_epochs)))),
      float(config.learning_rate),
      int(config.train_batch_size),
      float(config.warmup_proportion),
      int(config.seed) + 1,
      int(config.eval_batch_size),
    )
  return {
    "representation": {
      "mode": mode,
      "layer": None if mode in ("pooled", "scalar_mix") else layer,
      "pooling": pooling if mode == "scalar_mix" else None,
      "shape": list(r["train"].shape[1:]),
    },
    "rows": {
      "attacker_train": len(z["train"]),
      "attacker_dev": len(z["dev"]),
      "test": len(z["test"]),
    },
    "attacker": attacker,
    "test": attacker["test"],
    "baselines": {"majority": majority, "direct": direct},
    "scalar_mix": mix,
  }


# --- from a checkpoint and a task ---------------------------------------------------------------
def load_encoder(config):
  """(encoder directory, Pretrained, tokenizer, BertConfig) of ``config.init_checkpoint``: of a
  fine-tuning workdir its best checkpoint (``config.which_checkpoint``)."""
  if not config.init_checkpoint:
    raise ValueError(
      "config.init_checkpoint is empty: set it to the encoder to probe (a bert_jax workdir, "
      "a Hugging Face directory or a google-research/bert checkpoint)"
    )
  if config.which_checkpoint not in CHOICES:
    raise ValueError(f"config.which_checkpoint={config.which_checkpoint!r} is not one of {CHOICES}")
  source = checkpoint_dir(config.init_checkpoint, config.which_checkpoint)
  pre = load_pretrained(source, do_lower_case=config.do_lower_case)  # with its head, if any
  tokenizer = pre.tokenizer
  if config.vocab_file:
    tokenizer = load_tokenizer(config.vocab_file, do_lower_case=config.do_lower_case)
  if tokenizer is None:
    raise ValueError(f"{source} has no vocabulary: set config.vocab_file")
  bert_config = run_bert_config(pre.config, config, platform=platform_of(None))
  return source, pre, tokenizer, bert_config


def task_splits(config, tokenizer):
  """(task, its PrivateAttributes, train SplitData, test SplitData = the task's first dev split);
  a task without private attributes is an error naming the key."""
  task = create_task(config, tokenizer)
  logging.info("probe: reading %s and fitting its private attributes", config.task)
  with Heartbeat(
    f"probe: fitting the private attributes of {config.task}", interval_sec=_interval()
  ):
    attrs = getattr(task, "private_attributes", None)
  if attrs is None:
    raise ValueError(
      f"task {config.task!r} has no private attributes to probe: set config.private_attributes "
      "(cola_source for cola, stsb_genre for stsb, conll_per with "
      "config.private_attributes_file for any task)"
    )
  loaded = []
  for split in (task.train_split, task.eval_splits[0]):
    with Heartbeat(
      f"probe: reading and tokenising {config.task} {split}", interval_sec=_interval()
    ):
      loaded.append(task.load_split(split))
  train, test = loaded
  for data in (train, test):
    if "private" not in data.arrays:
      raise ValueError(f"{config.task} split {data.split!r} has no 'private' array")
  return task, attrs, train, test


def _interval() -> float:
  return progress_lib.INTERVAL_SEC  # read when the work starts


def main_task_note(config, task, pre) -> str:
  """Empty when the main task can be scored: ``config.init_checkpoint`` is a bert_jax
  fine-tuning workdir of ``config.task`` and the checkpoint read (``pre``) carries its
  classifier; else why not (a pre-training workdir, another task's, a directory of another
  kind). Reads only the workdir's small JSON files, so it runs before any training; an
  unreadable one is an error naming it."""
  path = config.init_checkpoint
  files = {f: os.path.join(path, f) for f in ("head.json", "config.json")}
  if not all(os.path.isfile(f) for f in files.values()):
    return f"{path} is not a bert_jax fine-tuning workdir (no head.json + config.json)"
  run_config, head = read_json(files["config.json"]), read_json(files["head.json"])
  if not isinstance(run_config, dict) or not isinstance(head, dict):
    bad = files["config.json"] if not isinstance(run_config, dict) else files["head.json"]
    raise ValueError(f"{bad}: expected a JSON object")
  run_task = run_config.get("task")
  if run_task is None:
    if head.get("task") == "pretraining":
      return (
        f"{path} is a pre-training workdir ({files['config.json']} names no 'task'): there is "
        "no main task to score"
      )
    return f"{path} is not a fine-tuning workdir ({files['config.json']} names no 'task')"
  if run_task != config.task:
    return f"{path} was fine-tuned on {run_task!r}, not {config.task!r}"
  if pre.task != task.head or pre.num_labels != task.num_labels:
    return f"{pre.path} carries a {pre.task} head of {pre.num_labels} labels, not the task's"
  return ""


def main_task_metric(
  config, task, pre, bert_config: BertConfig, test, note: str | None = None
) -> tuple[dict | None, str]:
  """The fine-tuned model's own metrics on the test rows (``task.evaluate``) when
  ``main_task_note`` (or ``note``, its answer computed earlier) is empty; else (None, why not).
  Nothing is locked or written in the fine-tuning workdir."""
  note = main_task_note(config, task, pre) if note is None else note
  if note:
    return None, note
  model = task.build_model(bert_config)
  params = {k: pre.params[k] for k in ("bert", "classifier")}
  run = jax.jit(lambda p, b: task.predict(task.apply(model, p, b, True)))
  predictions = _batched(
    run,
    jax.device_put(params),
    test.arrays,
    int(config.eval_batch_size),
    f"probe: main task {task.name} on {test.split}",
  )
  metrics, _ = task.evaluate(test, predictions)
  return {
    "split": test.split,
    "metric": task.primary_metric,
    "value": metrics.get(task.primary_metric),
    "metrics": {k: float(v) for k, v in metrics.items() if np.isscalar(v)},
    "checkpoint": pre.path,
  }, ""


def _batched(run, params, arrays: Mapping[str, np.ndarray], batch_size: int, what: str) -> dict:
  """``run(params, batch)`` over every row in batches (the last padded), outputs in row order;
  progress logged as '<what>: b/B batches ...'."""
  n = len(arrays["input_ids"])
  logging.info("%s: %d rows in batches of %d", what, n, batch_size)
  outs = []
  with Progress(
    what, total=-(-n // batch_size), unit="batches", interval_sec=_interval()
  ) as progress:
    for start in range(0, n, batch_size):
      idx = np.arange(start, min(start + batch_size, n))
      idx = np.concatenate([idx, np.full(batch_size - idx.size, idx[0])])
      batch = {k: arrays[k][idx] for k in ("input_ids", "input_mask", "segment_ids")}
      if start:
        outs.append(jax.device_get(run(params, batch)))
      else:
        with Heartbeat(f"{what}: first batch (compiling)", interval_sec=_interval()):
          outs.append(jax.device_get(run(params, batch)))
      progress.update()
  return {k: np.concatenate([o[k] for o in outs])[:n] for k in outs[0]}


def run_probe(config, workdir: str) -> dict[str, Any]:
  """The whole probe (module docstring); writes ``<workdir>/probe.json`` and the same content as
  ``metrics.json`` (what ``launch sweep`` looks for), and returns it. A probe that fails leaves
  no workdir it created (an empty one is removed)."""
  if config.init_checkpoint and os.path.realpath(workdir) == os.path.realpath(
    config.init_checkpoint
  ):
    raise ValueError("the probe's workdir must not be config.init_checkpoint (it writes there)")
  check_config(config)  # before anything is created or loaded
  created = not os.path.exists(workdir)
  os.makedirs(workdir, exist_ok=True)
  try:
    with WorkdirLock(workdir, purpose="probe"):
      return _run_probe(config, workdir)
  except BaseException:
    if created:
      try:
        os.rmdir(workdir)  # only if empty: nothing of another run's is removed
      except OSError:
        pass
    raise


def _run_probe(config, workdir: str) -> dict[str, Any]:
  enable_compilation_cache(config.compilation_cache)
  logging.info("probe: loading the encoder %s", config.init_checkpoint)
  with Heartbeat(f"probe: loading the encoder {config.init_checkpoint}", interval_sec=_interval()):
    source, pre, tokenizer, bert_config = load_encoder(config)
  check_config(config, bert_config.num_hidden_layers)  # the layer, before reading any data
  task, private, train, test = task_splits(config, tokenizer)
  # Everything that can refuse the run does so before the attacker trains: the main task's
  # workdir files, the rows kept, the attributes' positives.
  note = main_task_note(config, task, pre)
  if note:
    logging.info("probe: main_task is null: %s", note)
  names = tuple(private.names)
  data_name = getattr(getattr(task, "spec", None), "dir_name", task.name)  # "CoLA"
  where_train, where_test = f"{data_name} {train.split}", f"{data_name} {test.split}"
  train_rows, dev_rows, test_rows = select_rows(
    train.arrays["private"],
    test.arrays["private"],
    config.dev_fraction,
    int(config.seed),
    bool(config.require_attribute),
    names,
    (where_train, where_test),
  )
  if len(test_rows) < test.num_rows:  # the main task is scored on the same rows
    test = dataclasses.replace(
      test,
      arrays={k: v[test_rows] for k, v in test.arrays.items()},
      examples=[test.examples[i] for i in test_rows],
    )
  keys = ("input_ids", "input_mask", "segment_ids", "private")
  splits = {
    "train": {k: train.arrays[k][train_rows] for k in keys},
    "dev": {k: train.arrays[k][dev_rows] for k in keys},
    "test": {k: test.arrays[k] for k in keys},
  }
  fewer = "or fewer attributes (config.num_private_attributes)"
  where = {
    "train": (
      f"the attacker's training rows ({where_train} less config.dev_fraction)",
      "use more training rows (config.max_train_examples takes the first rows of a file; "
      f"config.train_sample_seed >= 0 a uniform sample) {fewer}",
    ),
    "dev": (
      f"the attacker's dev rows (config.dev_fraction={config.dev_fraction} of {where_train})",
      f"raise config.dev_fraction or use more training rows {fewer}",
    ),
    "test": (
      f"the test rows ({where_test})",
      "use more rows (config.max_eval_examples takes the first rows of a file; 0 reads it "
      f"all) {fewer}",
    ),
  }
  attrs = Attributes(names, private.privacy_metric)
  report = probe_arrays(config, bert_config, pre.params["bert"], splits, attrs, where)
  if report["baselines"]["direct"] is not None:
    logging.info(
      "Direct baseline: test privacy %.4f", report["baselines"]["direct"]["test"]["privacy"]
    )
  main, why = main_task_metric(config, task, pre, bert_config, test, note)
  result = {
    "task": task.name,
    "test_split": test.split,
    "primary_metric": "test.privacy",
    "higher_is_better": True,
    "checkpoint": {"path": config.init_checkpoint, "encoder": source, "source": pre.source},
    "private_attributes": dataclasses.asdict(private),
    "main_task": main,
    "main_task_note": why or None,
    **report,
    "config": config.to_dict(),
  }
  write_json(os.path.join(workdir, PROBE_FILE), result)
  write_json(os.path.join(workdir, "metrics.json"), result)
  return result
