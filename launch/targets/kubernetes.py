"""Run a job on Kubernetes: an Indexed Job of ``num_hosts`` pods plus a headless Service.

Pod i of an Indexed Job is named ``<name>-<i>`` and, with ``subdomain: <name>`` and the headless
Service of the same name, resolvable as ``<name>-<i>.<name>``. Every pod therefore gets
``JAX_COORDINATOR_ADDRESS=<name>-0.<name>:<port>``, ``JAX_NUM_PROCESSES=num_hosts`` and
``JAX_PROCESS_ID`` from its completion index (the ``batch.kubernetes.io/job-completion-index``
annotation, which is also ``$JOB_COMPLETION_INDEX``). ``backoffLimit: 0`` fails the Job, and so
stops every pod, when one pod fails. The workdir must be storage every pod can write: a gs://
path, or a path inside ``volume_claim`` mounted at ``volume_mount``.

:meth:`KubernetesTarget.validate` checks every setting by the API server's rules for the field
it fills (names, quantities, ports) and ``gpu_type`` against the GPUs the pre-flight knows, so
a dry run refuses what ``kubectl apply`` or the launch would; the manifests themselves are
checked against the API's schemas in tests/test_launch_kubernetes_schema.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import subprocess
import sys
from typing import Any, TextIO

import yaml

from ..job import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID, Job, LaunchError
from ..preflight import gpu_topology_name, preflight

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
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
class KubernetesTarget:
  """Settings of a Kubernetes launch; ``image`` is required.

  Attributes:
    image: the container image holding bert_jax (and the accelerator's jax).
    job_name: the Job/Service name (DNS label); default from the workdir's last component.
    namespace: the namespace.
    num_hosts: pods = jax processes.
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

  name = "kubernetes"

  def preflight(self, job: Job, config) -> dict | None:
    """Compiles the job for the pods' GPUs (LaunchError when it does not fit); None when skipped
    or when no gpu_type is given."""
    if self.skip_preflight or not self.gpu_type or config is None:
      return None
    return preflight(
      job, config, gpu_topology_name(self.gpu_type, self.num_hosts, self.gpus_per_host)
    )

  def validate(self, job: Job) -> None:
    """Every setting, by the API server's rules for the fields it fills (names, quantities,
    ports) and the GPUs the pre-flight knows; LaunchError (one line, naming the flag) before
    anything is printed or applied, in a dry run as in a launch."""
    if not self.image:
      raise LaunchError("kubernetes target: missing required setting: image (flag --image)")
    if re.search(r"\s", self.image):
      raise LaunchError(f"kubernetes target: --image {self.image!r} contains white space")
    if self.num_hosts < 1:
      raise LaunchError(f"kubernetes target: num_hosts must be >= 1, got {self.num_hosts}")
    if self.gpus_per_host < 0:
      raise LaunchError(f"kubernetes target: gpus_per_host must be >= 0, got {self.gpus_per_host}")
    if self.gpu_type and (self.gpus_per_host < 1 or self.accelerator_resource != "nvidia.com/gpu"):
      raise LaunchError(
        f"kubernetes target: gpu_type {self.gpu_type!r} needs gpus_per_host >= 1 and "
        f"accelerator_resource 'nvidia.com/gpu' (got {self.gpus_per_host}, "
        f"{self.accelerator_resource!r})"
      )
    if self.gpu_type:
      self.topology()
    if self.job_name and not _LABEL_1035.fullmatch(self.job_name):
      raise LaunchError(
        f"kubernetes target: job_name {self.job_name!r} is not a DNS label "
        f"(lower case letters, digits and '-', starting with a letter, at most 63)"
      )
    last_pod = f"{self.resource_name(job)}-{self.num_hosts - 1}"
    if len(last_pod) > 63:
      raise LaunchError(
        f"kubernetes target: pod host name {last_pod!r} is longer than 63 characters "
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

  def resource_name(self, job: Job) -> str:
    return self.job_name or dns_name(job.workdir.rstrip("/").rsplit("/", 1)[-1])

  def manifests(self, job: Job) -> list[dict[str, Any]]:
    """The Service and the Job, as dicts; applies nothing."""
    self.validate(job)
    name = self.resource_name(job)
    labels = {"app.kubernetes.io/name": "bert-jax", "app.kubernetes.io/instance": name}
    service = {
      "apiVersion": "v1",
      "kind": "Service",
      "metadata": {"name": name, "namespace": self.namespace, "labels": dict(labels)},
      "spec": {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {"job-name": name},
        "ports": [{"name": "coordinator", "port": self.coordinator_port}],
      },
    }
    env = [
      {"name": ENV_COORDINATOR, "value": f"{name}-0.{name}:{self.coordinator_port}"},
      {"name": ENV_NUM_PROCESSES, "value": str(self.num_hosts)},
      {
        "name": ENV_PROCESS_ID,
        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}},
      },
    ]
    container: dict[str, Any] = {
      "name": "bert-jax",
      "image": self.image,
      "workingDir": self.remote_dir,
      "command": job.argv(),
      "env": env,
      "ports": [{"containerPort": self.coordinator_port, "name": "coordinator"}],
    }
    limits = {self.accelerator_resource: self.gpus_per_host} if self.gpus_per_host else {}
    requests = {k: v for k, v in (("cpu", self.cpu), ("memory", self.memory)) if v}
    if limits or requests:
      container["resources"] = {
        **({"limits": limits} if limits else {}),
        **({"requests": requests} if requests else {}),
      }
    pod_spec: dict[str, Any] = {
      "subdomain": name,
      "restartPolicy": "Never",
      "containers": [container],
    }
    if self.service_account:
      pod_spec["serviceAccountName"] = self.service_account
    if self.volume_claim:
      container["volumeMounts"] = [{"name": "workdir", "mountPath": self.volume_mount}]
      pod_spec["volumes"] = [
        {"name": "workdir", "persistentVolumeClaim": {"claimName": self.volume_claim}}
      ]
    job_manifest = {
      "apiVersion": "batch/v1",
      "kind": "Job",
      "metadata": {"name": name, "namespace": self.namespace, "labels": dict(labels)},
      "spec": {
        "completionMode": "Indexed",
        "completions": self.num_hosts,
        "parallelism": self.num_hosts,
        "backoffLimit": 0,
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
      },
    }
    return [service, job_manifest]

  def manifest_yaml(self, job: Job) -> str:
    return yaml.safe_dump_all(self.manifests(job), sort_keys=False)

  def describe(self, job: Job) -> str:
    return (
      f"---\n{self.manifest_yaml(job)}# apply with:\n"
      f"# kubectl apply --namespace={self.namespace} -f -"
    )

  def run(self, job: Job, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    text = self.manifest_yaml(job)
    out.write(
      f"launch: kubectl apply --namespace={self.namespace} -f - (Job {self.resource_name(job)})\n"
    )
    return subprocess.run(
      ["kubectl", "apply", f"--namespace={self.namespace}", "-f", "-"],
      input=text,
      text=True,
      check=False,
    ).returncode
