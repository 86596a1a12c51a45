"""The Kubernetes target's manifests against the Kubernetes API and JobSet's and Kueue's CRDs.

The YAML a dry run prints (what ``kubectl apply`` receives) is validated:

* a Service and a Job with kubernetes-validate, which ships the API's OpenAPI schemas (strict:
  no field the API does not have), for the oldest and the newest Kubernetes version it knows:
  1.25 for a Job without restarts, 1.29 (``backoffLimitPerIndex`` and its pod annotations on by
  default) for one with them;
* a JobSet against JobSet's own CustomResourceDefinition schema (tests/schemas/, JobSet v0.12.0),
  with the jsonschema Draft 2020-12 validator kubernetes-validate uses, made strict the same way
  (an object with properties gets ``additionalProperties: false`` unless it keeps unknown
  fields: the API server would drop an unknown field silently). Its child Job (the
  replicatedJob's template, named as the JobSet controller names it) goes through
  kubernetes-validate as well. The CRD's CEL rules (which jsonschema cannot run) that apply at
  creation are listed and shown not to concern the fields the target fills;
* Kueue: Kueue's CRDs describe no Job or JobSet. Its webhook checks the queue label as a
  LocalQueue name (a DNS-1123 subdomain: ``jobframework.ValidateQueueName``), and its controller
  makes a Workload whose ``spec.queueName`` is the label and whose pod sets are the job's (a
  JobSet: one per replicatedJob, count = replicas x parallelism; a Job: one named "main",
  count = parallelism). That Workload is validated against Kueue's Workload CRD schema (v0.19.2):
  the queue name's pattern and length, the pod templates, the pod sets' names and counts.

The schemas do not hold the API server's name rules, so the names are checked against those
(k8s.io/apimachinery's validation: a Service name is an RFC 1035 label; an Indexed Job's pod
``<job>-<index>`` gets that host name, an RFC 1123 label of at most 63 characters; a JobSet's pod
``<jobset>-slice-<job>-<index>`` plus a 6-character suffix is an RFC 1035 label, as JobSet's
webhook checks; a label value is at most 63 characters).
"""

import copy
import io
import itertools
import pathlib
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml

from launch import sweep
from launch.job import Job, LaunchError
from launch.launch import launch
from launch.sweep import plan_sweep, run_sweep
from launch.targets import KubernetesTarget
from launch.targets.kubernetes_manifests import JOBSET_API, QUEUE_LABEL

SCHEMAS = pathlib.Path(__file__).resolve().parent / "schemas"
LATEST = kubernetes_validate.latest_version()
RFC1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
RFC1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
# JobSet's webhook (pkg/webhooks/jobset_webhook.go, v0.12.0): failure-policy rule names and the
# job failure reasons a rule may name.
RULE_NAME = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
JOB_FAILURE_REASONS = {
  "BackoffLimitExceeded",
  "DeadlineExceeded",
  "FailedIndexes",
  "MaxFailedIndexesExceeded",
  "PodFailurePolicy",
}
POD_FAILURE_ACTIONS = {"FailJob", "FailIndex", "Ignore", "Count"}
# The CEL rules of JobSet's CRD that apply when a JobSet is created (the others compare with
# oldSelf: immutability on update), and the fields they are about.
JOBSET_CREATE_RULES = {
  "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
  "self.replicatedJobs.exists(x, has(x.dependsOn)))": ("startupPolicy", "dependsOn"),
  "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)": (
    "volumeClaimPolicies",
  ),
}


def strict(schema):
  """A structural schema with ``additionalProperties: false`` on every object that lists its
  properties and does not keep unknown fields."""
  if not isinstance(schema, dict):
    return schema
  out = dict(schema)
  if "properties" in out:
    out["properties"] = {k: strict(v) for k, v in out["properties"].items()}
    if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
      out["additionalProperties"] = False
  for key in ("items", "additionalProperties", "not"):
    if isinstance(out.get(key), dict):
      out[key] = strict(out[key])
  for key in ("anyOf", "allOf", "oneOf"):
    if key in out:
      out[key] = [strict(s) for s in out[key]]
  return out


def crd_validator(file):
  schema = yaml.safe_load((SCHEMAS / file).read_text())
  return schema, jsonschema.validators.Draft202012Validator(strict(schema))


