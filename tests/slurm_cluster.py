"""A real one-node SLURM cluster on localhost for tests: munged, slurmctld and slurmd.

    cluster = SlurmCluster(root)   # a fresh directory: config, spool, state, logs, munge key
    cluster.start()                # SlurmUnavailable when the daemons are not installed
    env = cluster.env()            # os.environ + SLURM_CONF: sbatch, srun, scontrol use it
    cluster.reconfigure(JobRequeue="0")  # slurm.conf changed, read again by the daemons
    ...
    cluster.stop()

Everything lives under ``root``: its own ``slurm.conf``, munge key and socket, spool and state
directories, and the daemons' logs; the ports are free ones picked at start, so nothing of a
system-wide SLURM or munge is used or touched. The daemons run in the foreground as children
of this process and are stopped by their process ids.

The node is named after this host (``scontrol show hostnames`` gives that name to the job, and
jobs connect to it, as on a real cluster; ``localhost`` when the host name does not resolve).
It has ``CPUS`` CPUs (declared; ``SlurmdParameters=config_overrides`` lets
that exceed this machine's cores) and ``GPUS`` GPUs: a ``gpu`` GRES over character devices
made with ``mknod`` under ``root/dev`` (device files only; nothing opens them), so SLURM
allocates GPUs per job and sets ``CUDA_VISIBLE_DEVICES`` as it does on a GPU cluster without
cgroups. Partitions: ``debug`` (the GPU layout) and ``cpu`` (jobs that ask for no GPUs), both
on that node, and ``high`` (PriorityTier 2), whose jobs preempt theirs: SLURM requeues them
(``PreemptType=preempt/partition_prio``, ``PreemptMode=REQUEUE``). No accounting daemon: a
finished job's state stays in ``scontrol show job`` for ``MinJobAge`` seconds.

Requeues are quick: a requeued job may start again ``cred_expire`` (AuthInfo; 5 s here, SLURM's
default 120 s) + 1 s after it was requeued, and the scheduler looks at pending jobs every second
(``sched_interval=1``; default 60 s). ``OverTimeLimit=1`` lets a job run a minute past its time
limit before SLURM ends it (its processes get SIGTERM, SIGKILL ``KillWait`` = 30 s later).
"""

from __future__ import annotations

import contextlib
import ctypes
import getpass
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time

CPUS = 4
GPUS = 4
# A job in one of these states has ended.
END_STATES = {
  "BOOT_FAIL",
  "CANCELLED",
  "COMPLETED",
  "DEADLINE",
  "FAILED",
  "NODE_FAIL",
  "OUT_OF_MEMORY",
  "PREEMPTED",
  "TIMEOUT",
}
# Debian installs the daemons in /usr/sbin, which a non-root PATH may lack.
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
_PROGRAMS = ("munged", "slurmctld", "slurmd", "slurmstepd", "sbatch", "srun", "scontrol", "scancel")


class SlurmUnavailable(RuntimeError):
  """SLURM or munge is not installed here (what a test may skip for)."""


class SlurmStartError(RuntimeError):
  """The daemons are installed but did not come up (a failure, with their logs)."""


def find_programs() -> dict[str, str]:
  """Each program's path; SlurmUnavailable naming the missing ones."""
  found = {p: shutil.which(p, path=_SEARCH_PATH) for p in _PROGRAMS}
  missing = sorted(p for p, path in found.items() if path is None)
  if missing:
    raise SlurmUnavailable(
      f"slurm-wlm/munge not installed: {', '.join(missing)} not found "
      "(Debian: apt-get install slurm-wlm munge; .ci/run does this)"
    )
  return found


def _die_with_parent() -> None:
  """In the child before exec: SIGTERM when the process that started it dies (Linux), so a
  killed test run leaves no daemons behind."""
  with contextlib.suppress(OSError, AttributeError):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def node_name() -> str:
  """This host's name when it resolves (what a job's coordinator address uses), else localhost."""
  host = socket.gethostname()
  try:
    socket.gethostbyname(host)
  except OSError:
    return "localhost"
  return host


