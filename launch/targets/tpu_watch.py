"""Watch a TPU launch until its job completes, re-creating the slice after a preemption.

``python -m launch run --target=tpu --create`` with ``max_restarts > 0`` (the default 3) creates
the queued resource, sets up every worker and starts the job there in the background (``nohup
setsid``: it outlives the ssh connection; each worker writes the job's exit status to
``<remote_dir>/.bert_jax_job.status``). Then, every ``watch_poll_s`` seconds:

1. the queued resource's state (``gcloud compute tpus queued-resources describe``). PREEMPTED,
   SUSPENDING or SUSPENDED: the slice went, and the job with it. The launch deletes the queued
   resource, creates it again, waits until it is ACTIVE, ships the code and runs the setup
   again (idempotent) and starts the job with ``BERT_JAX_ATTEMPT=k`` for the k-th restart; the
   job resumes from its checkpoint in the gs:// workdir.
2. ACTIVE: the job's status on every worker (one ssh). All 0: the job completed, the launch
   returns 0. Restartable (143: saved after SIGTERM; death by a signal; ``lost``: its process
   gone without a status, the VM restarted): the setup and the job again on the same slice,
   as the next attempt. Anything else (1, 2, 3, 130): not restarted; the launch returns it.

At most ``max_restarts`` restarts in all; then the launch returns the job's last status (143
after a slice lost). A create that fails is tried again after ``watch_poll_s``, then twice
that, four times ... (``CREATE_TRIES`` tries in all) and then reported; a queued resource that
ends FAILED while it is provisioned counts as a failed create (it is deleted first). A look
that fails (gcloud or the workers unreachable) is tried again at the next poll;
``MAX_POLL_FAILURES`` in a row are reported. Ctrl-C stops watching and leaves the job and the
slice as they are (one line; status 130).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from typing import TextIO

from bert_jax.interrupts import INTERRUPTED_EXIT, PREEMPTED_EXIT, restartable

from ..job import Job

STATUS_FILE = ".bert_jax_job.status"  # in remote_dir on each worker: the job's exit status
PID_FILE = ".bert_jax_job.pid"  # in remote_dir: the detached job's shell
LOST_STATES = ("PREEMPTED", "SUSPENDING", "SUSPENDED")
CREATE_TRIES = 5
MAX_POLL_FAILURES = 10
_STATUS_LINE = re.compile(r"^bert_jax_job: (running|lost|\d+)\s*$", re.MULTILINE)
_LOST = 128 + 9  # a worker's job gone without a status: as if killed (SIGKILL)


def delete_command(target) -> list[str]:
  """Deletes the queued resource and its TPU VMs."""
  return target.gcloud("queued-resources", "delete", target.tpu_name, "--force", "--quiet")


def status_command(target) -> list[str]:
  """Prints one line per worker: ``bert_jax_job: running``, ``... lost`` (its process gone
  without a status: the VM restarted) or ``... <exit status>`` of the detached job."""
  check = (
    f"cd {target.remote_dir} && if [ -f {STATUS_FILE} ]; then "
    f'echo "bert_jax_job: $(cat {STATUS_FILE})"; '
    f'elif [ -f {PID_FILE} ] && ! kill -0 "$(cat {PID_FILE})" 2>/dev/null; then '
    "echo 'bert_jax_job: lost'; else echo 'bert_jax_job: running'; fi"
  )
  return target.ssh_all(check)


def describe_watch(target) -> list[str]:
  """What the watch does, as comment lines of the dry run's script."""
  return [
    f"# then, every {target.watch_poll_s:g} s until every worker's job status is 0:",
    f"#   {shlex.join(target.state_command())}",
    f"#   {shlex.join(status_command(target))}",
    f"# on PREEMPTED / SUSPENDING / SUSPENDED (at most max_restarts={target.max_restarts}"
    f" times): {shlex.join(delete_command(target))}",
    "#   then the commands above again with BERT_JAX_ATTEMPT=<restart number>; after a job",
    "#   status of 143 or a signal's, the same on this slice; 1, 2, 3 and 130 end the launch",
  ]


