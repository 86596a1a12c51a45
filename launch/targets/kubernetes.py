"""Run a job on Kubernetes: an Indexed Job of ``num_hosts`` pods plus a headless Service.

Pod i of an Indexed Job is named ``<name>-<i>`` and, with ``subdomain: <name>`` and the headless
Service of the same name, resolvable as ``<name>-<i>.<name>``. Every pod therefore gets
``JAX_COORDINATOR_ADDRESS=<name>-0.<name>:<port>``, ``JAX_NUM_PROCESSES=num_hosts`` and
``JAX_PROCESS_ID`` from its completion index (the ``batch.kubernetes.io/job-completion-index``
annotation, which is also ``$JOB_COMPLETION_INDEX``). ``backoffLimit: 0`` fails the Job, and so
stops every pod, when one pod fails. The workdir must be storage every pod can write: a gs://
path, or a path inside ``volume_claim`` mounted at ``volume_mount``.
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


def dns_name(text: str, limit: int = 40) -> str:
  """A DNS-1123 label from free text (lower case, digits and '-').

  When the text had to change, a hash of it is appended so that distinct texts (e.g. the runs
  of a sweep) keep distinct names.
  """
  name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
  if name == text and len(name) <= limit:
    return name
  digest = hashlib.sha1(text.encode()).hexdigest()[:8]
  return f"{name[: limit - 9].strip('-') or 'bert-jax'}-{digest}"


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
    if not self.image:
      raise LaunchError("kubernetes target: missing required setting: image (flag --image)")
    if self.num_hosts < 1:
      raise LaunchError(f"kubernetes target: num_hosts must be >= 1, got {self.num_hosts}")
    if self.gpu_type and (self.gpus_per_host < 1 or self.accelerator_resource != "nvidia.com/gpu"):
      raise LaunchError(
        f"kubernetes target: gpu_type {self.gpu_type!r} needs gpus_per_host >= 1 and "
        f"accelerator_resource 'nvidia.com/gpu' (got {self.gpus_per_host}, "
        f"{self.accelerator_resource!r})"
      )
    if self.job_name and not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", self.job_name):
      raise LaunchError(
        f"kubernetes target: job_name {self.job_name!r} is not a DNS label "
        f"(lower case letters, digits and '-')"
      )
    shared = job.workdir.startswith("gs://") or (
      self.volume_claim and job.workdir.startswith(self.volume_mount.rstrip("/") + "/")
    )
    if not shared:
      raise LaunchError(
        f"kubernetes target: workdir {job.workdir!r} must be a gs:// path or lie "
        f"under volume_mount {self.volume_mount!r} with volume_claim set"
      )

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
