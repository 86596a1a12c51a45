"""Dry runs for the remote targets: TPU VM pods, SLURM and Kubernetes, and their settings' checks.

Nothing here runs gcloud, sbatch or kubectl. The printed commands and manifests are
parsed, and the parts that run on the cluster are executed against stand-ins: a fake metadata
server (``curl``) for TPU workers; the Indexed Job's completion index for each pod (the SLURM
script is run against fake ``scontrol`` and ``srun`` in tests/test_launch_slurm.py). A fake "python" records the
environment each process would start with, so the test checks that every process gets the
right coordinator address, process id and process count.
"""

import io
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from launch_fakes import executable, records

from launch.job import Job, LaunchError
from launch.launch import launch
from launch.sweep import plan_sweep, run_sweep
from launch.targets import KubernetesTarget, TpuTarget, make_target

REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIG = "configs/pretrain.py:tiny"


def dry_run(job, target):
  out = io.StringIO()
  assert launch(job, target, dry_run=True, out=out) == 0
  return out.getvalue()


def test_tpu_dry_run_commands_and_worker_environment(tmp_path, fake_python):
  python, record_dir = fake_python
  job = Job(
    "pretrain",
    CONFIG,
    "gs://bucket/runs/tiny",
    python=python,
    # Phase 2's batch of 8 does not split over v4-32's 16 chips: the run (and the dry run) would
    # refuse it.
    extra_args=("--config.num_train_steps=10", "--config.phase2.fraction=0"),
  )
  target = TpuTarget(
    tpu_name="pod",
    zone="us-central2-b",
    project="proj-1",
    create=True,
    accelerator_type="v4-32",
    remote_dir=str(tmp_path),
    log_file=str(tmp_path / "job.log"),
    max_restarts=0,  # the job runs attached (watched restarts: tests/test_launch_tpu_watch.py)
  )
  printed = dry_run(job, target)
  # A shell script: the setup script as a here-document, then the commands.
  head, _, rest = printed.partition("\nBERT_JAX_EOF\n")
  assert head.startswith("cat > /tmp/bert_jax_setup_pod.sh <<'BERT_JAX_EOF'\n")
  assert head.partition("\n")[2] + "\n" == target.setup_script()
  cmds = [shlex.split(line) for line in rest.splitlines() if not line.startswith("#")]
  assert [c[0] for c in cmds] == ["gcloud", "tar", "gcloud", "gcloud", "gcloud"]
  assert cmds[0][3:6] == ["queued-resources", "create", "pod"]
  assert "--accelerator-type=v4-32" in cmds[0]
  assert "--runtime-version=tpu-ubuntu2204-base" in cmds[0]
  assert cmds[2][3:5] == ["tpu-vm", "scp"] and cmds[3][3:5] == ["tpu-vm", "ssh"]
  for c in cmds[2:]:
    assert "--zone=us-central2-b" in c and "--project=proj-1" in c and "--worker=all" in c
  run = cmds[-1]
  command = next(a for a in run if a.startswith("--command="))[len("--command=") :]
  assert "--workdir=gs://bucket/runs/tiny" in command

  # Run the worker command as each of 4 workers would, against a fake metadata server.
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  executable(
    bin_dir / "curl",
    """#!/bin/bash
url="${@: -1}"
case "$url" in
  */agent-worker-number) echo -n "$FAKE_WORKER" ;;
  */worker-network-endpoints) echo -n "w0:x:10.0.0.7,w1:x:10.0.0.8,w2:x:10.0.0.9,w3:x:10.0.0.10" ;;
  *) exit 22 ;;
esac
""",
  )
  for worker in range(4):
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_WORKER": str(worker)}
    subprocess.run(["bash", "-c", command], env=env, check=True)
  recs = records(record_dir)
  assert [r["JAX_PROCESS_ID"] for r in recs] == ["0", "1", "2", "3"]
  assert {r["JAX_NUM_PROCESSES"] for r in recs} == {"4"}
  assert {r["JAX_COORDINATOR_ADDRESS"] for r in recs} == {"10.0.0.7:8476"}
  assert recs[0]["argv"] == [
    "-m",
    "bert_jax.pretrain",
    f"--config={CONFIG}",
    "--workdir=gs://bucket/runs/tiny",
    "--config.num_train_steps=10",
    "--config.phase2.fraction=0",
  ]


