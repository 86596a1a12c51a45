"""The downstream-task interface: what a fine-tuning task supplies.

A task is one class, built as ``TaskClass(config, tokenizer)`` from the run config (a locked
``ml_collections.ConfigDict``, see ``configs/glue.py``) and a ``bert_jax.tokenize`` Tokenizer.
``bert_jax.runs.finetuning.runner`` turns it into the trainer's ``Job`` (batching and padding, the
evaluation pass, predictions, metrics.json); the trainer (``bert_jax.train.trainer``) owns
everything that is the same for every run: the mesh and shardings, the optimizer, the jitted
train step, the Orbax checkpoints (keep-best on dev), resume, initialisation from a pre-trained
encoder, TensorBoard. A task owns only what is task specific:

========================  ================================================================
``name``, ``head``        registry name; head kind for head.json ("sequence_classification",
                          "token_classification", "question_answering", "multiple_choice")
``primary_metric``        key in ``evaluate``'s metrics used to keep the best checkpoint
``higher_is_better``      direction of ``primary_metric`` (True for acc/F1/MCC/EM)
``labels``                label names (head.json; [] for regression and span tasks)
``train_split``           split name used for training (usually "train")
``eval_splits``           dev split names evaluated during and after training, e.g.
                          ("dev",) or ("dev_matched", "dev_mismatched") for MNLI; the first
                          one's ``primary_metric`` selects the best checkpoint
``test_splits``           splits without labels for which only predictions are written
``build_model(cfg)``      the Flax module (keeps the encoder under params["bert"])
``load_split(split)``     read + featurise a split -> ``SplitData`` (numpy arrays, [N, ...])
``apply(...)``            run the module on a batch -> dict of outputs (default: the three
                          standard inputs; override with ``init_batch``/``init_variables``
                          for other inputs)
``loss(outputs, batch)``  pure jnp: (scalar loss, dict of scalar metrics) for a training batch
``predict(outputs)``      pure jnp: dict of per-row arrays to bring back to the host at eval
``evaluate(data, preds)`` host side: (metrics dict, predictions) from all rows of a split
``write_predictions``     write prediction files for a split into a directory, return paths
``added_config_keys``     run-config keys the task's configs gained after workdirs were
                          written, with the value that reproduces an older run (filled in
                          when a workdir's config.json is read back)
========================  ================================================================

Batches. ``SplitData.arrays`` holds every array the model or the loss needs, each with the
same leading dimension N (one row per *feature*: a GLUE pair, a SQuAD window, a SWAG example
with its C choices). The runner slices rows, shuffles for training (dropping the remainder),
and, for evaluation, pads the last batch with copies of row 0 and drops the padded rows'
outputs before calling ``evaluate``; ``predict`` outputs therefore need a leading axis of the
batch size. Rows of a padded training batch never exist, so ``loss`` sees only real rows; a
per-row weight, where a task wants one, is just another array in ``arrays``.

Length axes (``bert_jax.data.length_buckets``). With ``config.length_buckets`` on, the runner
cuts every batch to the shortest bucket that holds its longest row (by ``input_mask``), for
training and evaluation alike. What it cuts is declared, never guessed: ``sequence_axes`` maps
each array of ``SplitData.arrays`` that has a length dimension to that axis (default: the three
model inputs on axis 1; SWAG's BxCxL inputs use axis 2; NER adds its BxL labels and weights);
``position_keys`` names arrays holding positions into the sequence (SQuAD's start/end), which
the cut always keeps inside; ``prediction_axes`` maps ``predict`` outputs with a length axis
(NER's label ids, SQuAD's logits) to it, and the runner pads them back to ``max_seq_length``
before ``evaluate``. Padding is masked in attention, so the model's outputs on the real
positions do not change.

Packing (``config.packing.enabled``, ``bert_jax.runs.finetuning.inputs.Packer``). A task whose
``packing_unsupported()`` returns "" (GLUE, NER) may have several rows packed into one: every
array with a length axis (``sequence_axes``) moves with its tokens, every other array becomes
[R, S, ...] (one entry per sequence slot), and the batch gains ``position_ids``,
``sequence_ids``, ``cls_positions`` and ``sequence_weights`` (1 per real sequence slot).
``apply`` passes the model's packing inputs (``packed_inputs``) found in the batch; ``loss``
weighs per-sequence terms by ``sequence_weights``.

Whatever else post-processing needs (example ids, token-to-word maps, SQuAD windows' offsets)
goes in ``SplitData.examples`` / ``SplitData.features``, which the runner never looks at.
``SplitData.stats`` holds counts worth reporting (examples read, truncated, skipped); the runner
logs them and writes them into metrics.json.

Bad input is the task's to report: errors name the file and line (or JSON key / question id);
documented skips are counted in ``stats``.

Frozen parameters (the feature-based approach): ``trainable(path)`` says for a parameter path
(a tuple of names) whether the optimizer updates it; the default trains everything.
``optimizer_groups()`` gives parameters their own optimizer (name -> ``OptimizerGroup``, e.g. a
defence's adversary); ``param_report(params)`` is what a run reports about its trained
parameters (e.g. learned scalar-mix weights), written into metrics.json as "param_report".

A new task is registered in ``bert_jax/tasks/registry.py`` (``TASKS``: name -> "module:Class",
imported lazily) and gets a config file in ``configs/``.
"""

