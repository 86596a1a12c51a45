"""Dry runs for the remote targets: TPU VM pods, SLURM and Kubernetes.

Nothing here runs gcloud, sbatch or kubectl. The printed commands, script and manifests are
parsed, and the parts that run on the cluster are executed against stand-ins: a fake metadata
server (``curl``) for TPU workers; fake ``scontrol`` and ``srun`` that start every task the way
SLURM does; the Indexed Job's completion index for each pod. A fake "python" records the
environment each process would start with, so the test checks that every process gets the
right coordinator address, process id and process count.
"""

import io
import json
import os
import pathlib
import shlex
import stat
import subprocess
import sys

import pytest
import yaml

from launch.job import Job, LaunchError
from launch.launch import launch
from launch.targets import KubernetesTarget, SlurmTarget, TpuTarget, make_target

REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIG = "configs/pretrain.py:tiny"


def executable(path, text):
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return str(path)


@pytest.fixture
def fake_python(tmp_path):
  """A stand-in interpreter that records its argv and jax.distributed environment."""
  record = tmp_path / "records"
  record.mkdir()
  script = f"""#!{sys.executable}
import json, os, sys
keys = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "CUDA_VISIBLE_DEVICES")
rec = {{"argv": sys.argv[1:], **{{k: os.environ.get(k) for k in keys}}}}
with open(os.path.join({str(record)!r}, "p%s.json" % os.environ["JAX_PROCESS_ID"]), "w") as f:
  json.dump(rec, f)
"""
  return executable(tmp_path / "fake_python", script), record


def records(record_dir):
  return sorted(
    (json.loads(p.read_text()) for p in record_dir.glob("p*.json")),
    key=lambda r: int(r["JAX_PROCESS_ID"]),
  )


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
    extra_args=("--config.num_train_steps=10",),
  )
  target = TpuTarget(
    tpu_name="pod",
    zone="us-central2-b",
    project="proj",
    create=True,
    accelerator_type="v4-32",
    remote_dir=str(tmp_path),
    log_file=str(tmp_path / "job.log"),
  )
  printed = dry_run(job, target)
  cmds = [shlex.split(line) for line in printed.splitlines() if not line.startswith("#")]
  assert [c[0] for c in cmds] == ["gcloud", "tar", "gcloud", "gcloud", "gcloud"]
  assert cmds[0][3:6] == ["queued-resources", "create", "pod"]
  assert "--accelerator-type=v4-32" in cmds[0]
  assert cmds[2][3:5] == ["tpu-vm", "scp"] and cmds[3][3:5] == ["tpu-vm", "ssh"]
  for c in cmds[2:]:
    assert "--zone=us-central2-b" in c and "--project=proj" in c and "--worker=all" in c
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
  ]


def test_slurm_script_gives_every_task_its_coordinates(tmp_path, fake_python):
  python, record_dir = fake_python
  workdir = tmp_path / "run"
  job = Job("pretrain", CONFIG, str(workdir), python=python)
  target = SlurmTarget(
    partition="gpu", nodes=2, gpus_per_node=4, account="acct", time="02:00:00", remote_dir=str(REPO)
  )
  printed = dry_run(job, target)
  assert printed.strip().endswith(f"sbatch {workdir}/launch/sbatch.sh")
  assert not workdir.exists()  # a dry run writes nothing
  script = target.script(job)
  directives = dict(
    line[len("#SBATCH --") :].split("=", 1)
    for line in script.splitlines()
    if line.startswith("#SBATCH --")
  )
  assert directives["partition"] == "gpu" and directives["nodes"] == "2"
  assert directives["ntasks-per-node"] == "4" and directives["gpus-per-node"] == "4"
  assert directives["account"] == "acct" and directives["time"] == "02:00:00"

  # Execute the script as SLURM would on 2 nodes x 4 GPUs, with fake scontrol and srun.
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  executable(
    bin_dir / "scontrol",
    """#!/bin/bash
[ "$1 $2 $3" = "show hostnames $SLURM_JOB_NODELIST" ] || exit 3
echo gpu-node07; echo gpu-node08
""",
  )
  executable(
    bin_dir / "srun",
    """#!/bin/bash
while [[ "$1" == --* ]]; do shift; done   # srun's own options
for ((i = 0; i < SLURM_NTASKS; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$((i % 4)) "$@" || exit $?
done
""",
  )
  script_path = tmp_path / "sbatch.sh"
  script_path.write_text(script)
  env = {
    **os.environ,
    "PATH": f"{bin_dir}:{os.environ['PATH']}",
    "SLURM_JOB_NODELIST": "gpu-node[07-08]",
    "SLURM_NTASKS": "8",
  }
  subprocess.run(["bash", str(script_path)], env=env, check=True)
  recs = records(record_dir)
  assert [r["JAX_PROCESS_ID"] for r in recs] == [str(i) for i in range(8)]
  assert {r["JAX_NUM_PROCESSES"] for r in recs} == {"8"}
  assert {r["JAX_COORDINATOR_ADDRESS"] for r in recs} == {"gpu-node07:12321"}
  assert [r["CUDA_VISIBLE_DEVICES"] for r in recs] == ["0", "1", "2", "3"] * 2


def test_kubernetes_manifest_indexed_job_and_headless_service(fake_python):
  python, _ = fake_python
  job = Job("finetune", "configs/glue.py:rte", "gs://bucket/runs/rte-1", python="python3")
  target = KubernetesTarget(
    image="us-docker.pkg.dev/p/bert-jax:1", num_hosts=4, gpus_per_host=8, namespace="ml"
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
    ("tpu", {"tpu_name": "pod", "project": "p"}, "zone"),
    ("tpu", {"tpu_name": "pod", "zone": "z"}, "project"),
    ("tpu", {"tpu_name": "pod", "zone": "z", "project": "p", "create": True}, "accelerator_type"),
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
    TpuTarget(tpu_name="pod", zone="z", project="p").validate(Job("pretrain", CONFIG, "/tmp/x"))