def free_port() -> int:
  with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class SlurmCluster:
  """munged + slurmctld + slurmd for one node on localhost, under ``root``."""

  def __init__(self, root: os.PathLike | str):
    self.root = pathlib.Path(root).resolve()
    self.settings: dict[str, str] = {}  # slurm.conf lines changed by reconfigure
    self.conf = self.root / "etc" / "slurm.conf"
    self.log_dir = self.root / "log"
    self.munge_socket = self.root / "munge" / "munge.socket"
    self.procs: dict[str, subprocess.Popen] = {}
    self.node = node_name()
    self.programs: dict[str, str] = {}

  # --- set-up ----------------------------------------------------------------------------------

  def _write_files(self) -> None:
    for d in ("etc", "log", "state", "spool", "tmp", "dev", "munge", "munge_key"):
      (self.root / d).mkdir(parents=True, exist_ok=True)
    # munged wants its key private and the socket's directory reachable by everyone.
    os.chmod(self.root / "munge_key", 0o700)
    os.chmod(self.root / "munge", 0o755)
    key = self.root / "munge_key" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    gpus = []
    for i in range(GPUS):
      dev = self.root / "dev" / f"nvidia{i}"
      if not dev.exists():
        try:
          os.mknod(dev, 0o666 | 0o020000, os.makedev(195, i))  # S_IFCHR, NVIDIA's major
        except OSError:  # no CAP_MKNOD: a plain file serves as well for SLURM's bookkeeping
          dev.touch()
      gpus.append(str(dev))
    (self.root / "etc" / "plugstack.conf").write_text("")
    (self.root / "etc" / "gres.conf").write_text(
      "".join(f"NodeName={self.node} Name=gpu File={g}\n" for g in gpus)
    )
    (self.root / "etc" / "cgroup.conf").write_text("")
    self.ctld_port, self.slurmd_port = free_port(), free_port()
    self.srun_ports = sorted((free_port(), free_port()))
    self._write_conf()

  def _write_conf(self) -> None:
    """slurm.conf: the defaults below with ``self.settings`` replacing or adding lines."""
    r, user, host = self.root, getpass.getuser(), socket.gethostname()
    lo, hi = self.srun_ports
    lines = f"""\
ClusterName=bertjaxtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=5
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={r}/etc/plugstack.conf
TmpFS={r}/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
MinJobAge=3600
KillWait=30
OverTimeLimit=1
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
InactiveLimit=0
SlurmdTimeout=300
SlurmctldTimeout=300
MessageTimeout=30
SrunPortRange={lo}-{max(hi, lo + 20)}""".splitlines()
    settings = dict(self.settings)
    conf = ["# A one-node test cluster (tests/slurm_cluster.py)."]
    for line in lines:
      key = line.split("=", 1)[0]
      conf.append(f"{key}={settings.pop(key)}" if key in settings else line)
    conf += [f"{k}={v}" for k, v in settings.items()]
    node = self.node
    conf += [
      f"NodeName={node} NodeHostname={node} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory=1000 "
      f"Gres=gpu:{GPUS} State=UNKNOWN",
      f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP PriorityTier=1",
      f"PartitionName=cpu Nodes={node} MaxTime=INFINITE State=UP PriorityTier=1",
      # Its jobs preempt (requeue) the other partitions' jobs.
      f"PartitionName=high Nodes={node} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF",
    ]
    self.conf.write_text("\n".join(conf) + "\n")

  def reconfigure(self, **settings: str) -> None:
    """Rewrites slurm.conf with ``settings`` changed (e.g. JobRequeue="0") and has the running
    daemons read it again (``scontrol reconfigure``)."""
    self.settings.update(settings)
    self._write_conf()
    self.scontrol("reconfigure")

  def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default os.environ) with SLURM_CONF pointing at this cluster."""
    env = dict(os.environ if base is None else base)
    env["SLURM_CONF"] = str(self.conf)
    env["PATH"] = _SEARCH_PATH if base is None else env.get("PATH", _SEARCH_PATH)
    return env

  def _spawn(self, name: str, argv: list[str]) -> None:
    log = open(self.log_dir / f"{name}.stdout", "ab")
    self.procs[name] = subprocess.Popen(
      argv,
      env=self.env(),
      stdout=log,
      stderr=subprocess.STDOUT,
      stdin=subprocess.DEVNULL,
      start_new_session=True,
      preexec_fn=_die_with_parent,
    )
    log.close()

  def logs(self, lines: int = 30) -> str:
    """The last lines of every daemon log (for a failure message)."""
    out = []
    for path in sorted(self.log_dir.glob("*")):
      text = path.read_text(errors="replace").splitlines()[-lines:]
      out.append(f"--- {path.name}\n" + "\n".join(text))
    return "\n".join(out)

  def _check_alive(self) -> None:
    for name, proc in self.procs.items():
      if proc.poll() is not None:
        raise SlurmStartError(f"{name} exited with status {proc.returncode}\n{self.logs()}")

  def start(self, timeout_s: float = 60.0) -> SlurmCluster:
    """Starts the daemons and waits until the node is idle."""
    self.programs = find_programs()
    self._write_files()
    p, r = self.programs, self.root
    self._spawn(
      "munged",
      [
        p["munged"],
        "--foreground",
        "--force",
        f"--socket={self.munge_socket}",
        f"--key-file={r}/munge_key/munge.key",
        f"--log-file={r}/log/munged.log",
        f"--pid-file={r}/munge/munged.pid",
        f"--seed-file={r}/munge/munged.seed",
      ],
    )
    deadline = time.monotonic() + timeout_s
    while not self.munge_socket.exists():
      self._check_alive()
      if time.monotonic() > deadline:
        raise SlurmStartError(f"munged: no socket after {timeout_s} s\n{self.logs()}")
      time.sleep(0.1)
    self._spawn("slurmctld", [p["slurmctld"], "-D", "-i", "-f", str(self.conf)])
    self._spawn("slurmd", [p["slurmd"], "-D", "-N", self.node, "-f", str(self.conf)])
    while True:
      self._check_alive()
      state = self.scontrol("show", "node", self.node, check=False)
      if "State=IDLE" in state.stdout:
        return self
      if time.monotonic() > deadline:
        raise SlurmStartError(
          f"node {self.node} not idle after {timeout_s} s: {state.stdout}{state.stderr}\n{self.logs()}"
        )
      time.sleep(0.5)

  def stop(self) -> None:
    """Cancels every job, then stops slurmd, slurmctld and munged (SIGTERM, then SIGKILL)."""
    if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
      subprocess.run(
        [self.programs["scancel"], "--user", getpass.getuser()],
        env=self.env(),
        capture_output=True,
        check=False,
        timeout=30,
      )
    for name in ("slurmd", "slurmctld", "munged"):
      proc = self.procs.get(name)
      if proc is None or proc.poll() is not None:
        continue
      proc.send_signal(signal.SIGTERM)
      try:
        proc.wait(timeout=20)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

  def __enter__(self) -> SlurmCluster:
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()

  # --- jobs ------------------------------------------------------------------------------------

  def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
      [self.programs["scontrol"], *args],
      env=self.env(),
      capture_output=True,
      text=True,
      check=check,
      timeout=60,
    )

  def job(self, job_id: int | str) -> dict[str, str]:
    """``scontrol show job`` as a dict (JobState, ExitCode, TRES, ...)."""
    text = self.scontrol("show", "job", "--oneliner", str(job_id)).stdout
    fields = {}
    for item in text.split():
      key, sep, value = item.partition("=")
      if sep:
        fields[key] = value
    return fields

  def wait(self, job_id: int | str, timeout_s: float = 300.0) -> dict[str, str]:
    """Waits until the job has ended; its final ``scontrol show job`` fields."""
    deadline = time.monotonic() + timeout_s
    while True:
      info = self.job(job_id)
      if info.get("JobState") in END_STATES:
        return info
      if time.monotonic() > deadline:
        raise TimeoutError(f"job {job_id} still {info.get('JobState')} after {timeout_s} s")
      time.sleep(1.0)

  def sbatch(self, *args: str) -> int:
    """Submits a job directly (``sbatch --parsable ...``); its id."""
    out = subprocess.run(
      [self.programs["sbatch"], "--parsable", *args],
      env=self.env(),
      capture_output=True,
      text=True,
      check=True,
      timeout=60,
    ).stdout
    return int(out.strip().split(";")[0])

  def scancel(self, job_id: int | str, *args: str) -> None:
    subprocess.run(
      [self.programs["scancel"], *args, str(job_id)],
      env=self.env(),
      capture_output=True,
      check=True,
      timeout=60,
    )


def tiny_pretrain_args(steps: int) -> list[str]:
  """Entry-point flags of a tiny pre-training on synthetic data (with configs/pretrain.py:tiny),
  small enough for the test cluster's CPUs: ``steps`` steps, no evaluation, a loss line a step."""
  return [
    "--config.synthetic_data=true",
    f"--config.num_train_steps={steps}",
    "--config.train_batch_size=8",
    "--config.eval_batch_size=8",
    "--config.max_eval_steps=1",
    "--config.phase2.fraction=0.0",
    "--config.eval_every_steps=0",
    "--config.logging.log_every_steps=1",
  ]


if __name__ == "__main__":  # python tests/slurm_cluster.py DIR: a cluster until Ctrl-C
  import sys

  cluster = SlurmCluster(sys.argv[1] if len(sys.argv) > 1 else "/tmp/slurm_cluster")
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
  with cluster:
    print(f"export SLURM_CONF={cluster.conf}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
      signal.pause()
