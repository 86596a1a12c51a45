"""The Kubernetes target's manifests: a JobSet, or an Indexed Job and its headless Service.

* JobSet (``jobset.x-k8s.io/v1alpha2``; the JobSet controller must be installed): one
  replicatedJob ``slice`` of S Indexed Jobs (S = slices) of P pods each. With
  ``network.enableDNSHostnames`` the JobSet makes a headless Service named after itself, and pod
  i of Job j is reachable as ``<name>-slice-<j>-<i>.<name>``: every pod gets
  ``JAX_COORDINATOR_ADDRESS=<name>-slice-0-0.<name>:<port>`` and ``JAX_PROCESS_ID = j * P + i``
  (the ``jobset.sigs.k8s.io/job-index`` and ``batch.kubernetes.io/job-completion-index``
  annotations; with one slice the completion index itself). A failed pod fails its Job
  (``backoffLimit: 0``) and the JobSet recreates all of its Jobs, up to
  ``failurePolicy.maxRestarts`` times; ``BERT_JAX_ATTEMPT`` is the pods'
  ``jobset.sigs.k8s.io/restart-attempt`` annotation. A pod that exits 2, 3 or 130 (bad input,
  the trainer's refusal of a restart without progress, Ctrl-C) fails its Job through the Job's
  ``podFailurePolicy`` (reason ``PodFailurePolicy``), which fails the JobSet without a restart
  (the JobSet's failure-policy rule ``NotRetried``). Exit 1 restarts: when a host is lost its
  peers fail with an error (exit 1) as the lost pod's disruption is handled, and either may
  fail the Job first; an error that repeats at one step ends in the trainer's exit 3.
* Indexed Job of P pods and a headless Service: pod i is ``<name>-<i>``, reachable as
  ``<name>-<i>.<name>`` (``subdomain``); process id = completion index. With restarts the Job
  gets ``backoffLimitPerIndex`` = max_restarts (``maxFailedIndexes: 0``: an index out of retries
  fails the Job), ``backoffLimit`` = max_restarts * P and a ``podFailurePolicy``: a pod with the
  ``DisruptionTarget`` condition (preempted, evicted, its node drained) is replaced without
  counting; exit 1, 2, 3 or 130 fails the Job; exit 143 (saved after SIGTERM) and death by a
  signal count and are retried. Kubernetes tells a pod no restart number of its Job, only its
  index's failures (annotations ``batch.kubernetes.io/job-index-failure-count`` and
  ``batch.kubernetes.io/job-index-ignored-failure-count``, absent when 0): their sum is
  ``BERT_JAX_ATTEMPT``. A replaced pod rejoins peers that are still running, so a multi-host job
  belongs in a JobSet, which restarts all of its pods together.

What the downward API cannot compute (a sum, a product) ``sh`` does before it runs the job in
its place: ``["/bin/sh", "-c", 'export X=$((...)); exec "$@"', "bert-jax", python, ...]``.
"""

from __future__ import annotations

from typing import Any

from bert_jax.interrupts import ENV_ATTEMPT, ENV_MAX_RESTARTS, PREEMPTED_EXIT

from ..job import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID, Job

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
FAILURES_ANNOTATION = "batch.kubernetes.io/job-index-failure-count"
IGNORED_FAILURES_ANNOTATION = "batch.kubernetes.io/job-index-ignored-failure-count"
JOB_INDEX_ANNOTATION = "jobset.sigs.k8s.io/job-index"
RESTART_ANNOTATION = "jobset.sigs.k8s.io/restart-attempt"
EXCLUSIVE_ANNOTATION = "alpha.jobset.sigs.k8s.io/exclusive-topology"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GKE_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
# GKE's accelerator label of each TPU generation's node pools.
GKE_TPUS = {
  "v4": "tpu-v4-podslice",
  "v5e": "tpu-v5-lite-podslice",
  "v5p": "tpu-v5p-slice",
  "v6e": "tpu-v6e-slice",
}
SLICE = "slice"  # the JobSet's replicatedJob
CONTAINER = "bert-jax"
NOT_RETRIED = [1, 2, 3, 130]  # an error, bad input, no progress (the trainer's refusal), Ctrl-C
# A JobSet's pods also exit 1 when a peer host is lost (a collective or the coordination service
# fails): there an error is retried within maxRestarts, and the trainer's no-progress refusal
# (exit 3) ends a failure that repeats at one step.
JOBSET_NOT_RETRIED = [2, 3, 130]
DISRUPTED = [{"type": "DisruptionTarget", "status": "True"}]  # preempted, evicted, drained


