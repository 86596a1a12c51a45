"""One way every entry point reports a user error: ``prog: error: <message>``, one line.

  def main(argv): ...
  if __name__ == "__main__":
    cli.run(main, prog="pretrain", user_errors=(NonFiniteLossError,))

``run`` wraps ``absl.app.run``. A user error is printed as one line on stderr, naming the file,
line, key or value, and the process exits with

* status 2 for a usage error: an unknown or malformed flag, a missing required flag, a flag
  value that does not parse, an unknown ``--config.<key>`` (the configs are locked), a config
  file that does not load (missing file, unknown preset), or an ``app.UsageError`` raised by
  ``main``;
* status 1 for any other user error raised by ``main``: ``ValueError`` (and the input errors
  derived from it), ``FileNotFoundError``, ``FileExistsError``, ``NotADirectoryError``,
  ``IsADirectoryError``, ``PermissionError``, ``KeyError`` (a config key named in an override)
  and the entry point's own ``user_errors``.

* status 130 after a Ctrl-C (SIGINT), at any moment from the first second: one line
  ``prog: interrupted (Ctrl-C): ...``; a training loop saves a checkpoint first, elsewhere the
  work stops where it is (``bert_jax.interrupts``; a second Ctrl-C exits at once);
* status 143 when SIGTERM stopped a training loop (a preemption): it saved a checkpoint, then
  one line ``prog: preempted (SIGTERM): saved step N; re-run to resume``;
* status 3 when a launcher's restart cannot help (``bert_jax.train.attempts``: the attempts
  before made no progress), one line ``prog: no progress: ...``, before any work.

The traceback is printed too (before the line) with ``--verbose_errors`` (or absl's
``-v 1``/``--verbosity=1`` and above). Anything else (a bug) propagates with its traceback.

Unknown config keys are found while absl parses the flags, before ``main`` runs:
ml_collections' config flag resolves each ``--config.a.b`` override against the loaded config
and raises a bare ``AttributeError`` (``KeyError`` for an unknown parent) that absl does not
turn into a flag error, and a config file that cannot be read is deferred into an object that
raises on first use. ``run`` therefore parses the flags itself (absl's ``flags_parser`` hook)
and reports both there, with ml_collections' "did you mean" suggestion on the same line:

  finetune: error: unknown config key 'lerning_rate' (from --config.lerning_rate=1e-5): did you
  mean 'learning_rate'? (--config_keys lists them)

An entry point with a config file flag also takes ``--config_keys``: it prints every key of the
loaded config (overrides applied) with its value, one ``key = value`` a line, and exits 0; the
other required flags may be left out.

Hosts without a TPU. With the ``tpu`` extra installed (libtpu), JAX probes for a TPU whenever
its backends start, and libtpu prints a multi-line "Failed to find host bounds ... E0000 ...
INVALID_ARGUMENT ... Source Location Trace" report on a host that has none: harmless, but it
reads like a crash. ``run`` therefore sets ``JAX_PLATFORMS=cpu`` (and JAX's ``jax_platforms``)
before JAX starts its backends where that is what JAX would end up with anyway: libtpu is
installed, ``JAX_PLATFORMS`` is unset or empty, and the host shows no accelerator: no TPU
(``/dev/accel*``, ``/dev/vfio``, a TPU's PCI id) and no GPU (``/dev/nvidia0``,
``/dev/nvidiactl``, ``/dev/dxg``, ``/dev/kfd``). A TPU VM, a GPU host, ``JAX_FORCE_TPU_INIT``
or ``TPU_ACCELERATOR_TYPE`` leave JAX to choose as it does by default (``platforms_for_host``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import ml_collections
from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from bert_jax import hugepages
from bert_jax.accelerators import accelerator_on_host
from bert_jax.config_files import add_config_import_roots
from bert_jax.interrupts import (
  INTERRUPTED_EXIT,
  NO_PROGRESS_EXIT,
  PREEMPTED_EXIT,
  InterruptHandler,
  NoProgressError,
)

USAGE_EXIT = 2
ERROR_EXIT = 1

# Errors that mean "the input is wrong", not "the program is wrong".
USER_ERRORS: tuple[type[BaseException], ...] = (
  ValueError,
  FileNotFoundError,
  FileExistsError,
  NotADirectoryError,
  IsADirectoryError,
  PermissionError,
  KeyError,
)
_VERBOSE_FLAG = "verbose_errors"
_CONFIG_KEYS_FLAG = "config_keys"
HELP_HINT = "(--helpshort lists the flags)"
CONFIG_KEYS_HINT = f"(--{_CONFIG_KEYS_FLAG} lists them)"

# What JAX's own discovery reads to find an accelerator (jax/_src/hardware_utils.py): TPU device
# files (/dev/accel* on v2-v4, /dev/vfio on v5e and later), Google's PCI vendor with a TPU's
# device id, and the device files of NVIDIA (also WSL2's /dev/dxg) and AMD GPUs.


def run(
  main: Callable[[list[str]], Any],
  prog: str,
  user_errors: Sequence[type[BaseException]] = (),
) -> None:
  """Runs ``main`` under ``absl.app.run``, reporting user errors as ``prog: error: ...``.

  Started as an entry point (``python -m bert_jax.<name>``, ``bert-jax-<name>``), the process
  first re-executes itself once with huge pages for glibc's malloc where that helps
  (:mod:`bert_jax.hugepages`; ``BERT_JAX_HUGEPAGES=0`` opts out). ``main`` runs with Orbax's and
  jax's INFO chatter kept off the console (``quiet_library_logs``), and on a host without an
  accelerator JAX is told to start its CPU backend only (``skip_absent_accelerators``), so that
  an installed libtpu does not report the missing TPU.
  """
  if hugepages.is_entry_point_command(sys.orig_argv):
    hugepages.restart_with_hugepages()
  interrupts = InterruptHandler(prog)
  with interrupts.installed():
    try:
      _run(main, prog, user_errors, interrupts)
    except KeyboardInterrupt:
      _exit_interrupted(prog)


def _run(main, prog, user_errors, interrupts: InterruptHandler) -> None:
  skip_absent_accelerators()
  if _VERBOSE_FLAG not in flags.FLAGS:
    flags.DEFINE_bool(
      _VERBOSE_FLAG, False, "On a user error, print the traceback as well as the one-line error."
    )
  if _config_flag_names() and _CONFIG_KEYS_FLAG not in flags.FLAGS:
    flags.DEFINE_bool(
      _CONFIG_KEYS_FLAG,
      False,
      "Print every key of the config (with --config.<key>=... overrides applied) and its value, "
      "then exit.",
    )
    # Listed by --helpshort, which shows the main module's key flags.
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[_CONFIG_KEYS_FLAG])
  errors = tuple(USER_ERRORS) + tuple(user_errors)
  app.run(
    functools.partial(_call_main, main, prog, errors, interrupts),
    flags_parser=functools.partial(parse_flags, prog),
  )


def parse_flags(prog: str, argv: list[str]) -> list[str]:
  """Parses ``argv`` into absl's FLAGS; a bad flag or config exits with one line, status 2.
  With ``--config_keys``, prints the config's keys and exits 0."""
  add_config_import_roots(argv)  # a config file's ``from configs import ...``, run from anywhere
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    if flags.FLAGS.is_parsed() and _config_keys_requested():  # only a validator failed: the
      _print_config_keys(prog)  # values are parsed, e.g. a required --workdir left out
    _fail(prog, e, USAGE_EXIT, _verbose_in(argv), hint=HELP_HINT)
  except (AttributeError, KeyError) as e:  # ml_collections: an override of a key not in config
    key, suggestion = _missing_key(e)
    override = _config_override(argv, key)
    if override is None:
      _fail(prog, e, USAGE_EXIT, _verbose_in(argv), hint=HELP_HINT)
    flag_name, path, arg = override
    message = f"unknown config key {path!r} (from {arg}): "
    if suggestion:
      parts = path.split(".")
      index = parts.index(key)
      suggested = ".".join([*parts[:index], suggestion, *parts[index + 1 :]])
      message += f"did you mean {suggested!r}?"
    else:
      message += f"--{flag_name}'s file defines no such key"
    _fail(prog, e, USAGE_EXIT, _verbose_in(argv), message=message, hint=CONFIG_KEYS_HINT)
  except Exception as e:  # the config file is user code: any error in it is the input's
    message = f"{type(e).__name__}: {one_line(e)}"
    _fail(prog, e, USAGE_EXIT, _verbose_in(argv), message=message, hint=HELP_HINT)
  for name in _config_flag_names():
    flag = flags.FLAGS[name]
    try:
      flag.value.keys()  # a config file that failed to load raises its deferred error here
    except OSError as e:
      cause = e.__cause__ if e.__cause__ is not None else e
      message = f"--{name}={flag.serialize().partition('=')[2]}: {_last_line(str(cause))}"
      _fail(prog, e, USAGE_EXIT, _verbose_parsed(), message=message, hint=HELP_HINT)
    except AttributeError:  # a config that is not a ConfigDict (or none given): nothing to check
      pass
  if _config_keys_requested():
    _print_config_keys(prog)
  return rest