def test_kubernetes_manifest_indexed_job_and_headless_service(fake_python):
  python, _ = fake_python
  job = Job("finetune", "configs/glue.py:rte", "gs://bucket/runs/rte-1", python="python3")
  target = KubernetesTarget(
    image="us-docker.pkg.dev/p/bert-jax:1",
    num_hosts=4,
    gpus_per_host=8,
    namespace="ml",
    workload="job",  # a JobSet and restarts: tests/test_launch_kubernetes_jobset.py
    max_restarts=0,
  )
  docs = list(yaml.safe_load_all(dry_run(job, target)))
  service, job_doc = docs
  assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
  name = service["metadata"]["name"]
  assert name == "rte-1" and job_doc["metadata"]["name"] == name
  assert service["spec"]["selector"] == {"job-name": name}  # the label Jobs put on their pods
  spec = job_doc["spec"]
  assert spec["completionMode"] == "Indexed"
  assert spec["completions"] == spec["parallelism"] == 4 and spec["backoffLimit"] == 0
  pod = spec["template"]["spec"]
  assert pod["subdomain"] == name and pod["restartPolicy"] == "Never"
  container = pod["containers"][0]
  assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
  assert container["command"][:3] == ["python3", "-m", "bert_jax.finetune"]
  assert "--workdir=gs://bucket/runs/rte-1" in container["command"]
  env = {e["name"]: e for e in container["env"]}
  # Pod i of an Indexed Job is "<job>-<i>", resolvable through the headless service as
  # "<job>-<i>.<service>": process 0's pod hosts the coordinator.
  assert env["JAX_COORDINATOR_ADDRESS"]["value"] == f"{name}-0.{name}:8476"
  assert env["JAX_NUM_PROCESSES"]["value"] == "4"
  assert env["JAX_PROCESS_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
    "metadata.annotations['batch.kubernetes.io/job-completion-index']"
  )


@pytest.mark.parametrize(
  "target,settings,missing",
  [
    ("tpu", {"tpu_name": "pod", "project": "proj-1"}, "zone"),
    ("tpu", {"tpu_name": "pod", "zone": "us-east5-a"}, "project"),
    (
      "tpu",
      {"tpu_name": "pod", "zone": "us-east5-a", "project": "proj-1", "create": True},
      "accelerator_type",
    ),
    ("slurm", {"nodes": 2}, "partition"),
    ("kubernetes", {"num_hosts": 2}, "image"),
  ],
)
def test_missing_target_setting_is_a_clear_error(target, settings, missing):
  workdir = "gs://b/run" if target != "slurm" else "/tmp/never_created_by_launch"
  with pytest.raises(LaunchError, match=missing):
    launch(
      Job("pretrain", CONFIG, workdir),
      make_target(target, settings),
      dry_run=True,
      out=io.StringIO(),
    )
  assert not os.path.exists("/tmp/never_created_by_launch")


