"""The Kubernetes target's restarts: what each pod of a JobSet or an Indexed Job starts with, how
its failure policies treat each way a pod ends, and GKE TPU slices.

Nothing here talks to a cluster. Each pod's container command is run with ``sh`` as the kubelet
would run it, with the environment the downward API gives that pod: the annotations the JobSet
controller (``jobset.sigs.k8s.io/job-index``, ``.../restart-attempt``; pod ``i`` of Job ``j``
is host ``<jobset>-<replicatedJob>-<j>-<i>`` in the subdomain ``<jobset>``, JobSet v0.12.0's
``GenPodName`` and ``GetSubdomain``) and the Job controller (``batch.kubernetes.io/job-
completion-index``, ``.../job-index-failure-count``, ``.../job-index-ignored-failure-count``,
absent when 0; an absent annotation is an empty value) put on it. A fake interpreter records
what the job received. The failure policies are read as Kubernetes documents them: a pod
failure policy's rules in order, the first that matches decides (no match: Count); a JobSet's
failure-policy rules likewise (no match: RestartJobSet).
"""

import io
import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from launch_fakes import executable

from launch.job import Job, LaunchError
from launch.launch import launch
from launch.targets import KubernetesTarget

IMAGE = "us-docker.pkg.dev/p/bert-jax:1"
RECORDER = """#!{python}
import json, os, sys
keys = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "BERT_JAX_ATTEMPT",
        "BERT_JAX_MAX_RESTARTS")
with open(os.environ["RECORD"], "w") as f:
  json.dump({{"argv": sys.argv[1:], **{{k: os.environ.get(k) for k in keys}}}}, f)
"""


@pytest.fixture
def recorder(tmp_path):
  return executable(tmp_path / "python", RECORDER.format(python=sys.executable))


def manifests(target, python="python3", workdir="gs://bucket/runs/mnli"):
  out = io.StringIO()
  job = Job("finetune", "configs/glue.py:rte", workdir, python=python)
  assert launch(job, target, dry_run=True, out=out) == 0
  return [d for d in yaml.safe_load_all(out.getvalue()) if d]


def run_pod(pod_spec, annotations, tmp_path):
  """Runs the pod's container command with the downward API's environment; what the job got."""
  (container,) = pod_spec["containers"]
  env = {"PATH": os.environ["PATH"], "RECORD": str(tmp_path / "record.json")}
  for var in container["env"]:
    if "value" in var:
      env[var["name"]] = var["value"]
    else:
      path = var["valueFrom"]["fieldRef"]["fieldPath"]
      key = re.fullmatch(r"metadata\.annotations\['(.+)'\]", path)[1]
      env[var["name"]] = annotations.get(key, "")
  subprocess.run(container["command"], env=env, check=True)
  return json.loads((tmp_path / "record.json").read_text())


def first_match(rules, exit_code=None, conditions=()):
  """The action of a pod failure policy for a pod that ended with ``exit_code`` (None: killed
  before its container ran) and has the given True conditions."""
  for rule in rules:
    codes = rule.get("onExitCodes")
    if codes and exit_code is not None and exit_code in codes["values"]:
      return rule["action"]
    if any(
      c["type"] in conditions and c["status"] == "True" for c in rule.get("onPodConditions", [])
    ):
      return rule["action"]
  return "Count"


def test_jobset_pods_of_every_slice_join_one_job(recorder, tmp_path):
  target = KubernetesTarget(image=IMAGE, accelerator_type="v5p-32", num_slices=2, max_restarts=5)
  (jobset,) = manifests(target, python=recorder)
  name = jobset["metadata"]["name"]
  assert jobset["spec"]["network"]["enableDNSHostnames"] is True
  (rjob,) = jobset["spec"]["replicatedJobs"]
  assert rjob["replicas"] == 2  # one Indexed Job per slice
  child = rjob["template"]["spec"]
  assert child["completionMode"] == "Indexed" and child["completions"] == child["parallelism"] == 4
  pods = {}
  for j in range(2):
    for i in range(4):
      annotations = {
        "jobset.sigs.k8s.io/job-index": str(j),
        "batch.kubernetes.io/job-completion-index": str(i),
        "jobset.sigs.k8s.io/restart-attempt": "2",
      }
      pods[f"{name}-{rjob['name']}-{j}-{i}"] = run_pod(
        child["template"]["spec"], annotations, tmp_path
      )
  assert sorted(int(r["JAX_PROCESS_ID"]) for r in pods.values()) == list(range(8))
  # the coordinator is process 0's pod, by its JobSet host name in the JobSet's subdomain
  (first,) = [host for host, r in pods.items() if r["JAX_PROCESS_ID"] == "0"]
  for r in pods.values():
    assert r["JAX_COORDINATOR_ADDRESS"] == f"{first}.{name}:8476"
    assert r["JAX_NUM_PROCESSES"] == "8"
    assert r["BERT_JAX_ATTEMPT"] == "2" and r["BERT_JAX_MAX_RESTARTS"] == "5"
    assert r["argv"][:2] == ["-m", "bert_jax.finetune"]
  assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 5


