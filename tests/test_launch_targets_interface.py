"""The target interface (launch/targets/base.py): every registered target implements all of it,
the launcher, pre-flight, sweeps and GLUE suites ask targets only through it, and a new target
defined outside launch/ launches, dry and for real, alone or in a sweep, without a change there.
"""

import dataclasses
import inspect
import io
import json
import pathlib
import re
import threading

import pytest

from launch import sweep
from launch.job import Job, LaunchError
from launch.launch import launch
from launch.targets import TARGETS, make_target, target_fields
from launch.targets.base import Target

REPO = pathlib.Path(__file__).resolve().parent.parent

# Every member of the interface and how it is reached: a method, or a property.
METHODS = (
  "validate",
  "describe",
  "run",
  "preflight",
  "topology_name",
  "records_here",
  "sweep_run",
)
PROPERTIES = ("processes", "on_this_machine", "results_on_return", "parallel_runs")


def test_the_interface_lists_every_member():
  """The lists above are Target's whole public interface (a member added there is tested)."""
  public = {n for n in vars(Target) if not n.startswith("_")}
  assert public == {*METHODS, *PROPERTIES}, public
  assert "name" in Target.__annotations__


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_registered_target_implements_the_whole_interface(name):
  cls = TARGETS[name]
  assert issubclass(cls, Target)
  assert not inspect.isabstract(cls), sorted(cls.__abstractmethods__)
  assert cls.name == name  # --target=<name> makes a target that says it is <name>
  for member in METHODS:  # the same parameters as the interface's, so callers need not ask
    assert list(inspect.signature(getattr(cls, member)).parameters) == list(
      inspect.signature(getattr(Target, member)).parameters
    ), (name, member)
  for member in PROPERTIES:
    assert isinstance(inspect.getattr_static(cls, member), property), (name, member)
  # A property of the interface is not also a setting (a flag and a launch.json field).
  assert not {*METHODS, *PROPERTIES} & set(target_fields(name))
  target = make_target(name)
  assert isinstance(target, Target)
  assert isinstance(target.processes, int) and target.processes >= 0
  for member in ("on_this_machine", "results_on_return", "parallel_runs"):
    assert isinstance(getattr(target, member), bool), (name, member)


def test_answers_of_the_four_targets():
  """What the callers used to find out by the target's name, now each target's answer."""
  job = Job("evaluate", "", "/tmp/run")
  gs_job = job.replace(workdir="gs://bucket/run")
  local = make_target("local", {"num_processes": 3})
  tpu = make_target("tpu", {"accelerator_type": "v4-32"})
  slurm = make_target("slurm", {"nodes": 2, "gpus_per_node": 8, "gpu_type": "h100"})
  k8s = make_target("kubernetes", {"num_hosts": 2, "gpus_per_host": 4, "gpu_type": "h100"})
  assert [t.processes for t in (local, tpu, slurm, k8s)] == [3, 0, 16, 2]
  assert [t.topology_name() for t in (local, tpu, slurm, k8s)] == [
    None,
    "v4-32",
    "h100:2x8",
    "h100:2x4",
  ]
  assert make_target("kubernetes", {"accelerator_type": "v5p-8"}).topology_name() == "v5p-8"
  assert [t.on_this_machine for t in (local, tpu, slurm, k8s)] == [True, False, False, False]
  assert [t.results_on_return for t in (local, tpu, slurm, k8s)] == [True, False, False, False]
  assert [t.parallel_runs for t in (local, tpu, slurm, k8s)] == [True, False, False, False]
  assert [t.records_here(job) for t in (local, tpu, slurm, k8s)] == [True, True, True, False]
  assert k8s.records_here(gs_job) and tpu.records_here(gs_job)
  assert not tpu.records_here(job.replace(workdir="s3://bucket/run"))
  assert local.preflight(job, None) is None
  # Sweeps: TPU's first run ships (and creates), the others reuse; job names get the index.
  tpu_create = dataclasses.replace(tpu, create=True)
  assert tpu_create.sweep_run(0, True) is tpu_create
  assert (tpu_create.sweep_run(3, False).ship, tpu_create.sweep_run(3, False).create) == (
    "none",
    False,
  )
  assert slurm.sweep_run(2, True).job_name == "bert_jax-2"
  assert k8s.sweep_run(2, True) is k8s  # no job name: each run's comes from its workdir
  assert dataclasses.replace(k8s, job_name="grid").sweep_run(1, False).job_name == "grid-1"
  assert local.sweep_run(1, False) is local
  assert local.sweep_run(1, False, parallel=2).echo is False


def test_a_target_missing_a_member_cannot_be_made():
  @dataclasses.dataclass(frozen=True)
  class Half(Target):
    name = "half"

    def validate(self, job):
      pass

    def describe(self, job):
      return ""

  with pytest.raises(TypeError, match="processes.*run|run.*processes"):
    Half()