def _config_flag_names() -> list[str]:
  """The names of the ``config_flags.DEFINE_config_file`` flags defined."""
  return [
    name
    for name in list(flags.FLAGS)
    if isinstance(flags.FLAGS[name].parser, config_flags.config_flags.ConfigFileFlagParser)
  ]


def _missing_key(error: BaseException) -> tuple[str, str | None]:
  """(the key, ml_collections' "did you mean" suggestion or None) of a failed override.

  ml_collections raises ``AttributeError(KeyError("'key'\\nDid you mean \"k\" instead of
  \"key\"?"))`` for a key under a known parent and a bare ``KeyError`` of the same text for an
  unknown parent."""
  while len(error.args) == 1 and isinstance(error.args[0], BaseException):
    error = error.args[0]
  text = error.args[0] if len(error.args) == 1 and isinstance(error.args[0], str) else str(error)
  first = text.strip().splitlines()[0] if text.strip() else ""
  match = re.match(r'Key "([^"]+)" does not exist', first)
  key = match.group(1) if match else first.strip("\"' ")
  suggestion = re.search(r'Did you mean "([^"]+)" instead of', text)
  return key, suggestion.group(1) if suggestion else None


def _config_keys_requested() -> bool:
  fl = flags.FLAGS
  return _CONFIG_KEYS_FLAG in fl and bool(fl[_CONFIG_KEYS_FLAG].value)