def test_single_slice_jobset_needs_no_shell(recorder, tmp_path):
  (jobset,) = manifests(KubernetesTarget(image=IMAGE, num_hosts=2, gpus_per_host=8), recorder)
  pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
  assert pod["containers"][0]["command"][0] == recorder
  assert "subdomain" not in pod  # the JobSet controller sets its own
  record = run_pod(pod, {"batch.kubernetes.io/job-completion-index": "1",
                         "jobset.sigs.k8s.io/restart-attempt": "0"}, tmp_path)  # fmt: skip
  assert record["JAX_PROCESS_ID"] == "1" and record["BERT_JAX_ATTEMPT"] == "0"


@pytest.mark.parametrize(
  "failures,ignored,attempt",
  [(None, None, "0"), ("0", None, "0"), ("2", None, "2"), ("1", "3", "4"), (None, "1", "1")],
)
def test_indexed_job_attempt_is_its_index_failures(recorder, tmp_path, failures, ignored, attempt):
  service, job = manifests(KubernetesTarget(image=IMAGE), recorder)
  assert service["kind"] == "Service" and job["kind"] == "Job"  # one pod: "auto" is a Job
  annotations = {"batch.kubernetes.io/job-completion-index": "0"}
  if failures is not None:
    annotations["batch.kubernetes.io/job-index-failure-count"] = failures
  if ignored is not None:
    annotations["batch.kubernetes.io/job-index-ignored-failure-count"] = ignored
  record = run_pod(job["spec"]["template"]["spec"], annotations, tmp_path)
  assert record["BERT_JAX_ATTEMPT"] == attempt and record["BERT_JAX_MAX_RESTARTS"] == "3"
  assert record["JAX_PROCESS_ID"] == "0"
  assert record["JAX_COORDINATOR_ADDRESS"] == "mnli-0.mnli:8476"