def _from_annotation(name: str, annotation: str) -> dict[str, Any]:
  """An environment variable the downward API fills from one of the pod's annotations."""
  path = f"metadata.annotations['{annotation}']"
  return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _exit_codes(action: str, codes: list[int]) -> dict[str, Any]:
  return {
    "action": action,
    "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": codes},
  }


def process_env(target, name: str, kind: str) -> tuple[list[dict[str, Any]], list[str]]:
  """The container's environment, and the shell exports the downward API cannot compute."""
  slices, pods, _ = target.layout()
  env: list[dict[str, Any]] = [
    {"name": ENV_NUM_PROCESSES, "value": str(slices * pods)},
    {"name": ENV_MAX_RESTARTS, "value": str(target.max_restarts)},
  ]
  exports = []
  if kind == "Job":
    coordinator = f"{name}-0.{name}"
    env.append(_from_annotation(ENV_PROCESS_ID, INDEX_ANNOTATION))
    if target.max_restarts:
      env += [
        _from_annotation("BERT_JAX_INDEX_FAILURES", FAILURES_ANNOTATION),
        _from_annotation("BERT_JAX_INDEX_IGNORED_FAILURES", IGNORED_FAILURES_ANNOTATION),
      ]
      exports.append(  # an absent annotation is an empty value: no failures
        f"{ENV_ATTEMPT}=$(( ${{BERT_JAX_INDEX_FAILURES:-0}} + "
        "${BERT_JAX_INDEX_IGNORED_FAILURES:-0} ))"
      )
    else:
      env.append({"name": ENV_ATTEMPT, "value": "0"})
  else:
    coordinator = f"{name}-{SLICE}-0-0.{name}"
    env.append(_from_annotation(ENV_ATTEMPT, RESTART_ANNOTATION))
    if slices == 1:
      env.append(_from_annotation(ENV_PROCESS_ID, INDEX_ANNOTATION))
    else:
      env += [
        _from_annotation("BERT_JAX_SLICE_INDEX", JOB_INDEX_ANNOTATION),
        _from_annotation("BERT_JAX_HOST_INDEX", INDEX_ANNOTATION),
      ]
      exports.append(f"{ENV_PROCESS_ID}=$(( BERT_JAX_SLICE_INDEX * {pods} + BERT_JAX_HOST_INDEX ))")
  env.insert(0, {"name": ENV_COORDINATOR, "value": f"{coordinator}:{target.coordinator_port}"})
  return env, exports