class Watch:
  """One watched launch of ``job`` on ``target`` (a TpuTarget); ``run`` returns its status."""

  def __init__(self, target, job: Job, out: TextIO):
    self.target = target
    self.job = job
    self.out = out
    self.name = target.tpu_name
    self.poll_s = target.watch_poll_s
    self.workers = target.topology().num_hosts
    self.attempt = 0  # k for the k-th restart

  def say(self, text: str) -> None:
    self.out.write(f"launch: {text}\n")
    self.out.flush()

  def call(self, cmd: list[str]) -> int:
    """Runs one of the launch's commands (printed first, as an unwatched launch does)."""
    self.say(shlex.join(cmd))
    status = subprocess.run(cmd, check=False).returncode
    if status:
      self.say(f"command failed with status {status}")
    return status

  def look(self, cmd: list[str]) -> str | None:
    """A poll's output; None when it failed."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return None if proc.returncode else proc.stdout

  def create(self, recreate: bool) -> int:
    """(Re-)creates the queued resource and waits until it is ACTIVE, trying again with a
    growing wait; 0, or the last failure's status after CREATE_TRIES tries."""
    if recreate:
      self.call(delete_command(self.target))  # a failure shows in the create that follows
    for i in range(CREATE_TRIES):
      status = self.call(self.target.create_command())
      if not status:
        status = self.target.wait_active(self.out)
        if not status:
          return 0
        self.call(delete_command(self.target))  # ours, FAILED: make room for the next one
      if i + 1 < CREATE_TRIES:
        wait = self.poll_s * 2**i
        self.say(
          f"creating queued resource {self.name} failed; trying again in {wait:g} s "
          f"(try {i + 2} of {CREATE_TRIES})"
        )
        time.sleep(wait)
    self.say(f"could not create queued resource {self.name} in {CREATE_TRIES} tries; giving up")
    return status

  def start(self) -> int:
    """Sets up every worker and starts this attempt of the job there; 0 or a command's
    status."""
    start = self.target.start_command(self.job, self.attempt)
    for cmd in [*self.target.setup_commands(self.job), start]:
      status = self.call(cmd)
      if status:
        return status
    self.say(
      f"attempt {self.attempt} started on every worker of {self.name}; watching it every "
      f"{self.poll_s:g} s (Ctrl-C stops watching, not the job)"
    )
    return 0

  def job_statuses(self) -> list[int | None] | None:
    """Each worker's job: None while it runs, else its exit status; None when the look
    failed or not every worker answered."""
    text = self.look(status_command(self.target))
    found = _STATUS_LINE.findall(text or "")
    if text is None or len(found) != self.workers:
      return None
    return [None if s == "running" else _LOST if s == "lost" else int(s) for s in found]

  def run(self) -> int:
    failed = self.create(recreate=False) or self.start()
    if failed:
      return failed
    failures = 0  # looks in a row that failed
    while True:
      time.sleep(self.poll_s)
      state = (self.look(self.target.state_command()) or "").strip()
      if state in LOST_STATES:
        outcome = self.restart(f"queued resource {self.name} is {state}", PREEMPTED_EXIT, True)
      else:
        statuses = self.job_statuses() if state == "ACTIVE" else None
        if statuses is None:
          failures += 1
          if failures < MAX_POLL_FAILURES:
            continue
          self.say(
            f"{failures} looks in a row at {self.name} failed (state {state or 'unknown'}); "
            "stopped watching; the job and the queued resource are left as they are"
          )
          return 1
        outcome = None if None in statuses else self.ended(statuses)
      failures = 0
      if outcome is not None:
        return outcome

  def ended(self, statuses: list[int]) -> int | None:
    """After every worker's job ended: the launch's status, or None once restarted."""
    ended = sorted({s for s in statuses if s})
    if not ended:
      self.say(f"the job completed on every worker of {self.name} (attempt {self.attempt})")
      return 0
    codes = ", ".join(map(str, ended))
    refused = [s for s in ended if not restartable(s)]
    if refused:
      self.say(
        f"the job ended with status {codes} (attempt {self.attempt}); not restarted (only a "
        "preemption is: 143 or a signal)"
      )
      return refused[0]
    return self.restart(f"the job ended with status {codes}", ended[-1], False)

  def restart(self, why: str, status: int, recreate: bool) -> int | None:
    """The next attempt, on a re-created slice or the same one: None once it started; the
    launch's status (``status`` when no restart is left)."""
    if self.attempt == self.target.max_restarts:
      self.say(f"{why}; the {self.attempt} restart(s) allowed are used: not restarted")
      return status
    self.attempt += 1
    where = "a re-created slice" if recreate else "the same slice"
    self.say(f"{why}: restart {self.attempt} of {self.target.max_restarts} on {where}")
    return (recreate and self.create(recreate=True)) or self.start() or None


def watch(target, job: Job, out: TextIO) -> int:
  """Creates the slice, starts the job and watches it (the module docstring); the launch's
  exit status."""
  try:
    return Watch(target, job, out).run()
  except KeyboardInterrupt:
    out.write(
      f"launch: stopped watching {target.tpu_name} (Ctrl-C); the job and the queued resource "
      "are left as they are\n"
    )
    out.flush()
    return INTERRUPTED_EXIT
