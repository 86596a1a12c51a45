"""WorkdirLock: one run per workdir (flock on local disks, a checked run id on object stores)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from absl.testing import absltest

from bert_jax.checkpoint.lock import (
  LOCK_FILE,
  WorkdirLock,
  WorkdirLockedError,
  WorkdirTakenOverError,
)

_HOLDER = textwrap.dedent(
  """
  import sys
  from bert_jax.checkpoint.lock import WorkdirLock
  lock = WorkdirLock(sys.argv[1], purpose="holder", process_index=0)
  lock.acquire()
  print("locked", flush=True)
  sys.stdin.readline()  # hold until told (or killed)
  lock.release()
  print("released", flush=True)
  """
)


def _start_holder(workdir):
  proc = subprocess.Popen(
    [sys.executable, "-c", _HOLDER, str(workdir)],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    text=True,
  )
  line = proc.stdout.readline()
  assert line.strip() == "locked", line
  return proc


def test_lock_file_holds_host_pid_and_run_id_and_is_removed_on_exit(tmp_path):
  with WorkdirLock(tmp_path, purpose="pretrain", process_index=0) as lock:
    info = json.loads((tmp_path / LOCK_FILE).read_text())
    assert info["host"] == socket.gethostname()
    assert info["pid"] == os.getpid()
    assert info["run_id"] == lock.run_id
    assert info["purpose"] == "pretrain"
    assert info["start_time"]
    lock.check()  # still ours
  assert not (tmp_path / LOCK_FILE).exists()


def test_released_on_exception(tmp_path):
  with pytest.raises(RuntimeError, match="boom"):
    with WorkdirLock(tmp_path, process_index=0):
      raise RuntimeError("boom")
  assert not (tmp_path / LOCK_FILE).exists()
  with WorkdirLock(tmp_path, process_index=0):  # free again
    pass


def test_second_lock_refused_naming_host_and_pid(tmp_path):
  with WorkdirLock(tmp_path, purpose="first", process_index=0):
    with pytest.raises(WorkdirLockedError) as e:
      WorkdirLock(tmp_path, purpose="second", process_index=0).acquire()
  message = str(e.value)
  assert socket.gethostname() in message and f"pid {os.getpid()}" in message
  assert str(tmp_path) in message


def test_two_processes_contend(tmp_path):
  holder = _start_holder(tmp_path)
  try:
    with pytest.raises(WorkdirLockedError, match=f"pid {holder.pid}"):
      WorkdirLock(tmp_path, process_index=0).acquire()
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "released"
    assert holder.wait(timeout=60) == 0
  finally:
    if holder.poll() is None:
      holder.kill()
  with WorkdirLock(tmp_path, process_index=0) as lock:  # free once the holder released it
    assert lock.previous is None  # released cleanly: nothing stale to take over


def test_stale_lock_of_killed_process_is_taken_over(tmp_path):
  holder = _start_holder(tmp_path)
  os.kill(holder.pid, signal.SIGKILL)
  holder.wait(timeout=60)
  stale = json.loads((tmp_path / LOCK_FILE).read_text())  # kill -9 left the file behind
  assert stale["pid"] == holder.pid
  with absltest.mock.patch("bert_jax.checkpoint.lock.logging.warning") as warn:
    with WorkdirLock(tmp_path, purpose="resume", process_index=0) as lock:
      assert lock.previous["pid"] == holder.pid
      info = json.loads((tmp_path / LOCK_FILE).read_text())
      assert info["pid"] == os.getpid() and info["run_id"] == lock.run_id
  logged = warn.call_args[0][0] % warn.call_args[0][1:]
  assert "stale" in logged and f"pid {holder.pid}" in logged


def test_check_raises_when_lock_file_replaced(tmp_path):
  with WorkdirLock(tmp_path, process_index=0) as lock:
    info = json.loads((tmp_path / LOCK_FILE).read_text())
    (tmp_path / LOCK_FILE).write_text(json.dumps(dict(info, run_id="other", pid=4242)))
    with pytest.raises(WorkdirTakenOverError, match="pid 4242"):
      lock.check()
  assert (tmp_path / LOCK_FILE).exists()  # not ours: left alone


def test_object_store_mode_second_run_takes_over_and_first_stops_at_check(tmp_path):
  first = WorkdirLock(tmp_path, purpose="first", process_index=0, mode="run_id")
  first.acquire()
  first.check()
  second = WorkdirLock(tmp_path, purpose="second", process_index=0, mode="run_id")
  second.acquire()  # no lock to refuse with: the claim is replaced
  assert second.previous["run_id"] == first.run_id
  with pytest.raises(WorkdirTakenOverError, match="second"):
    first.check()
  second.check()
  first.release()  # not its claim any more: the file stays
  assert json.loads((tmp_path / LOCK_FILE).read_text())["run_id"] == second.run_id
  second.release()
  assert not (tmp_path / LOCK_FILE).exists()


def test_auto_mode_by_path():
  assert WorkdirLock("gs://bucket/run", process_index=1).mode == "run_id"
  assert WorkdirLock("s3://bucket/run", process_index=1).mode == "run_id"
  assert WorkdirLock("/tmp/run", process_index=1).mode == "flock"


def test_only_process_zero_locks(tmp_path):
  with WorkdirLock(tmp_path, process_index=1) as lock:
    assert lock.info == {}  # claimed nothing
    assert not (tmp_path / LOCK_FILE).exists()
    lock.check()  # a no-op
    with WorkdirLock(tmp_path, process_index=0):  # process 0 of this workdir is free
      pass


def test_workdir_that_is_a_file(tmp_path):
  path = tmp_path / "workdir"
  path.write_text("not a directory")
  with pytest.raises(NotADirectoryError, match="is a file"):
    WorkdirLock(path, process_index=0).acquire()