def pod_template(target, job: Job, name: str, kind: str, labels: dict[str, str]):
  """The pods' template: the one container, its resources, GKE's TPU node selectors."""
  env, exports = process_env(target, name, kind)
  command = job.argv()
  if exports:
    command = ["/bin/sh", "-c", f'export {" ".join(exports)}; exec "$@"', CONTAINER, *command]
  container: dict[str, Any] = {
    "name": CONTAINER,
    "image": target.image,
    "workingDir": target.remote_dir,
    "command": command,
    "env": env,
    "ports": [{"containerPort": target.coordinator_port, "name": "coordinator"}],
  }
  _, _, per_pod = target.layout()
  resource = "google.com/tpu" if target.accelerator_type else target.accelerator_resource
  limits = {resource: per_pod} if per_pod else {}
  requests = {k: v for k, v in (("cpu", target.cpu), ("memory", target.memory)) if v}
  if limits or requests:
    container["resources"] = {
      **({"limits": limits} if limits else {}),
      **({"requests": requests} if requests else {}),
    }
  pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
  if kind == "Job":
    pod_spec["subdomain"] = name  # a JobSet sets its own
  if target.accelerator_type:
    topo = target.tpu_topology()
    pod_spec["nodeSelector"] = {
      GKE_TPU_ACCELERATOR: GKE_TPUS[topo.chip.generation],
      GKE_TPU_TOPOLOGY: "x".join(map(str, topo.shape)),
    }
  if target.service_account:
    pod_spec["serviceAccountName"] = target.service_account
  if target.volume_claim:
    container["volumeMounts"] = [{"name": "workdir", "mountPath": target.volume_mount}]
    pod_spec["volumes"] = [
      {"name": "workdir", "persistentVolumeClaim": {"claimName": target.volume_claim}}
    ]
  return {"metadata": {"labels": dict(labels)}, "spec": pod_spec}


def manifests(target, job: Job, name: str) -> list[dict[str, Any]]:
  """The JobSet, or the Service and the Indexed Job, as dicts (the module docstring)."""
  kind = target.kind()
  slices, pods, _ = target.layout()
  labels = {"app.kubernetes.io/name": "bert-jax", "app.kubernetes.io/instance": name}
  queue = {QUEUE_LABEL: target.queue_name} if target.queue_name else {}
  metadata: dict[str, Any] = {
    "name": name,
    "namespace": target.namespace,
    "labels": {**labels, **queue},
  }
  indexed = {
    "completionMode": "Indexed",
    "completions": pods,
    "parallelism": pods,
    "backoffLimit": 0,
  }
  template = pod_template(target, job, name, kind, labels)
  if kind == "JobSet":
    if target.accelerator_type:  # a slice's pods on one node pool, one slice per pool
      metadata["annotations"] = {EXCLUSIVE_ANNOTATION: "cloud.google.com/gke-nodepool"}
    rules = [
      {"action": "Count", "onPodConditions": DISRUPTED},  # a restart, whatever its exit status
      _exit_codes("FailJob", JOBSET_NOT_RETRIED),
      _exit_codes("Count", [1, PREEMPTED_EXIT]),
    ]
    child = {**indexed, "podFailurePolicy": {"rules": rules}, "template": template}
    not_retried = {
      "name": "NotRetried",
      "action": "FailJobSet",
      "onJobFailureReasons": ["PodFailurePolicy"],
    }
    spec = {
      "failurePolicy": {"maxRestarts": target.max_restarts, "rules": [not_retried]},
      "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
      "replicatedJobs": [
        {
          "name": SLICE,
          "replicas": slices,
          "template": {"metadata": {"labels": dict(labels)}, "spec": child},
        }
      ],
    }
    return [{"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": metadata, "spec": spec}]
  service = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": name, "namespace": target.namespace, "labels": dict(labels)},
    "spec": {
      "clusterIP": "None",
      "publishNotReadyAddresses": True,
      "selector": {"job-name": name},
      "ports": [{"name": "coordinator", "port": target.coordinator_port}],
    },
  }
  if target.max_restarts:
    rules = [
      {"action": "Ignore", "onPodConditions": DISRUPTED},  # replaced without counting
      _exit_codes("FailJob", NOT_RETRIED),
      _exit_codes("Count", [PREEMPTED_EXIT]),
    ]
    indexed.update(
      backoffLimit=target.max_restarts * pods,
      backoffLimitPerIndex=target.max_restarts,
      maxFailedIndexes=0,  # an index out of retries fails the Job (and stops its pods)
      podFailurePolicy={"rules": rules},
    )
  spec = {**indexed, "template": template}
  return [service, {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}]