from __future__ import annotations

import abc
import dataclasses
import types
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from bert_jax.model import BertConfig

INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")
# A packed batch's model inputs (keyword arguments of the heads), when present in the batch.
PACKED_INPUTS = ("position_ids", "sequence_ids", "cls_positions")


@dataclasses.dataclass
class SplitData:
  """One featurised split.

  Attributes:
    split: the split's name ("train", "dev", "dev_matched", "test", ...).
    arrays: numpy arrays with the same leading dimension N (rows = features); the model inputs
      (``input_ids``, ``input_mask``, ``segment_ids`` int32) and the targets the loss needs.
    examples: the task's own examples (opaque to the runner), for post-processing and metrics.
    features: the task's own per-row metadata (opaque to the runner), e.g. SQuAD windows.
    stats: counts to report, e.g. {"examples": 872, "truncated": 3, "skipped": 0}.
    has_labels: False for unlabelled test splits (only predictions are written).
  """

  split: str
  arrays: dict[str, np.ndarray]
  examples: Any = None
  features: Any = None
  stats: dict[str, int] = dataclasses.field(default_factory=dict)
  has_labels: bool = True

  def __post_init__(self):
    sizes = {k: int(v.shape[0]) for k, v in self.arrays.items()}
    if len(set(sizes.values())) > 1:
      raise ValueError(f"split {self.split!r}: arrays differ in their leading dimension {sizes}")

  @property
  def num_rows(self) -> int:
    return int(next(iter(self.arrays.values())).shape[0]) if self.arrays else 0