def config_lines(config, prefix: str = "") -> list[str]:
  """``key = value`` for every leaf of ``config`` (nested keys dotted, values as Python writes
  them; an unset placeholder as ``None (<type>)``), sorted by key."""
  lines = []
  for key in sorted(config.keys(), key=str):
    value = config[key]
    if isinstance(value, ml_collections.ConfigDict) and len(value):
      lines.extend(config_lines(value, f"{prefix}{key}."))
      continue
    shown = repr(value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value)
    if value is None:
      kind = config.get_type(key)
      if kind is not type(None):
        shown += f" ({kind.__name__})"
    lines.append(f"{prefix}{key} = {shown}")
  return lines


def _print_config_keys(prog: str) -> NoReturn:
  """Prints each config flag's keys and values (``--config_keys``) and exits 0; a config flag
  left out is a one-line usage error."""
  out = []
  for name in _config_flag_names():
    flag = flags.FLAGS[name]
    if flag.value is None:
      _fail(
        prog,
        ValueError(name),
        USAGE_EXIT,
        False,
        message=f"--{_CONFIG_KEYS_FLAG} lists the keys of --{name}: give --{name}=<file>",
        hint=HELP_HINT,
      )
    lines = config_lines(flag.value)
    source = flag.serialize().partition("=")[2]
    out.append(f"--{name}={source}: {len(lines)} keys; override with --{name}.<key>=<value>")
    out.extend(f"  {line}" for line in lines)
  try:
    print("\n".join(out), flush=True)
  except BrokenPipeError:  # e.g. piped into `head`: what was read is all that was wanted
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
  sys.exit(0)


class _LibraryInfoFilter:
  """Drops INFO (and lower) records logged from inside noisy libraries (Orbax's per-save
  chatter, jax's backend discovery); warnings and errors still pass."""

  def __init__(self, markers: tuple[str, ...]):
    self.markers = markers

  def filter(self, record) -> bool:
    if record.levelno > 20:
      return True
    return not any(m in record.pathname for m in self.markers)


def quiet_library_logs(markers: tuple[str, ...] = ("orbax", "xla_bridge")) -> None:
  """Keeps the console to bert_jax's own lines; every entry point's ``main`` runs with it."""
  handler = absl_logging.get_absl_handler()
  if not any(isinstance(f, _LibraryInfoFilter) for f in handler.filters):
    handler.addFilter(_LibraryInfoFilter(markers))


def platforms_for_host(
  environ: Mapping[str, str], root: str = "/", libtpu_installed: bool | None = None
) -> str | None:
  """The ``JAX_PLATFORMS`` value to start JAX with, or None to leave JAX to choose.

  "cpu" where JAX's default would probe libtpu on a host without a TPU and then fall back to
  the CPU anyway: libtpu is installed, ``JAX_PLATFORMS`` is unset or empty, neither
  ``JAX_FORCE_TPU_INIT`` nor ``TPU_ACCELERATOR_TYPE`` is set, and ``root`` shows neither a TPU
  nor a GPU (``bert_jax.accelerators.accelerator_on_host``)."""
  if environ.get("JAX_PLATFORMS", "").strip():
    return None
  if "JAX_FORCE_TPU_INIT" in environ or environ.get("TPU_ACCELERATOR_TYPE"):
    return None
  if libtpu_installed is None:
    libtpu_installed = bool(environ.get("TPU_LIBRARY_PATH")) or (
      importlib.util.find_spec("libtpu") is not None
    )
  if not libtpu_installed or accelerator_on_host(environ, root) is not None:
    return None
  return "cpu"


