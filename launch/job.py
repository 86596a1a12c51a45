"""What a launch starts: one bert_jax entry point, its config file, overrides and workdir.

A :class:`Job` is target-independent. Every target (local, TPU VM, SLURM, Kubernetes) turns
it into the same command line, ``python -m <entry> --config=<file>:<arg> --workdir=<dir>
--config.<key>=<value> ...``, and adds only the multi-process coordinates of its platform.

Before anything starts, :func:`resolve_config` loads the config file exactly as the entry point
will and applies every override to the locked ``ConfigDict``: a key that does not exist or a
value of the wrong type is a :class:`LaunchError` naming the key (and where it came from).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import datetime
import importlib.util
import json
import os
import pathlib
import shlex
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from bert_jax.config_files import add_import_root

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

# Short names for the entry points; anything else is taken as a module path.
ENTRY_POINTS = {
  "pretrain": "bert_jax.pretrain",
  "finetune": "bert_jax.finetune",
  "evaluate": "bert_jax.evaluate",
  "probe": "bert_jax.probe",
}

# The environment variables a multi-process job reads (bert_jax.parallel reads the same names).
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


class LaunchError(ValueError):
  """A launch, sweep or target setting that is wrong; raised before anything starts."""


def format_value(value: Any) -> str:
  """A Python value as ``ml_collections.config_flags`` parses it back from the command line."""
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, float):
    return repr(value)
  return str(value)


@dataclasses.dataclass(frozen=True)
class Job:
  """One run of a bert_jax entry point.

  Attributes:
    entry: "pretrain", "finetune", "evaluate" or a module path run with ``python -m``.
    config: the config spec, ``path/to/config.py[:arg]``; empty for entry points without one.
    workdir: the run directory (local path or gs://).
    overrides: (dotted key, value) pairs, passed as ``--config.<key>=<value>``.
    extra_args: further flags passed through verbatim (``--config.*`` ones are validated too).
    python: the interpreter on the machine that runs the job.
  """

  entry: str
  config: str
  workdir: str
  overrides: tuple[tuple[str, Any], ...] = ()
  extra_args: tuple[str, ...] = ()
  python: str = "python3"

  @property
  def module(self) -> str:
    return ENTRY_POINTS.get(self.entry, self.entry)

  def argv(self) -> list[str]:
    args = [self.python, "-m", self.module]
    if self.config:
      args.append(f"--config={self.config}")
    args.append(f"--workdir={self.workdir}")
    args += [f"--config.{k}={format_value(v)}" for k, v in self.overrides]
    return args + list(self.extra_args)

  def shell_command(self) -> str:
    return shlex.join(self.argv())

  def replace(self, **changes: Any) -> Job:
    return dataclasses.replace(self, **changes)


def load_config(spec: str) -> ml_collections.ConfigDict:
  """Loads ``path.py[:arg]`` the way ``config_flags.DEFINE_config_file`` does."""
  path, _, arg = spec.partition(":")
  file = pathlib.Path(path)
  if not file.is_file():
    raise LaunchError(f"config file {path!r} (from {spec!r}) does not exist")
  add_import_root(file)
  module_spec = importlib.util.spec_from_file_location(f"_launch_config_{file.stem}", file)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except Exception as e:  # a broken config file: say which
    raise LaunchError(f"{path}: cannot be loaded: {type(e).__name__}: {e}") from e
  if not hasattr(module, "get_config"):
    raise LaunchError(f"{path}: has no get_config function")
  try:
    return module.get_config(arg) if arg else module.get_config()
  except Exception as e:
    raise LaunchError(f"{path}: get_config({arg!r}) failed: {type(e).__name__}: {e}") from e


def apply_overrides(
  config: ml_collections.ConfigDict, overrides: Sequence[tuple[str, Any]], source: str = "overrides"
) -> ml_collections.ConfigDict:
  """A copy of ``config`` with dotted-key overrides applied; unknown keys -> LaunchError."""
  config = copy.deepcopy(config)  # keeps placeholders' types and the lock
  config.lock()
  for key, value in overrides:
    node, parts = config, key.split(".")
    for i, part in enumerate(parts):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        known = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
        where = ".".join(parts[:i]) or "the config"
        raise LaunchError(
          f"{source}: config key {key!r} does not exist ({part!r} is not in "
          f"{where}; keys there: {known})"
        )
      if i < len(parts) - 1:
        node = node[part]
    try:
      node[parts[-1]] = value
    except (TypeError, ValueError, KeyError, AttributeError) as e:
      raise LaunchError(f"{source}: cannot set config key {key!r} to {value!r}: {e}") from e
  return config


def config_overrides_in_args(extra_args: Sequence[str]) -> list[tuple[str, str]]:
  """The ``--config.key=value`` flags among pass-through args, as (key, raw value) pairs."""
  out = []
  for arg in extra_args:
    if arg.startswith("--config.") and "=" in arg:
      key, _, value = arg[len("--config.") :].partition("=")
      out.append((key, value))
  return out


def parse_value(config: ml_collections.ConfigDict, key: str, raw: str) -> Any:
  """A command-line string as the type of the config field ``key`` (as config_flags parses)."""
  *parents, last = key.split(".")
  node = config
  for part in parents:
    node = node[part]
  kind = node.get_type(last)
  if kind is bool:
    if raw.lower() not in ("true", "false", "1", "0"):
      raise ValueError(f"{raw!r} is not a boolean")
    return raw.lower() in ("true", "1")
  if kind in (int, float, str):
    return kind(raw)
  try:
    return ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    return raw


def resolve_config(job: Job, source: str = "overrides") -> ml_collections.ConfigDict | None:
  """The job's config with its overrides applied, checked before anything starts.

  Pass-through ``--config.key=value`` flags are applied too (parsed as the field's type), so
  the resolved config recorded in launch.json is the one the entry point will run with.
  """
  if not job.config:
    return None
  config = apply_overrides(load_config(job.config), job.overrides, source)
  passed = []
  for key, raw in config_overrides_in_args(job.extra_args):
    node = config
    for part in key.split("."):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        raise LaunchError(f"command line: config key {key!r} does not exist in {job.config}")
      node = node[part]
    try:
      passed.append((key, parse_value(config, key, raw)))
    except (TypeError, ValueError) as e:
      raise LaunchError(f"command line: --config.{key}={raw}: {e}") from e
  return apply_overrides(config, passed, "command line")


def git_state(repo: pathlib.Path = REPO_ROOT) -> dict[str, Any]:
  """The commit the code is at, and whether the working tree has uncommitted changes."""

  def git(*args):
    return subprocess.run(
      ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
    )

  head = git("rev-parse", "HEAD")
  if head.returncode:
    return {"commit": None, "dirty": None}
  return {"commit": head.stdout.strip(), "dirty": bool(git("status", "--porcelain").stdout.strip())}


def launch_record(
  job: Job,
  config: ml_collections.ConfigDict | None,
  target: str,
  target_settings: Mapping[str, Any] | None = None,
  num_processes: int = 1,
) -> dict[str, Any]:
  """What ``launch.json`` holds: the command, the resolved config and the code's commit."""
  return {
    "entry": job.module,
    "argv": job.argv(),
    "config_spec": job.config,
    "overrides": {k: v for k, v in job.overrides},
    "config": json.loads(config.to_json_best_effort()) if config is not None else None,
    "workdir": job.workdir,
    "target": target,
    "target_settings": dict(target_settings or {}),
    "num_processes": num_processes,
    "git": git_state(),
    "launched_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "launched_from": socket.gethostname(),
  }


def _previous_name(text: str) -> str:
  """``launch.<launched_at>.json`` for an earlier record (its time, or 'previous')."""
  try:
    stamp = json.loads(text).get("launched_at") or "previous"
  except ValueError:
    stamp = "previous"
  return "launch." + "".join(c if c.isalnum() or c in "-+" else "-" for c in stamp) + ".json"


def write_launch_record(workdir: str, record: Mapping[str, Any]) -> str:
  """Writes ``launch.json`` into the workdir (local or gs://); returns its path.

  A ``launch.json`` from an earlier launch of the same workdir (a resumed run) is kept, renamed
  ``launch.<its launched_at>.json``.
  """
  text = json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"
  if "://" in workdir:
    import tensorflow as tf  # noqa: PLC0415 (gs:// only)

    gfile, join = tf.io.gfile, lambda *p: "/".join(x.rstrip("/") for x in p)
  else:
    gfile, join = None, os.path.join
  path = join(workdir, "launch.json")
  if gfile is None:
    os.makedirs(workdir, exist_ok=True)
    if os.path.exists(path):
      with open(path) as f:
        os.replace(path, join(workdir, _previous_name(f.read())))
    with open(path, "w") as f:
      f.write(text)
    return path
  gfile.makedirs(workdir)
  if gfile.exists(path):
    with gfile.GFile(path) as f:
      gfile.rename(path, join(workdir, _previous_name(f.read())), overwrite=True)
  with gfile.GFile(path, "w") as f:
    f.write(text)
  return path