class Task(abc.ABC):
  """A downstream task (see the module docstring for the contract)."""

  name: str = ""
  head: str = ""
  primary_metric: str = ""
  higher_is_better: bool = True
  train_split: str = "train"
  eval_splits: Sequence[str] = ("dev",)
  test_splits: Sequence[str] = ("test",)
  position_keys: Sequence[str] = ()
  # The packing inputs the task's model takes as keyword arguments (see PACKED_INPUTS).
  packed_inputs: Sequence[str] = PACKED_INPUTS
  # Keys the task's configs gained after workdirs were written, with the value that reproduces
  # what such an older run did (``runner_io.read_run_config`` adds those a config.json lacks).
  added_config_keys: Mapping[str, Any] = types.MappingProxyType({})

  def __init__(self, config: ml_collections.ConfigDict, tokenizer: Any):
    self.config = config
    self.tokenizer = tokenizer

  @property
  def labels(self) -> list[str]:
    """Label names in logit order ([] for regression and span tasks)."""
    return []

  @property
  def num_labels(self) -> int:
    return len(self.labels)

  def packing_unsupported(self) -> str:
    """Why ``config.packing.enabled`` cannot be used with this task ("" when it can)."""
    return f"task {self.name!r} cannot be packed (GLUE and NER can)"

  @property
  def sequence_axes(self) -> dict[str, int]:
    """Array key -> its length axis, for every array of ``SplitData.arrays`` that has one."""
    return {k: 1 for k in INPUT_KEYS}

  @property
  def prediction_axes(self) -> dict[str, int]:
    """``predict`` output key -> its length axis, for outputs that have one."""
    return {}

  def head_info(self) -> dict[str, Any]:
    """The content of head.json."""
    return {
      "task": self.head,
      "num_labels": self.num_labels,
      "labels": list(self.labels),
      "name": self.name,
    }

  @abc.abstractmethod
  def build_model(self, bert_config: BertConfig) -> nn.Module:
    """The Flax module; it keeps the encoder under params["bert"]."""

  @abc.abstractmethod
  def load_split(self, split: str) -> SplitData:
    """Read and featurise ``split``; errors name the file and line."""

  def apply(
    self,
    model: nn.Module,
    params: Any,
    batch: Mapping[str, jax.Array],
    deterministic: bool,
    rng: jax.Array | None = None,
  ) -> dict[str, Any]:
    """Run the model on a batch (dropout rng under the name "dropout"); a packed batch's
    ``packed_inputs`` are passed as keyword arguments."""
    rngs = None if deterministic or rng is None else {"dropout": rng}
    packed = {k: batch[k] for k in self.packed_inputs if k in batch}
    return model.apply(
      {"params": params},
      *(batch[k] for k in INPUT_KEYS),
      deterministic=deterministic,
      rngs=rngs,
      **packed,
    )

  def init_variables(self, model: nn.Module, rng: jax.Array, batch_size: int) -> Any:
    """``model.init`` on ``init_batch(batch_size)`` (deterministic): the boxed variables."""
    batch = self.init_batch(batch_size)
    return model.init({"params": rng}, *(batch[k] for k in INPUT_KEYS), deterministic=True)

  def init_batch(self, batch_size: int) -> dict[str, np.ndarray]:
    """A dummy batch with the model inputs' shapes, for ``model.init`` / ``jax.eval_shape``."""
    length = int(self.config.max_seq_length)
    return {k: np.zeros((batch_size, length), np.int32) for k in INPUT_KEYS}

  def target_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The arrays besides the model inputs that ``loss`` reads from a training batch (shapes and
    dtypes as ``load_split`` makes them), so a run's step can be compiled without data."""
    return {}

  def train_batch_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """One global training batch's shapes and dtypes: the model inputs and the targets."""
    inputs = {
      k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in self.init_batch(batch_size).items()
    }
    return {**inputs, **self.target_spec(batch_size)}

  @abc.abstractmethod
  def loss(
    self, outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(scalar loss, scalar metrics) for a training batch; pure jnp, jitted."""

  @abc.abstractmethod
  def predict(self, outputs: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Per-row arrays (leading axis = batch) brought back to the host for ``evaluate``."""

  @abc.abstractmethod
  def evaluate(
    self, data: SplitData, predictions: Mapping[str, np.ndarray]
  ) -> tuple[dict[str, float], Any]:
    """(metrics, task predictions) for a split; metrics are {} when not data.has_labels."""

  @abc.abstractmethod
  def write_predictions(self, data: SplitData, predictions: Any, out_dir: str) -> list[str]:
    """Write prediction file(s) for a split into ``out_dir``; return their paths."""

  def trainable(self, path: tuple[str, ...]) -> bool:
    """Whether the optimizer updates the parameter at ``path`` (default: all of them)."""
    del path
    return True

  def optimizer_groups(self) -> dict[str, Any]:
    """Parameters trained by their own optimizer: name -> ``train.optimizers.OptimizerGroup``."""
    return {}

  def param_report(self, params: Any) -> dict[str, Any]:
    """JSON-able facts about trained parameters (host numpy) for metrics.json; {} by default."""
    del params
    return {}
