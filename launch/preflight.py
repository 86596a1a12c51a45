"""Pre-flight: compile the job for its TPU slice or GPU hosts before anything is created,
shipped or submitted.

  record = preflight(job, config, "v4-128")     # LaunchError when a step does not fit
  record = preflight(job, config, gpu_topology_name("h100", hosts=2, gpus_per_host=8))

The job's train and eval steps are compiled by the XLA TPU compiler for the slice's topology,
or by XLA:GPU for the GPU hosts (``bert_jax.plan.compiler``: the steps the entry point will run,
from the resolved config), on this machine, without a TPU or GPU, in a child process: a crash of
the compiler refuses the launch with the signal and the compiler's output file, it does not end
the launcher. A step that does not fit in a
chip's memory refuses the launch with the compiler's numbers; ``--skip_preflight`` launches
anyway. Before any compile the config is checked as the entry point will check it
(``bert_jax.plan.compiler.check_config``: ``check_run_config``'s ranges, the task's checks, the
batch layout on the target's mesh and hosts): a config the run would refuse stops the launch
with the run's own one-line error (``pre-flight for v4-128: invalid config:
config.train_batch_size=0 (must be positive)``), which ``--skip_preflight`` does not make any
better. The result (memory per chip, estimated step time, collectives) goes into launch.json
under ``preflight``. Needs libtpu here (``pip install 'bert-jax[tpu]'``) for TPU targets, the
CUDA PJRT plugin (``pip install 'bert-jax[gpu-aot]'``) for GPU ones (SLURM, Kubernetes with
``gpu_type`` set).
"""

from __future__ import annotations

import copy
import sys
from typing import TYPE_CHECKING, Any

from .job import Job, LaunchError

if TYPE_CHECKING:  # the targets import this module
  from .targets.base import Target

COMPILABLE = ("bert_jax.pretrain", "bert_jax.finetune")
GiB = 1024**3


def _summary(result: dict[str, Any]) -> list[str]:
  lines = []
  for step in result["steps"]:
    m = step["memory"]
    if step["fits"]:
      e = step["estimate"]
      lines.append(
        f"{step['name']}: {m['total_bytes'] / GiB:.2f} of {m['hbm_bytes'] / GiB:.2f} GiB per chip"
        f", est. {e['step_seconds'] * 1e3:.1f} ms/step, MFU {e['mfu']:.0%}"
      )
    elif "needed_bytes" in m:
      lines.append(
        f"{step['name']}: needs {m['needed_bytes'] / GiB:.2f} GiB per chip, "
        f"{m['available_bytes'] / GiB:.2f} GiB available (over by {m['over_bytes'] / GiB:.2f} GiB)"
      )
    else:
      lines.append(f"{step['name']}: does not fit: {step['error']}")
  return lines


def _progress(line: str) -> None:
  """A line at least every 30 s while the pre-flight compiles (stderr: the launcher's output
  stream holds the plan and the commands)."""
  print(f"launch: pre-flight: {line}", file=sys.stderr, flush=True)


def gpu_topology_name(gpu_type: str, hosts: int, gpus_per_host: int) -> str:
  """The ``--topology`` name of ``hosts`` x ``gpus_per_host`` GPUs, e.g. "h100:2x8", "h100:8"."""
  return f"{gpu_type}:{hosts}x{gpus_per_host}" if hosts > 1 else f"{gpu_type}:{gpus_per_host}"


def check_job_config(job: Job, config, target: Target) -> None:
  """LaunchError with the entry point's own one-line error when ``pretrain`` / ``finetune``
  would refuse ``config`` before any work (a dry run says so too, starting nothing): the
  numbers' ranges, the task's checks (packing a task that cannot be packed, ...) and the
  attention kernel (a fused kernel with attention dropout). On the target's topology where it
  names one (``bert_jax.plan.compiler.check_config``, no compile); else the platform-free
  checks, and for a target on this machine the kernel on this host's devices."""
  if job.module not in COMPILABLE or config is None:
    return
  # bert_jax (JAX) only when a config is checked: the launcher itself stays light.
  from bert_jax.model.kernels.attention import ATTENTION_KERNELS, FUSED  # noqa: PLC0415 (heavy)
  from bert_jax.model.run_settings import run_attention_kernel  # noqa: PLC0415 (heavy)
  from bert_jax.parallel.topology import TopologyError, parse_topology  # noqa: PLC0415 (heavy)
  from bert_jax.plan.compiler import check_config  # noqa: PLC0415 (heavy)
  from bert_jax.runs.jobs import build_job  # noqa: PLC0415 (heavy)
  from bert_jax.runs.rules import check_run_config  # noqa: PLC0415 (heavy)

  topology = target.topology_name()
  try:
    if topology:
      check_config(config, parse_topology(topology))
      return
    check_run_config(config)
    kernel = config.get("attention_kernel", "reference")
    if not target.on_this_machine:  # the remote devices' platform is not known: the kernel's
      if kernel in FUSED:  # own checks, as the run makes them, on an accelerator it runs on
        platforms = [p for p in ATTENTION_KERNELS[kernel].platforms if p != "cpu"]
        run_attention_kernel(  # the dropout it cannot take, each phase's length
          config,
          platform=platforms[0] if platforms else "gpu",  # () = every platform
          attention_dropout=float(config.attention_probs_dropout_prob),
        )
      config = copy.deepcopy(config)
      with config.unlocked():
        config.attention_kernel = "reference"
    build_job(config, abstract=True)
  except (ValueError, TopologyError) as e:
    raise LaunchError(f"invalid config (the entry point would refuse it): {e}") from None


def preflight(job: Job, config, accelerator_type: str, num_slices: int = 1) -> dict[str, Any]:
  """Compiles ``job`` (its resolved ``config``) for ``accelerator_type`` (a TPU accelerator
  type or topology, or a GPU topology name); the JSON-safe result. LaunchError naming the
  numbers when a step does not fit, or when it cannot be checked."""
  if job.module not in COMPILABLE:
    return {"skipped": f"{job.module} is not a training entry point"}
  # bert_jax (JAX, libtpu) only when a launch is checked: the launcher itself stays light.
  from bert_jax.parallel.topology import TopologyError, parse_topology  # noqa: PLC0415 (heavy)
  from bert_jax.plan.compiler import check_config  # noqa: PLC0415 (heavy)
  from bert_jax.plan.isolation import compile_for_topology_isolated  # noqa: PLC0415 (heavy)

  try:
    topo = parse_topology(accelerator_type, num_slices)
  except (ValueError, TopologyError) as e:
    raise LaunchError(
      f"pre-flight for {accelerator_type}: {e} (--skip_preflight to launch anyway)"
    ) from None
  try:
    check_config(config, topo)  # the run's own checks, before any compile
  except ValueError as e:
    raise LaunchError(f"pre-flight for {accelerator_type}: {e}") from None
  try:
    result = compile_for_topology_isolated(config, topo, progress=_progress)  # a crash: an error
  except (ValueError, TopologyError) as e:
    raise LaunchError(
      f"pre-flight for {accelerator_type}: {e} (--skip_preflight to launch anyway)"
    ) from None
  result.pop("reports", None)
  lines = _summary(result)
  result["summary"] = lines
  if not result["fits"]:
    raise LaunchError(
      f"pre-flight: the job does not fit on {topo.describe()}: {'; '.join(lines)}. Nothing was "
      "created. Use `python -m bert_jax.compile --plan` to find a layout that fits, or "
      "--skip_preflight to launch anyway"
    )
  return result