# how a pod ended -> (the Indexed Job's action, the JobSet's child Job's action)
ENDINGS = {
  "error (or a lost peer host)": (1, (), "FailJob", "Count"),
  "bad input": (2, (), "FailJob", "FailJob"),
  "no progress": (3, (), "FailJob", "FailJob"),
  "Ctrl-C": (130, (), "FailJob", "FailJob"),
  "preempted, saved": (143, (), "Count", "Count"),
  "killed (OOM)": (137, (), "Count", "Count"),
  "evicted, saved": (143, ("DisruptionTarget",), "Ignore", "Count"),
  "evicted mid-start": (1, ("DisruptionTarget",), "Ignore", "Count"),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_failure_policies_retry_only_preemptions(ending):
  code, conditions, job_action, child_action = ENDINGS[ending]
  _, job = manifests(KubernetesTarget(image=IMAGE, max_restarts=4))
  (jobset,) = manifests(KubernetesTarget(image=IMAGE, num_hosts=2, max_restarts=4))
  child = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
  assert first_match(job["spec"]["podFailurePolicy"]["rules"], code, conditions) == job_action
  assert first_match(child["podFailurePolicy"]["rules"], code, conditions) == child_action
  # Indexed Job: a counted failure is retried up to max_restarts times per index
  assert job["spec"]["backoffLimitPerIndex"] == 4 and job["spec"]["maxFailedIndexes"] == 0
  # JobSet: the child fails at its first counted failure (its reason BackoffLimitExceeded) and
  # the JobSet restarts every Job; FailJob's reason PodFailurePolicy fails the JobSet
  assert child["backoffLimit"] == 0
  reason = "PodFailurePolicy" if child_action == "FailJob" else "BackoffLimitExceeded"
  rules = jobset["spec"]["failurePolicy"]["rules"]
  action = next((r["action"] for r in rules if reason in r["onJobFailureReasons"]), "RestartJobSet")
  assert action == ("FailJobSet" if child_action == "FailJob" else "RestartJobSet")


def test_no_restarts_is_the_plain_job():
  service, job = manifests(KubernetesTarget(image=IMAGE, max_restarts=0))
  assert job["spec"]["backoffLimit"] == 0
  assert not {"podFailurePolicy", "backoffLimitPerIndex"} & set(job["spec"])
  env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
  assert env["BERT_JAX_ATTEMPT"] == "0" and env["BERT_JAX_MAX_RESTARTS"] == "0"


def test_queue_label_on_the_workload_only():
  (jobset,) = manifests(KubernetesTarget(image=IMAGE, num_hosts=2, queue_name="team-a"))
  assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
  template = jobset["spec"]["replicatedJobs"][0]["template"]
  assert "kueue.x-k8s.io/queue-name" not in str(template)


# GKE's TPU node pools (cloud.google.com/kubernetes-engine/docs/concepts/tpus: machine types,
# their chips per VM, and the gke-tpu-accelerator label of each generation)
@pytest.mark.parametrize(
  "accelerator_type,kind,label,topology,pods,chips",
  [
    ("v5p-32", "JobSet", "tpu-v5p-slice", "2x2x4", 4, 4),  # ct5p-hightpu-4t
    ("v5litepod-16", "JobSet", "tpu-v5-lite-podslice", "4x4", 4, 4),  # ct5lp-hightpu-4t
    ("v5litepod-8", "Job", "tpu-v5-lite-podslice", "2x4", 1, 8),  # ct5lp-hightpu-8t
    ("v6e-32", "JobSet", "tpu-v6e-slice", "4x8", 8, 4),  # ct6e-standard-4t
    ("v4-16", "JobSet", "tpu-v4-podslice", "2x2x2", 2, 4),  # ct4p-hightpu-4t
  ],
)
def test_gke_tpu_slices(accelerator_type, kind, label, topology, pods, chips):
  target = KubernetesTarget(image=IMAGE, accelerator_type=accelerator_type)
  docs = manifests(target)
  assert docs[-1]["kind"] == kind and target.num_processes == pods
  if kind == "JobSet":
    annotations = docs[-1]["metadata"]["annotations"]
    assert (
      annotations["alpha.jobset.sigs.k8s.io/exclusive-topology"] == "cloud.google.com/gke-nodepool"
    )
    job = docs[-1]["spec"]["replicatedJobs"][0]["template"]
  else:
    job = docs[-1]
  pod = job["spec"]["template"]["spec"]
  assert job["spec"]["parallelism"] == pods
  assert pod["nodeSelector"] == {
    "cloud.google.com/gke-tpu-accelerator": label,
    "cloud.google.com/gke-tpu-topology": topology,
  }
  assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": chips}


@pytest.mark.parametrize(
  "settings,message",
  [
    ({"workload": "pods"}, "--workload must be one of ('auto', 'jobset', 'job')"),
    ({"max_restarts": -1}, "max_restarts must be >= 0"),
    ({"num_slices": 2}, "--num_slices > 1 needs --accelerator_type"),
    ({"accelerator_type": "v5p-32", "num_slices": 2, "workload": "job"}, "need --workload=jobset"),
    ({"accelerator_type": "v5p-32", "num_hosts": 3}, "is 4 pod(s) of 4 chips"),
    ({"accelerator_type": "v5p-33"}, "--accelerator_type: unknown TPU topology"),
    ({"accelerator_type": "h100:8"}, "is a GPU, not a TPU slice"),
    ({"accelerator_type": "v5p-32", "gpu_type": "h100"}, "exclude each other"),
    ({"queue_name": "Team_A"}, "--queue_name 'Team_A' is not a Kueue LocalQueue name"),
    ({"job_name": "r" * 48, "num_hosts": 2}, "longer than 57 characters"),
  ],
)
def test_settings_refused_before_anything_is_printed(settings, message):
  out = io.StringIO()
  with pytest.raises(LaunchError, match=re.escape(message)):
    launch(Job("pretrain", "configs/pretrain.py:tiny", "gs://b/run"),
           KubernetesTarget(image=IMAGE, **settings), dry_run=True, out=out)  # fmt: skip
  assert out.getvalue() == ""


def test_apply_names_the_workload(tmp_path, monkeypatch):
  """The launch hands the printed manifests to kubectl apply."""
  executable(
    tmp_path / "kubectl", f'#!/bin/bash\necho "$*" > {tmp_path}/args\ncat > {tmp_path}/stdin\n'
  )
  monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
  target = KubernetesTarget(image=IMAGE, num_hosts=2, namespace="ml")
  job = Job("pretrain", "configs/pretrain.py:tiny", "gs://bucket/runs/mnli")
  out = io.StringIO()
  assert target.run(job, out) == 0
  assert out.getvalue() == "launch: kubectl apply --namespace=ml -f - (JobSet mnli)\n"
  assert (tmp_path / "args").read_text() == "apply --namespace=ml -f -\n"
  assert list(yaml.safe_load_all((tmp_path / "stdin").read_text())) == target.manifests(job)