JOBSET_SCHEMA, JOBSET = crd_validator("jobset.x-k8s.io_jobsets.v1alpha2.yaml")
_, WORKLOAD = crd_validator("kueue.x-k8s.io_workloads.v1beta2.yaml")


def create_rules(schema) -> set[str]:
  found = set()
  if isinstance(schema, dict):
    for rule in schema.get("x-kubernetes-validations", []):
      if "oldSelf" not in rule["rule"]:
        found.add(rule["rule"])
    for value in schema.values():
      found |= create_rules(value)
  elif isinstance(schema, list):
    for value in schema:
      found |= create_rules(value)
  return found


def printed_manifests(job, target):
  out = io.StringIO()
  assert launch(job, target, dry_run=True, out=out) == 0
  return [d for d in yaml.safe_load_all(out.getvalue()) if d]


def check_against_api(doc):
  """kubernetes-validate, strict, for the oldest version the object's fields need and the
  newest; and the API server's rules for a pod failure policy, which the schemas leave out
  (k8s.io/kubernetes pkg/apis/batch/validation: the actions; exit codes in ascending order,
  without duplicates, no 0 with operator In)."""
  oldest = "1.29.0" if "podFailurePolicy" in doc.get("spec", {}) else "1.25.0"
  for version in (oldest, LATEST):
    kubernetes_validate.validate(doc, version, strict=True)
  for rule in doc.get("spec", {}).get("podFailurePolicy", {}).get("rules", []):
    assert rule["action"] in POD_FAILURE_ACTIONS, rule
    codes = rule.get("onExitCodes", {}).get("values", [])
    assert codes == sorted(set(codes)) and 0 not in codes, rule


def child_jobs(jobset):
  """The Jobs the JobSet controller makes: ``<jobset>-<replicatedJob>-<index>``."""
  for rjob in jobset["spec"]["replicatedJobs"]:
    for index in range(rjob["replicas"]):
      metadata = {**rjob["template"]["metadata"], "name": f"{jobset['metadata']['name']}-"
                  f"{rjob['name']}-{index}", "namespace": jobset["metadata"]["namespace"]}  # fmt: skip
      yield {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata,
             "spec": copy.deepcopy(rjob["template"]["spec"])}  # fmt: skip


def kueue_workload(doc):
  """The Workload Kueue's job framework makes for a queued Job or JobSet."""
  if doc["kind"] == "JobSet":
    pod_sets = [
      {
        "name": rjob["name"],
        "count": rjob["replicas"] * rjob["template"]["spec"]["parallelism"],
        "template": rjob["template"]["spec"]["template"],
      }
      for rjob in doc["spec"]["replicatedJobs"]
    ]
  else:
    pod_sets = [
      {"name": "main", "count": doc["spec"]["parallelism"], "template": doc["spec"]["template"]}
    ]
  return {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "Workload",
    "metadata": {"name": f"{doc['kind'].lower()}-{doc['metadata']['name']}-1a2b3"},
    "spec": {"queueName": doc["metadata"]["labels"][QUEUE_LABEL], "podSets": pod_sets},
  }


def check_manifests(docs, target):
  """Every document against its schemas, and the names against the API server's rules."""
  name = docs[-1]["metadata"]["name"]
  assert RFC1035_LABEL.fullmatch(name) and len(name) <= 63, name
  slices, pods, _ = target.layout()
  workload = docs[-1]
  if workload["apiVersion"] == JOBSET_API:
    assert len(docs) == 1
    JOBSET.validate(workload)
    spec = workload["spec"]
    for rule, fields in JOBSET_CREATE_RULES.items():
      assert not any(f in spec or f in str(spec["replicatedJobs"]) for f in fields), rule
    for rule in spec["failurePolicy"]["rules"]:
      assert RULE_NAME.fullmatch(rule["name"]) and len(rule["name"]) <= 128
      assert set(rule["onJobFailureReasons"]) <= JOB_FAILURE_REASONS
    for child in child_jobs(workload):
      check_against_api(child)
      assert RFC1035_LABEL.fullmatch(child["metadata"]["name"])
    for job_index, index in itertools.product(range(slices), range(pods)):
      pod = f"{name}-slice-{job_index}-{index}-abcde"
      assert RFC1035_LABEL.fullmatch(pod) and len(pod) <= 63, pod
  else:
    assert [d["kind"] for d in docs] == ["Service", "Job"]
    assert docs[0]["metadata"]["name"] == name
    for doc in docs:
      check_against_api(doc)
    for index in range(pods):
      host = f"{name}-{index}"
      assert RFC1123_LABEL.fullmatch(host) and len(host) <= 63, host
  for value in workload["metadata"]["labels"].values():
    assert LABEL_VALUE.fullmatch(value) and len(value) <= 63, value
  if QUEUE_LABEL in workload["metadata"]["labels"]:
    WORKLOAD.validate(kueue_workload(workload))


