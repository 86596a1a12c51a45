"""Run a job on every worker of a Cloud TPU VM slice (a pod slice or a single host).

The plan, each step one ``gcloud`` command (printed verbatim by ``--dry_run``):

1. optionally create the slice as a queued resource and wait until it is ACTIVE;
2. ship the code: ``ship="scp"`` tars this working tree (uncommitted changes included) and copies
   it to every worker; ``ship="git"`` clones ``repo_url`` at this checkout's commit instead;
   either way the setup script (:meth:`TpuTarget.setup_script`) is copied along;
3. set up every worker: the setup script, run in ``remote_dir``, makes the environment
   ``remote_dir/.venv`` with a Python that bert_jax supports (setup.cfg's ``python_requires``;
   the TPU VM images ship Python 3.10) and installs the code with this machine's jax version
   (the one the pre-flight compiles with) as ``jax[tpu]==<version>``;
4. start the same command on every worker (``--worker=all``) with ``remote_dir/.venv/bin`` first
   on PATH. Each worker reads its process id and the coordinator (worker 0's address) from the
   TPU metadata server and exports ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and
   ``JAX_PROCESS_ID`` before the job starts, so the job needs no cluster auto-detection, and
   ``BERT_JAX_ATTEMPT`` / ``BERT_JAX_MAX_RESTARTS``. The workdir must be a gs:// bucket path
   that every worker can write.
5. with ``create`` and ``max_restarts > 0`` the job starts in the background on every worker
   and the launch watches the queued resource and the job until the job completes,
   re-creating a preempted slice (launch/targets/tpu_watch.py).

Every setting is checked by :meth:`TpuTarget.validate` (names, zone, the accelerator type
against the slices bert_jax can compile for), so a dry run refuses what a launch would.
"""

from __future__ import annotations

import configparser
import dataclasses
import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from typing import TextIO

from bert_jax.interrupts import ENV_ATTEMPT, ENV_MAX_RESTARTS

from ..job import (
  ENV_COORDINATOR,
  ENV_NUM_PROCESSES,
  ENV_PROCESS_ID,
  REPO_ROOT,
  Job,
  LaunchError,
  git_state,
)
from ..preflight import preflight
from .base import Target
from .tpu_watch import PID_FILE, STATUS_FILE, describe_watch, watch

METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes"
SHIP_METHODS = ("scp", "git", "none")
# The TPU VM image for each generation: the table "PyTorch and JAX" of
# cloud.google.com/tpu/docs/runtimes (read 2026-11).
RUNTIMES = {
  "v4": "tpu-ubuntu2204-base",
  "v5e": "v2-alpha-tpuv5-lite",
  "v5p": "v2-alpha-tpuv5",
  "v6e": "v2-alpha-tpuv6e",
}
VENV = ".venv"  # the workers' environment, inside remote_dir
# Google Cloud resource names: a zone (us-central2-b), a project id (6-30 characters, optionally
# domain-scoped: example.com:proj), a TPU / queued resource name (a lower-case RFC 1035 label).
_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
_PROJECT = re.compile(r"([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_PATH = re.compile(r"[\w/.~${}+-]+")


def python_bounds() -> tuple[tuple[int, int], tuple[int, int]]:
  """(lowest, first unsupported) Python version from bert_jax's ``python_requires``
  (``>=3.11,<3.13``): setup.cfg in a checkout, else the installed package's metadata."""
  cfg = configparser.ConfigParser()
  cfg.read(REPO_ROOT / "setup.cfg")
  spec = cfg.get("options", "python_requires", fallback="")
  if not spec:
    spec = importlib.metadata.metadata("bert_jax").get("Requires-Python", "")
  low = re.search(r">=\s*(\d+)\.(\d+)", spec)
  high = re.search(r"<\s*(\d+)\.(\d+)", spec)
  if not (low and high):
    raise LaunchError(f"bert_jax's python_requires {spec!r} has no '>=X.Y,<X.Z' bounds")
  return (int(low[1]), int(low[2])), (int(high[1]), int(high[2]))


def local_jax_version() -> str:
  """The jax installed here: the one the pre-flight compiles with."""
  try:
    return importlib.metadata.version("jax")
  except importlib.metadata.PackageNotFoundError:
    raise LaunchError("tpu target: jax is not installed here (pip install -e '.[tpu]')") from None


SETUP_SCRIPT = r"""#!/usr/bin/env bash
# bert_jax worker setup, written by launch/targets/tpu.py (python -m launch --target=tpu).
# Run in the code's directory on every worker: makes ./{venv} with Python >={low},<{high}
# (this one if it fits; else python3.12 / python3.11 / python3 if one fits; else a standalone
# CPython {low} fetched by uv) and installs the code there with {jax_req}.
# Idempotent: a later launch reuses ./{venv} when its Python fits.
set -euo pipefail
VENV="$PWD/{venv}"
JAX_REQ={jax_req_q}
JAX_VERSION={jax_version_q}
die() {{ echo "bert_jax setup: error: $*" >&2; exit 1; }}
log() {{ echo "bert_jax setup: $*"; }}
pyver() {{ "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }}
fits() {{  # fits X.Y: whether >={low},<{high}
  local major minor
  IFS=. read -r major minor <<<"$1"
  [[ "$major" =~ ^[0-9]+$ && "$minor" =~ ^[0-9]+$ ]] || return 1
  (( major * 1000 + minor >= {low_n} && major * 1000 + minor < {high_n} ))
}}

if [ -x "$VENV/bin/python" ] && fits "$(pyver "$VENV/bin/python")"; then
  log "reusing $VENV (Python $(pyver "$VENV/bin/python"))"
else
  rm -rf "$VENV"  # absent, half made, or of an unsupported Python
  made=""
  for candidate in python3.12 python3.11 python3; do
    path=$(command -v "$candidate" || true)
    [ -n "$path" ] && fits "$(pyver "$path")" || continue
    if "$path" -m venv "$VENV" >/dev/null 2>&1; then
      made="$path"
      break
    fi
    rm -rf "$VENV"  # no venv module (Debian's python3.X-venv not installed)
  done
  if [ -z "$made" ]; then
    found="python3 is $(pyver python3 || echo absent)"
    uv=$(command -v uv || echo "$HOME/.local/bin/uv")
    if [ ! -x "$uv" ]; then
      log "no Python >={low},<{high} here ($found): installing uv to fetch CPython {low}"
      python3 -m pip install -q --user 'uv>=0.4' >&2 </dev/null ||
        python3 -m pip install -q --user --break-system-packages 'uv>=0.4' >&2 </dev/null ||
        die "no Python >={low},<{high} here ($found) and uv could not be installed to fetch one"
    fi
    "$uv" venv -q --seed --python {low} "$VENV" >&2 ||
      die "no Python >={low},<{high} here ($found) and uv could not make one ($uv venv failed)"
    made="$uv"
  fi
  log "made $VENV with $made"
fi
version=$(pyver "$VENV/bin/python" || true)
fits "$version" || die "$VENV has Python ${{version:-(none)}}; bert_jax needs >={low},<{high}"
"$VENV/bin/python" -m pip install -q -e . "$JAX_REQ"
got=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("jax"))' || true)
[ "$got" = "$JAX_VERSION" ] ||
  die "$VENV has jax ${{got:-(none)}} after installing $JAX_REQ (the pre-flight compiled with $JAX_VERSION)"
log "ready: $VENV (Python $version, jax $got)"
"""


@dataclasses.dataclass(frozen=True)
class TpuTarget(Target):
  """Settings of a TPU VM launch; tpu_name, zone and project are required.

  Attributes:
    tpu_name: the TPU VM (and queued resource) name.
    zone, project: where it lives.
    accelerator_type: e.g. "v4-32", "v5litepod-16", "v5p-8", "v6e-64" (or a topology such as
      "v4:2x2x4"); required with ``create``; checked against the slices bert_jax compiles for.
    runtime_version: the TPU VM image for ``create`` (empty: the one Cloud TPU's docs name for
      the accelerator's generation: tpu-ubuntu2204-base for v4, v2-alpha-tpuv5-lite for v5e,
      v2-alpha-tpuv5 for v5p, v2-alpha-tpuv6e for v6e).
    create: create the slice as a queued resource first (and wait until it is ACTIVE).
    spot: create it as a spot slice.
    ship: "scp" (tar of this working tree), "git" (clone ``repo_url`` at this commit) or
      "none" (the code is already installed in remote_dir, e.g. by an earlier run of a sweep).
    repo_url: the repository to clone with ``ship="git"``.
    remote_dir: where the code goes on each worker (its environment: remote_dir/.venv).
    install: a command run in remote_dir on each worker instead of the setup script (empty:
      the setup script, which makes remote_dir/.venv with a supported Python and installs the
      code with this machine's jax[tpu] version).
    coordinator_port: the jax.distributed coordinator's port on worker 0.
    log_file: each worker's log (tee'd; the same path on every worker).
    skip_preflight: launch without first compiling the job for accelerator_type (the
      pre-flight, launch/preflight.py, refuses a job whose step does not fit in HBM).
    max_restarts: with create: times the slice is re-created after it was preempted (or the job
      started again after exit 143 or a signal); it resumes from its latest checkpoint. The
      launch then starts the job in the background and watches it until it completes (Ctrl-C
      stops watching, not the job); 0: no watching, the job runs attached to the launch.
    watch_poll_s: seconds between looks at the queued resource and the job (also while
      waiting for ACTIVE; a failed create is tried again after 1x, 2x, 4x ... of it).
  """

  tpu_name: str = ""
  zone: str = ""
  project: str = ""
  accelerator_type: str = ""
  runtime_version: str = ""
  create: bool = False
  spot: bool = False
  ship: str = "scp"
  repo_url: str = ""
  remote_dir: str = "$HOME/bert_jax"
  install: str = ""
  coordinator_port: int = 8476
  log_file: str = "$HOME/bert_jax_job.log"
  skip_preflight: bool = False
  max_restarts: int = 3
  watch_poll_s: float = 60.0

  name = "tpu"

  @property
  def processes(self) -> int:
    """0: one process per worker of the slice, which only the workers know."""
    return 0

  def topology_name(self) -> str | None:
    return self.accelerator_type or None

  def sweep_run(self, index: int, first: bool, parallel: int = 1) -> TpuTarget:
    """The first run ships and installs the code (and creates the slice); the others find
    both there."""
    del index, parallel
    return self if first else dataclasses.replace(self, ship="none", create=False)

  def preflight(self, job: Job, config) -> dict | None:
    """Compiles the job for ``accelerator_type`` before anything is created (LaunchError when
    it does not fit); None when skipped or when no accelerator type is given."""
    if self.skip_preflight or not self.accelerator_type or config is None:
      return None
    return preflight(job, config, self.accelerator_type)

  def topology(self):
    """The slice ``accelerator_type`` names (bert_jax.parallel.topology), LaunchError when
    bert_jax does not know it; None when no accelerator type is given."""
    if not self.accelerator_type:
      return None
    # bert_jax (and JAX with it) only when an accelerator type is given.
    from bert_jax.parallel.topology import parse_topology  # noqa: PLC0415 (heavy)

    given = self.accelerator_type.strip().lower()
    try:
      topo = parse_topology(given)
    except ValueError as e:
      raise LaunchError(f"tpu target: --accelerator_type: {e}") from None
    if topo.is_gpu:
      raise LaunchError(f"tpu target: --accelerator_type {given!r} is a GPU, not a TPU slice")
    return topo

  def validate(self, job: Job) -> None:
    """Every setting, as a launch needs it; LaunchError (one line, naming the flag) before
    anything is printed, created or run, in a dry run as in a launch."""
    missing = [k for k in ("tpu_name", "zone", "project") if not getattr(self, k)]
    if self.create and not self.accelerator_type:
      missing.append("accelerator_type (needed with create)")
    if self.ship == "git" and not self.repo_url:
      missing.append("repo_url (needed with ship=git)")
    if missing:
      raise LaunchError(
        f"tpu target: missing required setting(s): {', '.join(missing)} "
        f"(flags --{' --'.join(m.split()[0] for m in missing)})"
      )
    if self.ship not in SHIP_METHODS:
      raise LaunchError(f"tpu target: ship must be one of {SHIP_METHODS}, got {self.ship!r}")
    checks = (
      ("tpu_name", _NAME, "a lower-case name: letters, digits and '-', at most 63"),
      ("zone", _ZONE, "a Cloud zone such as us-central2-b"),
      ("project", _PROJECT, "a Cloud project id: 6-30 lower-case letters, digits and '-'"),
    )
    for key, pattern, what in checks:
      if not pattern.fullmatch(getattr(self, key)):
        raise LaunchError(f"tpu target: --{key} {getattr(self, key)!r} is not {what}")
    for key in ("remote_dir", "log_file"):  # put in the workers' shell commands unquoted
      if not _PATH.fullmatch(getattr(self, key)):
        raise LaunchError(
          f"tpu target: --{key} {getattr(self, key)!r} is not a path of letters, digits, "
          "'/', '.', '_', '-', '~' and $VARIABLES"
        )
    if not 0 < self.coordinator_port < 65536:
      raise LaunchError(
        f"tpu target: --coordinator_port must be in 1..65535, got {self.coordinator_port}"
      )
    if self.max_restarts < 0:
      raise LaunchError(f"tpu target: max_restarts must be >= 0, got {self.max_restarts}")
    if self.watch_poll_s <= 0:
      raise LaunchError(f"tpu target: watch_poll_s must be > 0, got {self.watch_poll_s}")
    if not job.workdir.startswith("gs://"):
      raise LaunchError(
        f"tpu target: workdir {job.workdir!r} must be a gs:// path that every worker can write"
      )
    self.topology()
    if not self.install and self.ship != "none":
      python_bounds()
      local_jax_version()

  def gcloud(self, *args: str) -> list[str]:
    return ["gcloud", "compute", "tpus", *args, f"--zone={self.zone}", f"--project={self.project}"]

  def ssh_all(self, command: str) -> list[str]:
    return self.gcloud("tpu-vm", "ssh", self.tpu_name, "--worker=all", f"--command={command}")

  def setup_script_path(self) -> str:
    """Where the setup script is written here (and copied to on every worker)."""
    return f"/tmp/bert_jax_setup_{self.tpu_name}.sh"

  def setup_script(self) -> str:
    """The worker setup (bash, run in remote_dir): a ``.venv`` with a Python that bert_jax
    supports, the code installed there with this machine's jax as ``jax[tpu]==<version>``."""
    (low_major, low_minor), (high_major, high_minor) = python_bounds()
    version = local_jax_version()
    jax_req = f"jax[tpu]=={version}"
    return SETUP_SCRIPT.format(
      venv=VENV,
      low=f"{low_major}.{low_minor}",
      high=f"{high_major}.{high_minor}",
      low_n=low_major * 1000 + low_minor,
      high_n=high_major * 1000 + high_minor,
      jax_req=jax_req,
      jax_req_q=shlex.quote(jax_req),
      jax_version_q=shlex.quote(version),
    )

  def files(self, job: Job) -> dict[str, str]:
    """The files a launch writes here before its commands run: {path: text}."""
    self.validate(job)
    if self.install or self.ship == "none":
      return {}
    return {self.setup_script_path(): self.setup_script()}

  def worker_command(self, job: Job, attempt: int = 0, detached: bool = False) -> str:
    """The shell command every worker runs: set the jax.distributed coordinates and the attempt,
    run the job (``python3`` is remote_dir/.venv's). ``detached``: in the background, in a
    session of its own (it outlives the ssh connection), writing its exit status to
    ``remote_dir/.bert_jax_job.status`` (``tpu_watch.status_command`` reads it)."""
    meta = f"curl -sf -H 'Metadata-Flavor: Google' {METADATA_URL}"
    restarts = self.max_restarts if self.watched() else 0  # the restarts the launch makes
    run = f"{job.shell_command()} 2>&1 | tee -a {self.log_file}"
    if detached:
      inner = (
        f"echo $$ > {PID_FILE}; {job.shell_command()} >> {self.log_file} 2>&1; "
        f"echo $? > {STATUS_FILE}"
      )
      run = (
        f"rm -f {STATUS_FILE} {PID_FILE}; "
        f"nohup setsid bash -c {shlex.quote(inner)} > /dev/null 2>&1 < /dev/null &"
      )
    return "; ".join(
      [
        "set -euo pipefail",
        f"cd {self.remote_dir}",
        f'export PATH="$PWD/{VENV}/bin:$PATH"',
        f"endpoints=$({meta}/worker-network-endpoints)",
        f"export {ENV_PROCESS_ID}=$({meta}/agent-worker-number)",
        f"export {ENV_NUM_PROCESSES}=$(echo \"$endpoints\" | tr ',' '\\n' | grep -c .)",
        f'export {ENV_COORDINATOR}=$(echo "$endpoints" | cut -d, -f1 | cut -d: -f3)'
        f":{self.coordinator_port}",
        f"export {ENV_ATTEMPT}={attempt} {ENV_MAX_RESTARTS}={restarts}",
        run,
      ]
    )

  def watched(self) -> bool:
    """Whether the launch watches the job and restarts it: max_restarts > 0 on a slice it
    creates (it can only re-create what it created)."""
    return self.create and self.max_restarts > 0

  def create_command(self) -> list[str]:
    topo = self.topology()
    create = self.gcloud(
      "queued-resources",
      "create",
      self.tpu_name,
      f"--node-id={self.tpu_name}",
      f"--accelerator-type={topo.accelerator_type}",
      f"--runtime-version={self.runtime_version or RUNTIMES[topo.chip.generation]}",
    )
    return create + (["--spot"] if self.spot else [])

  def state_command(self) -> list[str]:
    return self.gcloud("queued-resources", "describe", self.tpu_name, "--format=value(state.state)")

  def setup_commands(self, job: Job) -> list[list[str]]:
    """Ship the code and set up every worker (idempotent; none with ship="none")."""
    if self.ship == "none":
      return []
    script = [] if self.install else [self.setup_script_path()]
    install = self.install or f"bash /tmp/{os.path.basename(self.setup_script_path())}"
    cmds = []
    if self.ship == "scp":
      archive = f"/tmp/bert_jax_code_{self.tpu_name}.tar.gz"
      cmds.append(
        [
          "tar",
          "-czf",
          archive,
          "--exclude=.venv",
          "--exclude=.git",
          "--exclude=__pycache__",
          "--exclude=*.egg-info",
          "-C",
          str(REPO_ROOT),
          ".",
        ]
      )
      cmds.append(
        self.gcloud("tpu-vm", "scp", archive, *script, f"{self.tpu_name}:/tmp/", "--worker=all")
      )
      unpack = (
        f"mkdir -p {self.remote_dir} && tar -xzf /tmp/{archive.rsplit('/', 1)[1]} "
        f"-C {self.remote_dir}"
      )
    else:
      if script:
        cmds.append(self.gcloud("tpu-vm", "scp", *script, f"{self.tpu_name}:/tmp/", "--worker=all"))
      commit = git_state()["commit"] or "HEAD"
      unpack = (
        f"(test -d {self.remote_dir}/.git || git clone -q {self.repo_url} "
        f"{self.remote_dir}) && git -C {self.remote_dir} fetch -q origin && "
        f"git -C {self.remote_dir} checkout -q {commit}"
      )
    cmds.append(self.ssh_all(f"{unpack} && cd {self.remote_dir} && {install}"))
    return cmds

  def start_command(self, job: Job, attempt: int) -> list[str]:
    """Starts the job on every worker: attached (the ssh returns when it ends), or detached
    when the launch watches it."""
    return self.ssh_all(self.worker_command(job, attempt, detached=self.watched()))

  def commands(self, job: Job) -> list[list[str]]:
    """Every command the launch runs, in order (after :meth:`files` are written), up to the
    job's start; runs nothing."""
    self.validate(job)
    create = [self.create_command()] if self.create else []
    return create + self.setup_commands(job) + [self.start_command(job, 0)]

  def describe(self, job: Job) -> str:
    """A shell script of the launch: the files it writes (as here-documents), then its
    commands, then (as comments) how it watches the job."""
    lines = []
    for path, text in self.files(job).items():
      lines += [f"cat > {shlex.quote(path)} <<'BERT_JAX_EOF'", text.rstrip("\n"), "BERT_JAX_EOF"]
    for cmd in self.commands(job):
      lines.append(shlex.join(cmd))
      if cmd[3:5] == ["queued-resources", "create"]:
        lines.append(f"# then wait until `{shlex.join(self.state_command())}` prints ACTIVE")
    if self.watched():
      lines += describe_watch(self)
    return "\n".join(lines)

  def run(self, job: Job, out: TextIO | None = None, stop: threading.Event | None = None) -> int:
    """Writes the files, then creates, ships, installs and starts (attached: the status of the
    job on the workers; watched: see tpu_watch). ``stop`` is not used: Ctrl-C ends the
    launcher, the job's fate is the workers'."""
    del stop
    out = out or sys.stdout
    for path, text in self.files(job).items():
      with open(path, "w") as f:
        f.write(text)
      out.write(f"launch: wrote {path}\n")
    if self.watched():
      return watch(self, job, out)
    for cmd in self.commands(job):
      out.write(f"launch: {shlex.join(cmd)}\n")
      out.flush()
      status = subprocess.run(cmd, check=False).returncode
      if status:
        out.write(f"launch: command failed with status {status}\n")
        return status
      if cmd[3:5] == ["queued-resources", "create"]:
        status = self.wait_active(out)
        if status:
          return status
    return 0

  def wait_active(self, out: TextIO) -> int:
    """Polls the queued resource every watch_poll_s until it is ACTIVE (0); its state's line
    and 1 when it is FAILED or SUSPENDED, gcloud's status when describe fails."""
    while True:
      proc = subprocess.run(self.state_command(), capture_output=True, text=True, check=False)
      state = proc.stdout.strip()
      if proc.returncode or state in ("FAILED", "SUSPENDED"):
        out.write(f"launch: queued resource {self.tpu_name} is {state or proc.stderr.strip()}\n")
        return proc.returncode or 1
      if state == "ACTIVE":
        return 0
      out.write(f"launch: queued resource {self.tpu_name} is {state}; waiting\n")
      out.flush()
      time.sleep(self.watch_poll_s)
