"""The Kubernetes target's manifests against the Kubernetes API.

The YAML a dry run prints (what ``kubectl apply`` receives) is validated with
kubernetes-validate, which ships the API's OpenAPI schemas (strict: no field the API does not
have), for the oldest and the newest Kubernetes version it knows. The schemas do not hold the
API server's name rules, so the names are checked against those (k8s.io/apimachinery's
validation: a Service name is an RFC 1035 label; an Indexed Job's pod ``<job>-<index>`` gets
that host name, an RFC 1123 label of at most 63 characters).
"""

import io
import itertools
import re

import kubernetes_validate
import pytest
import yaml

from launch import sweep
from launch.job import Job
from launch.launch import launch
from launch.sweep import plan_sweep, run_sweep
from launch.targets import KubernetesTarget

VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
RFC1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
RFC1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def printed_manifests(job, target):
  out = io.StringIO()
  assert launch(job, target, dry_run=True, out=out) == 0
  return list(yaml.safe_load_all(out.getvalue()))


def check_against_api(docs, num_hosts):
  assert [d["kind"] for d in docs] == ["Service", "Job"]
  for doc, version in itertools.product(docs, VERSIONS):
    kubernetes_validate.validate(doc, version, strict=True)
  service, job = docs
  name = service["metadata"]["name"]
  assert RFC1035_LABEL.fullmatch(name) and len(name) <= 63, name
  assert job["metadata"]["name"] == name
  for index in range(num_hosts):
    host = f"{name}-{index}"
    assert RFC1123_LABEL.fullmatch(host) and len(host) <= 63, host


SETTINGS = [
  {},
  {"num_hosts": 4, "gpus_per_host": 8, "namespace": "ml", "cpu": "32", "memory": "256Gi"},
  {"num_hosts": 2, "gpus_per_host": 4, "accelerator_resource": "google.com/tpu"},
  {"service_account": "bert-jax-runner", "cpu": "500m", "job_name": "pretrain-base"},
  {"volume_claim": "shared-runs", "num_hosts": 3},
]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("run", ["runs/rte-1", "runs/2024", "Runs/MNLI_matched,lr=1e-4"])
def test_manifests_validate_against_the_kubernetes_api(settings, run):
  mount = "/mnt/workdir"
  workdir = f"{mount}/{run}" if settings.get("volume_claim") else f"gs://bucket/{run}"
  target = KubernetesTarget(image="us-docker.pkg.dev/p/bert-jax:1", **settings)
  docs = printed_manifests(Job("finetune", "configs/glue.py:rte", workdir), target)
  check_against_api(docs, target.num_hosts)


def test_sweep_runs_get_valid_distinct_names(monkeypatch):
  monkeypatch.setattr(sweep, "exists", lambda path: False)  # no bucket to look into here
  job = Job("finetune", "configs/glue.py:rte", "")
  points = [{"learning_rate": lr, "seed": s} for lr in (5e-5, 3e-5) for s in (0, 1)]
  runs = plan_sweep(job, points, "gs://bucket/2024-sweep")
  out = io.StringIO()
  run_sweep(runs, KubernetesTarget(image="img:1", num_hosts=2), dry_run=True, out=out)
  docs = [d for d in yaml.safe_load_all(out.getvalue()) if d]
  names = set()
  for service, job_doc in zip(docs[::2], docs[1::2]):
    check_against_api([service, job_doc], 2)
    names.add(service["metadata"]["name"])
  assert len(names) == len(points)
