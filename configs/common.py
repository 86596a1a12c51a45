"""Config sections shared by every bert_jax entry point (pre-training and fine-tuning).

Each function returns a fresh ``ml_collections.ConfigDict`` holding every knob with its default;
an entry point's ``get_config`` assembles them and locks the result, so ``--config.<key>=value``
on a key that does not exist is an error. This module imports nothing from bert_jax.

  mesh_config()           config.mesh: sizes of the data / fsdp / tensor mesh axes (-1 = the rest)
  logical_axis_rules()    config.logical_axis_rules: model axis names -> mesh axes (t5x style)
  optimizer_config()      config.optimizer: AdamW (BERT's) or LAMB, weight decay, clipping
  checkpoint_config()     config.checkpoint: Orbax manager options
  logging_config()        config.logging: console/TensorBoard cadence and the MFU peak
  distributed_config()    config.distributed: jax.distributed.initialize() arguments
  compilation_cache_config()  config.compilation_cache: JAX's persistent compilation cache
  add_common(config)      all of the above, plus ``seed``

See docs/pretraining.md for what each knob does, e.g.
  python -m bert_jax.pretrain --config configs/pretrain.py:tiny --workdir workdir/tiny \
    --config.mesh.fsdp=2 --config.optimizer.name=lamb
"""

from __future__ import annotations

import ml_collections


def mesh_config() -> ml_collections.ConfigDict:
  """Device mesh axes. Their product must equal the number of devices; one may be -1."""
  return ml_collections.ConfigDict(
    dict(
      data=-1,  # pure data parallelism (replicated params)
      fsdp=1,  # data parallelism with params/optimizer state sharded (ZeRO-3 style)
      tensor=1,  # Megatron-style tensor parallelism over heads / mlp / vocab
    )
  )


def logical_axis_rules() -> tuple[tuple[str, object], ...]:
  """Logical axis name -> mesh axis (or tuple of axes, or None). First free match wins.

  Batches are split over data x fsdp; weights are split over fsdp on their ``embed`` dimension
  and over tensor on ``mlp``/``heads``/``vocab``. A dimension that a mesh axis does not divide
  (e.g. a vocab of 30,522 over tensor=4) is left unsharded, with a log line saying so.
  """
  return (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("embed", "fsdp"),
  )


def optimizer_config() -> ml_collections.ConfigDict:
  """BERT's AdamW (decoupled weight decay, none on LayerNorm/bias) or LAMB; grad clipping."""
  return ml_collections.ConfigDict(
    dict(
      name="adamw",  # "adamw" | "lamb"
      weight_decay=0.01,  # decoupled; not applied to LayerNorm parameters and biases
      b1=0.9,
      b2=0.999,
      eps=1e-6,
      max_grad_norm=1.0,  # global-norm clipping before the update; <= 0 disables
      # linear warmup, then: "linear" (BERT's: the line from peak at step 0 to 0 at the end) |
      # "linear_after_warmup" (peak at the end of warmup to 0; HF's default) | "constant"
      schedule="linear",
    )
  )


def checkpoint_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
    dict(
      keep_checkpoint_max=3,  # keep the last k checkpoints
      # also keep every checkpoint whose step is a multiple of this (0: none), e.g. to
      # fine-tune from several points of a pre-training run (paper appendix C.1)
      keep_period=0,
      async_save=True,  # save in a background thread while training continues
      save_on_preemption=True,  # on SIGTERM: save the current step, then exit cleanly
    )
  )


def logging_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
    dict(
      log_every_steps=10,  # console line + TensorBoard scalars
      # Peak FLOP/s of one device for model-FLOPs utilisation; 0 = look up by device kind
      # (see bert_jax/train/flops.py), which for CPUs uses cpu_peak_flops_per_device.
      peak_flops_per_device=0.0,
      cpu_peak_flops_per_device=4e11,  # ~2 AVX-512 cores, fp32 FMA (378 GFLOP/s measured here)
    )
  )


def distributed_config() -> ml_collections.ConfigDict:
  """Multi-process (multi-host) set-up; values here win over the environment.

  When ``num_processes`` resolves (from here or $JAX_NUM_PROCESSES) to more than one,
  ``jax.distributed.initialize`` is called with the coordinator ($JAX_COORDINATOR_ADDRESS) and
  process id ($JAX_PROCESS_ID). ``auto_detect=True`` instead lets JAX detect a cluster (TPU pod,
  SLURM, Open MPI, Kubernetes) by itself.
  """
  return ml_collections.ConfigDict(
    dict(
      coordinator_address="",
      num_processes=-1,
      process_id=-1,
      auto_detect=False,
    )
  )


def compilation_cache_config() -> ml_collections.ConfigDict:
  """JAX's persistent compilation cache (bert_jax/parallel/compilation_cache.py).

  On by default, under the user's cache directory: a fine-tuning sweep or a new seed re-runs
  the same train/eval programs, and on a small machine compiling them costs as much as
  hundreds of steps; loading them costs well under a second. The key covers program, flags,
  backend and devices, so nothing stale is reused. JAX executes what it reads from there, so
  the directory must be private to the user. "" leaves JAX's own setting alone (off unless
  $JAX_COMPILATION_CACHE_DIR is set).
  """
  return ml_collections.ConfigDict(
    dict(
      dir="~/.cache/bert_jax/jax_compilation_cache",
      # JAX's default: a program compiling faster than this (the init and small host-side jits)
      # costs more to write and read than it saves; every train and eval step takes longer.
      min_compile_time_secs=1.0,
      max_size_bytes=-1,  # LRU-evict beyond this many bytes; -1 = no limit (JAX's default)
    )
  )


def add_common(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds every shared section to ``config`` (unlocked) and returns it."""
  config.seed = 12345
  # How attention is computed: "reference" (BERT's, with attention dropout), "dot_product"
  # (jax.nn.dot_product_attention: cuDNN on GPUs), "splash" (Pallas, TPUs), or "auto" (the
  # fused kernel of the platform when attention_probs_dropout_prob is 0, else "reference").
  # Fused kernels have no attention dropout: asking for one with dropout > 0 is an error.
  config.attention_kernel = "reference"
  config.mesh = mesh_config()
  config.logical_axis_rules = logical_axis_rules()
  config.optimizer = optimizer_config()
  config.checkpoint = checkpoint_config()
  config.logging = logging_config()
  config.distributed = distributed_config()
  config.compilation_cache = compilation_cache_config()
  return config