def test_jobsets_create_rules_are_the_ones_checked():
  """The CEL rules jsonschema cannot run: the stored CRD has exactly the two known ones that
  apply at creation (a newer CRD with more would fail here until they are looked at)."""
  assert create_rules(JOBSET_SCHEMA) == set(JOBSET_CREATE_RULES)


SETTINGS = [
  {},
  {"max_restarts": 0},
  {"num_hosts": 4, "gpus_per_host": 8, "namespace": "ml", "cpu": "32", "memory": "256Gi"},
  {"num_hosts": 2, "gpus_per_host": 4, "accelerator_resource": "google.com/tpu"},
  {"service_account": "bert-jax-runner", "cpu": "500m", "job_name": "pretrain-base"},
  {"volume_claim": "shared-runs", "num_hosts": 3, "workload": "job"},
  {"num_hosts": 2, "workload": "job", "max_restarts": 0, "queue_name": "team-a"},
  {"queue_name": "research.batch", "max_restarts": 10},
  {"accelerator_type": "v5p-32", "num_slices": 2, "queue_name": "tpu-queue"},
  {"accelerator_type": "v5litepod-8", "queue_name": "tpu-queue"},  # one host: an Indexed Job
  {"accelerator_type": "v6e:4x4", "workload": "jobset", "max_restarts": 0},
  {"accelerator_type": "v4-16", "workload": "job"},
]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("run", ["runs/rte-1", "runs/2024", "Runs/MNLI_matched,lr=1e-4"])
def test_manifests_validate_against_the_kubernetes_api(settings, run):
  mount = "/mnt/workdir"
  workdir = f"{mount}/{run}" if settings.get("volume_claim") else f"gs://bucket/{run}"
  target = KubernetesTarget(image="us-docker.pkg.dev/p/bert-jax:1", **settings)
  docs = printed_manifests(Job("finetune", "configs/glue.py:rte", workdir), target)
  check_manifests(docs, target)


def test_kueues_schema_refuses_a_queue_name_the_target_refuses():
  """The queue label's value becomes the Workload's queueName: what Kueue's schema refuses
  there the target refuses before anything is printed."""
  target = KubernetesTarget(image="img:1", num_hosts=2, queue_name="team-a")
  job = Job("finetune", "configs/glue.py:rte", "gs://bucket/rte")
  (jobset,) = printed_manifests(job, target)
  for bad in ("Team_A", "-team", "team.", "q" * 254):
    jobset["metadata"]["labels"][QUEUE_LABEL] = bad
    with pytest.raises(jsonschema.ValidationError):
      WORKLOAD.validate(kueue_workload(jobset))
    with pytest.raises(LaunchError, match="is not a Kueue LocalQueue name"):
      KubernetesTarget(image="img:1", queue_name=bad).validate(job)
  # a label value is at most 63 characters (the API server's rule, before Kueue's)
  with pytest.raises(LaunchError, match="is not a Kueue LocalQueue name"):
    KubernetesTarget(image="img:1", queue_name="q" * 64).validate(job)


def test_sweep_runs_get_valid_distinct_names(monkeypatch):
  monkeypatch.setattr(sweep, "exists", lambda path: False)  # no bucket to look into here
  job = Job("finetune", "configs/glue.py:rte", "")
  points = [{"learning_rate": lr, "seed": s} for lr in (5e-5, 3e-5) for s in (0, 1)]
  runs = plan_sweep(job, points, "gs://bucket/2024-sweep")
  out = io.StringIO()
  target = KubernetesTarget(image="img:1", num_hosts=2)
  run_sweep(runs, target, dry_run=True, out=out)
  jobsets = [d for d in yaml.safe_load_all(out.getvalue()) if d]
  assert [d["kind"] for d in jobsets] == ["JobSet"] * len(points)
  for jobset in jobsets:
    check_manifests([jobset], target)
  assert len({d["metadata"]["name"] for d in jobsets}) == len(points)