CALLERS = ("launch.py", "preflight.py", "sweep.py", "glue.py", "__main__.py")


@pytest.mark.parametrize("file", CALLERS)
def test_callers_do_not_ask_which_target_they_hold(file):
  text = (REPO / "launch" / file).read_text()
  assert not re.search(r"\.name\s*[!=]=", text)
  assert not re.search(r"FLAGS\.target\s*[!=]=", text)
  assert not re.search(r"\b(hasattr|getattr)\(\s*target\b", text)


# --- a new target, defined here -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class NoteTarget(Target):
  """Writes a note into the workdir instead of running the job (a target defined outside
  launch/targets, registered only in a test).

  Attributes:
    greeting: the note's first word.
    copies: processes it says the job runs.
  """

  greeting: str = "hello"
  copies: int = 1

  name = "note"
  calls = []  # (workdir, stop) of each run, for the test to read

  @property
  def processes(self) -> int:
    return self.copies

  @property
  def results_on_return(self) -> bool:
    return True

  def validate(self, job):
    if "://" in job.workdir:
      raise LaunchError(f"note target: workdir {job.workdir!r} must be a local path")

  def describe(self, job):
    return f"note {self.greeting}: {job.shell_command()}"

  def run(self, job, out=None, stop=None):
    NoteTarget.calls.append((job.workdir, stop))
    pathlib.Path(job.workdir).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(job.workdir) / "metrics.json").write_text(json.dumps({"greeting": 1.0}))
    out.write(f"note: {self.greeting} {job.workdir}\n")
    return 0


@pytest.fixture
def note_target(monkeypatch):
  """NoteTarget registered as ``--target=note``: its one line in the registry."""
  monkeypatch.setitem(TARGETS, "note", NoteTarget)
  NoteTarget.calls.clear()
  return make_target("note", {"greeting": "hi", "copies": 2})


@pytest.fixture
def config_file(tmp_path):
  path = tmp_path / "note_config.py"
  path.write_text(
    "import ml_collections\n\n"
    "def get_config():\n"
    "  return ml_collections.ConfigDict({'seed': 0, 'learning_rate': 0.1})\n"
  )
  return str(path)


def test_a_new_target_launches_dry_and_for_real(tmp_path, note_target, config_file):
  assert not inspect.isabstract(NoteTarget)
  job = Job("some.module", config_file, str(tmp_path / "run"), overrides=(("seed", 3),))
  out = io.StringIO()
  assert launch(job, note_target, dry_run=True, out=out) == 0
  assert out.getvalue() == f"note hi: {job.shell_command()}\n"
  assert not (tmp_path / "run").exists() and NoteTarget.calls == []

  out = io.StringIO()
  stop = threading.Event()
  assert launch(job, note_target, out=out, stop=stop) == 0
  assert out.getvalue() == f"note: hi {job.workdir}\n"
  assert NoteTarget.calls == [(job.workdir, stop)]
  record = json.loads((tmp_path / "run" / "launch.json").read_text())
  assert record["target"] == "note"
  assert record["target_settings"] == {"greeting": "hi", "copies": 2}
  assert record["num_processes"] == 2
  assert record["config"]["seed"] == 3
  assert "preflight" not in record

  with pytest.raises(LaunchError, match="must be a local path"):
    launch(job.replace(workdir="gs://b/run"), note_target, dry_run=True, out=io.StringIO())


def test_a_new_target_that_cannot_record_here(tmp_path, note_target):
  class Elsewhere(NoteTarget):
    name = "note"

    def records_here(self, job):
      return False

  job = Job("some.module", "", str(tmp_path / "run"))
  out = io.StringIO()
  assert launch(job, Elsewhere(), out=out) == 0
  assert out.getvalue().startswith(
    f"launch: {job.workdir} is not reachable from here; launch.json not written\n"
  )
  assert not (tmp_path / "run" / "launch.json").exists()


def test_a_new_target_runs_a_sweep(tmp_path, note_target, config_file):
  base = Job("some.module", config_file, str(tmp_path / "sweep"))
  runs = sweep.plan_sweep(base, sweep.axis("seed", [0, 1, 2]), str(tmp_path / "sweep"))
  out = io.StringIO()
  assert sweep.run_sweep(runs, note_target, parallel=3, out=out) == {r.name: 0 for r in runs}
  assert sorted(w for w, _ in NoteTarget.calls) == sorted(r.job.workdir for r in runs)
  assert "sweep: 3 of 3 run(s) to run" in out.getvalue()
  # Complete (metrics.json), so a second invocation runs nothing.
  out = io.StringIO()
  assert sweep.run_sweep(runs, note_target, out=out) == {}
  assert "sweep: 0 of 3 run(s) to run" in out.getvalue()