def skip_absent_accelerators() -> None:
  """Starts JAX on the CPU alone where ``platforms_for_host`` says so: sets ``JAX_PLATFORMS``
  (for this process and the processes it starts) and, when JAX is already imported and its
  backends not chosen by the user, ``jax_platforms``. Call it before JAX starts its backends
  (the first device, array or compilation); later it changes nothing."""
  platforms = platforms_for_host(os.environ)
  if platforms is None:
    return
  os.environ["JAX_PLATFORMS"] = platforms
  jax = sys.modules.get("jax")
  if jax is not None and not getattr(jax.config, "jax_platforms", None):
    jax.config.update("jax_platforms", platforms)


def _call_main(main, prog, errors, interrupts, argv):
  quiet_library_logs()
  try:
    result = main(argv)
  except app.UsageError as e:
    _fail(prog, e, USAGE_EXIT, _verbose_parsed(), hint=HELP_HINT)
  except NoProgressError as e:
    print(f"{prog}: {one_line(e)}", file=sys.stderr, flush=True)
    sys.exit(NO_PROGRESS_EXIT)
  except errors as e:
    _fail(prog, e, ERROR_EXIT, _verbose_parsed())
  except KeyboardInterrupt:
    _exit_interrupted(prog)
  if interrupts.count:  # a training loop took the Ctrl-C: it saved, then stopped
    print(
      f"{prog}: interrupted (Ctrl-C): stopped after saving a checkpoint; re-run to resume",
      file=sys.stderr,
      flush=True,
    )
    sys.exit(INTERRUPTED_EXIT)
  if interrupts.stopped_at is not None:  # SIGTERM stopped a training loop: it saved, then stopped
    print(
      f"{prog}: preempted (SIGTERM): saved step {interrupts.stopped_at}; re-run to resume",
      file=sys.stderr,
      flush=True,
    )
    sys.exit(PREEMPTED_EXIT)
  return result


def _exit_interrupted(prog: str) -> NoReturn:
  """One line and status 130 for a Ctrl-C that stopped the work where it was."""
  print(f"{prog}: interrupted (Ctrl-C): stopped", file=sys.stderr, flush=True)
  sys.exit(INTERRUPTED_EXIT)


def one_line(error: BaseException) -> str:
  """The error's message on one line, naming the file/key/value the exception carries."""
  if isinstance(error, OSError) and error.filename is not None and error.strerror:
    message = f"{error.strerror}: {error.filename}"
    if error.filename2 is not None:
      message += f" -> {error.filename2}"
    return message
  if len(error.args) == 1 and isinstance(error.args[0], str):
    message = error.args[0]
    if isinstance(error, KeyError) and message and " " not in message:
      message = f"key {message!r} not found"
  else:
    message = str(error) or type(error).__name__
  if "Traceback (most recent call last)" in message:  # ml_collections: an error in a config file
    head = message.splitlines()[0]
    prefix = head.partition(": Error whilst")[0] + ": " if head.startswith("flag --") else ""
    return prefix + _last_line(message)
  return " ".join(line.strip() for line in message.splitlines() if line.strip())


def _last_line(text: str) -> str:
  """The last non-empty line of a traceback or report, without an ``XError: `` prefix."""
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  if not lines:
    return text
  head, sep, tail = lines[-1].partition(": ")
  if sep and head.isidentifier() and (head.endswith("Error") or head.endswith("Exception")):
    return tail
  return lines[-1]


def _fail(
  prog: str,
  error: BaseException,
  code: int,
  verbose: bool,
  message: str | None = None,
  hint: str = "",
) -> NoReturn:
  if verbose:
    traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
  line = f"{prog}: error: {message if message is not None else one_line(error)}"
  if hint:
    line += f" {hint}"
  print(line, file=sys.stderr, flush=True)
  sys.exit(code)


def _config_override(argv: list[str], key: str) -> tuple[str, str, str] | None:
  """(flag name, key path, argument) of the ``--<flag>.<path>`` override that names ``key``."""
  for arg in argv[1:]:
    if not arg.startswith("--"):
      continue
    name, dot, path = arg[2:].partition("=")[0].partition(".")
    if dot and name in flags.FLAGS and key in path.split("."):
      return name, path, arg
  return None


def _verbose_in(argv: list[str]) -> bool:
  """``--verbose_errors`` in an argv that did not parse."""
  return any(
    a in (f"--{_VERBOSE_FLAG}", f"--{_VERBOSE_FLAG}=true", f"--{_VERBOSE_FLAG}=1") for a in argv
  )


def _verbose_parsed() -> bool:
  fl = flags.FLAGS
  verbose = _VERBOSE_FLAG in fl and fl[_VERBOSE_FLAG].value
  return bool(verbose) or ("verbosity" in fl and (fl["verbosity"].value or 0) >= 1)
