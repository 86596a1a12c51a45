"""Run a job on Kubernetes: a JobSet (one Indexed Job per slice) or an Indexed Job and a
headless Service, restarted after a preemption (the manifests: kubernetes_manifests.py).

``workload`` chooses: "jobset", "job", or "auto" (a JobSet for more than one pod, an Indexed Job
for one). Every pod gets ``JAX_COORDINATOR_ADDRESS`` (pod 0's DNS name through the headless
Service), ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``, ``BERT_JAX_ATTEMPT`` and
``BERT_JAX_MAX_RESTARTS``. A JobSet is restarted as a whole, up to ``max_restarts`` times, after
a pod was preempted (exit 143, or the ``DisruptionTarget`` condition), killed by a signal or
ended with an error (1: also what a lost host's peers end with); 2, 3 and 130 are never
retried (an Indexed Job does not retry 1 either); ``max_restarts=0`` turns restarts off (an
Indexed Job is then the plain ``backoffLimit: 0`` Job). ``queue_name`` submits to a Kueue
LocalQueue (label ``kueue.x-k8s.io/queue-name``). ``accelerator_type`` runs on GKE TPU slices
(``num_slices`` of them over the data-center network): one pod per TPU host requesting its
chips as ``google.com/tpu``, on nodes selected by ``cloud.google.com/gke-tpu-accelerator`` and
``cloud.google.com/gke-tpu-topology``, each slice on its own node pool (JobSet's exclusive
placement by ``cloud.google.com/gke-nodepool``). The workdir must be storage every pod can
write: a gs:// path, or a path inside ``volume_claim`` mounted at ``volume_mount``.

:meth:`KubernetesTarget.validate` checks every setting by the API server's rules for the field
it fills (names, quantities, ports; Kueue's for the queue name), ``gpu_type`` against the GPUs
the pre-flight knows and ``accelerator_type`` against the TPU slices it knows, so a dry run
refuses what ``kubectl apply`` or the launch would; the manifests themselves are checked
against the Kubernetes API's schemas and JobSet's and Kueue's CRD schemas in
tests/test_launch_kubernetes_schema.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import subprocess
import sys
import threading
from typing import Any, TextIO

import yaml

from ..job import Job, LaunchError
from ..preflight import gpu_topology_name, preflight
from . import kubernetes_manifests
from .base import Target
from .kubernetes_manifests import SLICE

WORKLOADS = ("auto", "jobset", "job")
# The API server's name rules (k8s.io/apimachinery/pkg/util/validation) and resource.Quantity's
# form, for the fields the settings fill.
_LABEL_1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_1123 = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUANTITY = re.compile(r"(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?\d+)?")
_RESOURCE = re.compile(
  r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
  r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


def dns_name(text: str, limit: int = 40) -> str:
  """An RFC 1035 label from free text (lower case, digits and '-', starting with a letter):
  valid as a Service, Job and pod host name.

  When the text had to change, a hash of it is appended so that distinct texts (e.g. the runs
  of a sweep) keep distinct names.
  """
  name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
  if name == text and len(name) <= limit and name[:1].isalpha():
    return name
  if not name[:1].isalpha():  # a Service name must start with a letter (RFC 1035)
    name = f"bert-jax-{name}".rstrip("-")
  digest = hashlib.sha1(text.encode()).hexdigest()[:8]
  return f"{name[: limit - 9].strip('-')}-{digest}"


@dataclasses.dataclass(frozen=True)
class KubernetesTarget(Target):
  """Settings of a Kubernetes launch; ``image`` is required.

  Attributes:
    image: the container image holding bert_jax (and the accelerator's jax).
    job_name: the JobSet/Job/Service name (DNS label); default from the workdir's last
      component.
    namespace: the namespace.
    num_hosts: pods = jax processes (with accelerator_type: the slices' hosts, from it).
    gpus_per_host: accelerators per pod (requested as ``accelerator_resource``).
    accelerator_resource: e.g. "nvidia.com/gpu" or "google.com/tpu".
    cpu, memory: per-pod requests (empty: none).
    remote_dir: the container's working directory (where the code is).
    coordinator_port: the jax.distributed coordinator's port on pod 0.
    service_account: the pod's service account (e.g. with bucket access), if any.
    volume_claim, volume_mount: a PersistentVolumeClaim to mount (for a non-gs:// workdir).
    gpu_type: the NVIDIA GPUs ("h100", "h200", "a100-80gb", "a100-40gb"): when set, the job is
      first compiled for num_hosts x gpus_per_host of them (the pre-flight,
      launch/preflight.py) and refused before anything is applied if a step does not fit.
    skip_preflight: apply without that check.
    workload: "jobset" (a JobSet: one Indexed Job per slice, all restarted together), "job" (an
      Indexed Job and a headless Service) or "auto" (a JobSet for more than one pod).
    max_restarts: times the job is started again after a preemption (exit 143) or a pod killed
      by a signal (a JobSet: an error, exit 1, too); it resumes from its latest checkpoint (0:
      never). Exit 2, 3 and 130 are never retried.
    queue_name: a Kueue LocalQueue to submit to (label kueue.x-k8s.io/queue-name); empty: none.
    accelerator_type: a GKE TPU slice, e.g. "v5p-64", "v5litepod-16", "v4:2x2x4": pods (one per
      host) and google.com/tpu chips per pod come from it, with GKE's TPU node selectors; the
      job is first compiled for it like the tpu target's.
    num_slices: TPU slices (multislice over the data-center network; with accelerator_type).
  """

  image: str = ""
  job_name: str = ""
  namespace: str = "default"
  num_hosts: int = 1
  gpus_per_host: int = 0
  accelerator_resource: str = "nvidia.com/gpu"
  cpu: str = ""
  memory: str = ""
  remote_dir: str = "/workspace/bert_jax"
  coordinator_port: int = 8476
  service_account: str = ""
  volume_claim: str = ""
  volume_mount: str = "/mnt/workdir"
  gpu_type: str = ""
  skip_preflight: bool = False
  workload: str = "auto"
  max_restarts: int = 3
  queue_name: str = ""
  accelerator_type: str = ""
  num_slices: int = 1

  name = "kubernetes"

  @property
  def processes(self) -> int:
    return self.num_processes

  def topology_name(self) -> str | None:
    if self.accelerator_type:
      return self.accelerator_type
    if not self.gpu_type:
      return None
    return gpu_topology_name(self.gpu_type, self.num_hosts, self.gpus_per_host)

  def records_here(self, job: Job) -> bool:
    """Only a gs:// workdir: a path is one inside the pods (a volume), not here."""
    return job.workdir.startswith("gs://")

  def sweep_run(self, index: int, first: bool, parallel: int = 1) -> KubernetesTarget:
    """A distinct job name per run where one is set (``<job_name>-<index>``); else each
    run's name comes from its workdir."""
    del first, parallel
    return dataclasses.replace(self, job_name=f"{self.job_name}-{index}") if self.job_name else self

  def preflight(self, job: Job, config) -> dict | None:
    """Compiles the job for the TPU slices or the pods' GPUs (LaunchError when it does not
    fit); None when skipped or when neither accelerator_type nor gpu_type is given."""
    if self.skip_preflight or config is None:
      return None
    if self.accelerator_type:
      return preflight(job, config, self.accelerator_type, self.num_slices)
    if not self.gpu_type:
      return None
    return preflight(
      job, config, gpu_topology_name(self.gpu_type, self.num_hosts, self.gpus_per_host)
    )

  def validate(self, job: Job) -> None:
    """Every setting, by the API server's rules for the fields it fills (names, quantities,
    ports) and the GPUs and TPU slices the pre-flight knows; LaunchError (one line, naming the
    flag) before anything is printed or applied, in a dry run as in a launch."""
    if not self.image:
      raise LaunchError("kubernetes target: missing required setting: image (flag --image)")
    if re.search(r"\s", self.image):
      raise LaunchError(f"kubernetes target: --image {self.image!r} contains white space")
    if self.num_hosts < 1:
      raise LaunchError(f"kubernetes target: num_hosts must be >= 1, got {self.num_hosts}")
    if self.gpus_per_host < 0:
      raise LaunchError(f"kubernetes target: gpus_per_host must be >= 0, got {self.gpus_per_host}")
    if self.max_restarts < 0:
      raise LaunchError(f"kubernetes target: max_restarts must be >= 0, got {self.max_restarts}")
    if self.workload not in WORKLOADS:
      raise LaunchError(
        f"kubernetes target: --workload must be one of {WORKLOADS}, got {self.workload!r}"
      )
    if self.num_slices < 1:
      raise LaunchError(f"kubernetes target: num_slices must be >= 1, got {self.num_slices}")
    if self.num_slices > 1 and not self.accelerator_type:
      raise LaunchError("kubernetes target: --num_slices > 1 needs --accelerator_type (TPU slices)")
    if self.accelerator_type and self.gpu_type:
      raise LaunchError(
        "kubernetes target: --accelerator_type (TPU) and --gpu_type exclude each other"
      )
    if self.gpu_type and (self.gpus_per_host < 1 or self.accelerator_resource != "nvidia.com/gpu"):
      raise LaunchError(
        f"kubernetes target: gpu_type {self.gpu_type!r} needs gpus_per_host >= 1 and "
        f"accelerator_resource 'nvidia.com/gpu' (got {self.gpus_per_host}, "
        f"{self.accelerator_resource!r})"
      )
    if self.gpu_type:
      self.topology()
    if self.accelerator_type:
      self._check_tpu_hosts()
    slices, pods, _ = self.layout()
    if self.kind() == "Job" and slices > 1:
      raise LaunchError(
        f"kubernetes target: {slices} slices need --workload=jobset (one Indexed Job per slice)"
      )
    if self.job_name and not _LABEL_1035.fullmatch(self.job_name):
      raise LaunchError(
        f"kubernetes target: job_name {self.job_name!r} is not a DNS label "
        f"(lower case letters, digits and '-', starting with a letter, at most 63)"
      )
    name = self.resource_name(job)
    # The last pod's host name; a JobSet's pod names get 6 more characters (JobSet's webhook
    # checks "<host>-abcde" as a DNS label).
    if self.kind() == "Job":
      last_pod, limit = f"{name}-{pods - 1}", 63
    else:
      last_pod, limit = f"{name}-{SLICE}-{slices - 1}-{pods - 1}", 63 - 6
    if len(last_pod) > limit:
      raise LaunchError(
        f"kubernetes target: pod host name {last_pod!r} is longer than {limit} characters "
        f"(a shorter --job_name)"
      )
    for key, pattern, what in (
      ("namespace", _LABEL_1123, "a DNS label (lower-case letters, digits and '-', at most 63)"),
      ("service_account", _SUBDOMAIN, "a DNS subdomain name"),
      ("volume_claim", _SUBDOMAIN, "a DNS subdomain name"),
      ("cpu", _QUANTITY, "a Kubernetes quantity such as 8 or 500m"),
      ("memory", _QUANTITY, "a Kubernetes quantity such as 64Gi or 500M"),
      ("accelerator_resource", _RESOURCE, "a resource name such as nvidia.com/gpu"),
    ):
      value = getattr(self, key)
      if (value or key in ("namespace", "accelerator_resource")) and not (
        pattern.fullmatch(value) and len(value) <= 253
      ):
        raise LaunchError(f"kubernetes target: --{key} {value!r} is not {what}")
    # Kueue's webhook takes the label as a LocalQueue name (a DNS subdomain); a label value is
    # at most 63 characters.
    if self.queue_name and not (
      _SUBDOMAIN.fullmatch(self.queue_name) and len(self.queue_name) <= 63
    ):
      raise LaunchError(
        f"kubernetes target: --queue_name {self.queue_name!r} is not a Kueue LocalQueue name "
        "(lower-case letters, digits, '-' and '.', at most 63)"
      )
    if not 0 < self.coordinator_port < 65536:
      raise LaunchError(
        f"kubernetes target: --coordinator_port must be in 1..65535, got {self.coordinator_port}"
      )
    for key in ("remote_dir", "volume_mount"):
      if not getattr(self, key).startswith("/"):
        raise LaunchError(
          f"kubernetes target: --{key} {getattr(self, key)!r} is not an absolute path"
        )
    shared = job.workdir.startswith("gs://") or (
      self.volume_claim and job.workdir.startswith(self.volume_mount.rstrip("/") + "/")
    )
    if not shared:
      raise LaunchError(
        f"kubernetes target: workdir {job.workdir!r} must be a gs:// path or lie "
        f"under volume_mount {self.volume_mount!r} with volume_claim set"
      )

  def topology(self):
    """The GPUs the pre-flight compiles for (bert_jax.parallel.topology); LaunchError when
    gpu_type / gpus_per_host name none it knows."""
    # bert_jax (and JAX with it) only when a gpu_type is given.
    from bert_jax.parallel.topology import parse_topology  # noqa: PLC0415 (heavy)

    name = gpu_topology_name(self.gpu_type, self.num_hosts, self.gpus_per_host)
    try:
      return parse_topology(name)
    except ValueError as e:
      raise LaunchError(f"kubernetes target: --gpu_type / --gpus_per_host: {e}") from None

  def tpu_topology(self):
    """The TPU slices ``accelerator_type`` x ``num_slices`` name (bert_jax.parallel.topology);
    LaunchError when bert_jax does not know the slice."""
    # bert_jax (and JAX with it) only when an accelerator type is given.
    from bert_jax.parallel.topology import parse_topology  # noqa: PLC0415 (heavy)

    try:
      topo = parse_topology(self.accelerator_type.strip().lower(), max(1, self.num_slices))
    except ValueError as e:
      raise LaunchError(f"kubernetes target: --accelerator_type: {e}") from None
    if topo.is_gpu:
      raise LaunchError(
        f"kubernetes target: --accelerator_type {self.accelerator_type!r} is a GPU, not a TPU "
        "slice (--gpu_type for GPUs)"
      )
    return topo

  def _check_tpu_hosts(self) -> None:
    slices, pods, chips = self.layout()
    if self.num_hosts not in (1, slices * pods) or self.gpus_per_host not in (0, chips):
      raise LaunchError(
        f"kubernetes target: --accelerator_type {self.accelerator_type} x {slices} slice(s) is "
        f"{slices * pods} pod(s) of {chips} chips; leave --num_hosts / --gpus_per_host unset or "
        f"give those (got {self.num_hosts}, {self.gpus_per_host})"
      )

  def layout(self) -> tuple[int, int, int]:
    """(slices, pods per slice, accelerators per pod): one slice of num_hosts pods without an
    accelerator_type; a TPU slice's hosts and their chips with one."""
    if not self.accelerator_type:
      return 1, self.num_hosts, self.gpus_per_host
    topo = self.tpu_topology()
    per_slice = topo.num_hosts // topo.num_slices
    return topo.num_slices, per_slice, topo.chips_per_slice // per_slice

  @property
  def num_processes(self) -> int:
    """The job's processes, one per pod (recorded in launch.json)."""
    slices, pods, _ = self.layout()
    return slices * pods

  def kind(self) -> str:
    """The workload: "JobSet" or "Job"."""
    if self.workload == "auto":
      return "JobSet" if self.num_processes > 1 else "Job"
    return "JobSet" if self.workload == "jobset" else "Job"

  def resource_name(self, job: Job) -> str:
    return self.job_name or dns_name(job.workdir.rstrip("/").rsplit("/", 1)[-1])

  def manifests(self, job: Job) -> list[dict[str, Any]]:
    """The JobSet, or the Service and the Job, as dicts; applies nothing."""
    self.validate(job)
    return kubernetes_manifests.manifests(self, job, self.resource_name(job))

  def manifest_yaml(self, job: Job) -> str:
    return yaml.safe_dump_all(self.manifests(job), sort_keys=False)

  def describe(self, job: Job) -> str:
    return (
      f"---\n{self.manifest_yaml(job)}# apply with:\n"
      f"# kubectl apply --namespace={self.namespace} -f -"
    )

  def run(self, job: Job, out: TextIO | None = None, stop: threading.Event | None = None) -> int:
    """Applies the manifests; kubectl's exit status (``stop`` is not used: the job is the
    cluster's once applied)."""
    del stop
    out = out or sys.stdout
    text = self.manifest_yaml(job)
    out.write(
      f"launch: kubectl apply --namespace={self.namespace} -f - "
      f"({self.kind()} {self.resource_name(job)})\n"
    )
    return subprocess.run(
      ["kubectl", "apply", f"--namespace={self.namespace}", "-f", "-"],
      input=text,
      text=True,
      check=False,
    ).returncode