def test_cli_errors_before_anything_starts(tmp_path):
  workdir = tmp_path / "run"
  base = [
    sys.executable,
    "-m",
    "launch",
    "run",
    "--job=pretrain",
    f"--config={CONFIG}",
    f"--workdir={workdir}",
  ]
  cases = [
    (["--target=slurm", "--nodes=2"], "partition"),
    (["--target=local", "--", "--config.no_such_key=1"], "no_such_key"),
    (["--target=local", "--partition=gpu"], "not a setting of the local target"),
  ]
  for extra, message in cases:
    proc = subprocess.run(base + extra, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
  assert not workdir.exists()


def test_tpu_workdir_must_be_a_bucket():
  with pytest.raises(LaunchError, match="gs://"):
    TpuTarget(tpu_name="pod", zone="us-east5-a", project="proj-1").validate(
      Job("pretrain", CONFIG, "/tmp/x")
    )


TPU = {"tpu_name": "pod", "zone": "us-central2-b", "project": "proj-1"}
K8S = {"image": "us-docker.pkg.dev/p/bert-jax:1"}


@pytest.mark.parametrize(
  "target,settings,message",
  [
    # accelerator types no Cloud TPU slice has (the pre-flight's table of slices)
    ("tpu", {**TPU, "create": True, "accelerator_type": "v4-31"}, "unknown TPU topology 'v4-31'"),
    ("tpu", {**TPU, "create": True, "accelerator_type": "v4-33"}, "unknown TPU topology 'v4-33'"),
    ("tpu", {**TPU, "accelerator_type": "v7x-8"}, "unknown TPU topology 'v7x-8'"),
    ("tpu", {**TPU, "accelerator_type": "h100:8"}, "is a GPU, not a TPU slice"),
    ("tpu", {**TPU, "zone": "us-central2"}, "--zone 'us-central2' is not a Cloud zone"),
    ("tpu", {**TPU, "project": "My Project"}, "--project 'My Project' is not a Cloud project"),
    ("tpu", {**TPU, "tpu_name": "Pod_1"}, "--tpu_name 'Pod_1' is not a lower-case name"),
    ("tpu", {**TPU, "coordinator_port": 0}, "--coordinator_port must be in 1..65535"),
    ("tpu", {**TPU, "remote_dir": "$HOME/my code"}, "--remote_dir '$HOME/my code' is not a path"),
    # GPUs the pre-flight does not know
    ("kubernetes", {**K8S, "gpu_type": "h1000", "gpus_per_host": 8}, "unknown GPU topology"),
    ("kubernetes", {**K8S, "gpu_type": "h100", "gpus_per_host": 3}, "3 GPUs per host"),
    # what the API server refuses
    ("kubernetes", {**K8S, "namespace": "ML"}, "--namespace 'ML' is not a DNS label"),
    ("kubernetes", {**K8S, "memory": "64GB"}, "--memory '64GB' is not a Kubernetes quantity"),
    ("kubernetes", {**K8S, "cpu": "8 cores"}, "--cpu '8 cores' is not a Kubernetes quantity"),
    ("kubernetes", {**K8S, "job_name": "1st-run"}, "job_name '1st-run' is not a DNS label"),
    (
      "kubernetes",
      {**K8S, "job_name": "r" * 62, "num_hosts": 2, "workload": "job"},
      "longer than 63",
    ),
    ("kubernetes", {**K8S, "service_account": "Runner"}, "--service_account 'Runner'"),
    ("kubernetes", {**K8S, "accelerator_resource": "gpu"}, "--accelerator_resource 'gpu'"),
    ("kubernetes", {**K8S, "coordinator_port": 70000}, "--coordinator_port must be in"),
    ("kubernetes", {**K8S, "image": "img:1 --privileged"}, "contains white space"),
  ],
)
def test_dry_run_and_launch_refuse_the_same_settings(target, settings, message, monkeypatch):
  """A setting the launch would refuse (or gcloud / the API server would) is refused by the dry
  run too, with the same error, before anything is printed, written or run."""

  def no_command(*args, **kwargs):
    raise AssertionError(f"ran {args}")

  monkeypatch.setattr(subprocess, "run", no_command)
  job = Job("pretrain", CONFIG, "gs://bucket/runs/tiny")
  errors = []
  for dry in (True, False):
    out = io.StringIO()
    with pytest.raises(LaunchError, match=re.escape(message)) as e:
      launch(job, make_target(target, settings), dry_run=dry, out=out)
    assert out.getvalue() == ""
    errors.append(str(e.value))
  assert errors[0] == errors[1]


def test_cli_dry_run_refuses_an_unknown_accelerator_type(tmp_path):
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "launch",
      "run",
      "--job=pretrain",
      f"--config={CONFIG}",
      "--workdir=gs://bucket/runs/tiny",
      "--target=tpu",
      "--tpu_name=pod",
      "--zone=us-central2-b",
      "--project=proj-1",
      "--create",
      "--accelerator_type=v4-31",
      "--dry_run",
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert proc.returncode == 2 and proc.stdout == "", proc.stdout
  assert proc.stderr.startswith("launch: error: tpu target: --accelerator_type: unknown TPU ")
  assert len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize(
  "given,cloud_name,runtime",
  [
    ("v4-32", "v4-32", "tpu-ubuntu2204-base"),
    ("v4:2x2x4", "v4-32", "tpu-ubuntu2204-base"),
    ("v5e-16", "v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v5litepod-256", "v5litepod-256", "v2-alpha-tpuv5-lite"),
    ("v5p-8", "v5p-8", "v2-alpha-tpuv5"),
    ("v6e-64", "v6e-64", "v2-alpha-tpuv6e"),
  ],
)
def test_tpu_create_uses_the_cloud_name_and_the_generations_runtime(given, cloud_name, runtime):
  """gcloud gets the Cloud accelerator type and the TPU software version Cloud TPU's docs name
  for the generation (cloud.google.com/tpu/docs/runtimes)."""
  target = TpuTarget(**TPU, create=True, accelerator_type=given)
  create = target.commands(Job("pretrain", CONFIG, "gs://b/run"))[0]
  assert create[3:5] == ["queued-resources", "create"]
  assert f"--accelerator-type={cloud_name}" in create
  assert f"--runtime-version={runtime}" in create
  explicit = TpuTarget(**TPU, create=True, accelerator_type=given, runtime_version="other-image")
  assert (
    "--runtime-version=other-image" in explicit.commands(Job("pretrain", CONFIG, "gs://b/r"))[0]
  )


def test_sweep_dry_run_refuses_bad_settings_before_printing():
  runs = plan_sweep(Job("finetune", "configs/glue.py:rte", ""), [{"seed": 0}], "gs://b/grid")
  out = io.StringIO()
  with pytest.raises(LaunchError, match="--namespace 'ML'"):
    run_sweep(runs, KubernetesTarget(**K8S, namespace="ML"), dry_run=True, out=out)
  assert out.getvalue() == ""
