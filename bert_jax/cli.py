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

The traceback is printed too (before the line) with ``--verbose_errors`` (or absl's
``-v 1``/``--verbosity=1`` and above). Anything else (a bug) propagates with its traceback.

Unknown config keys are found while absl parses the flags, before ``main`` runs:
ml_collections' config flag resolves each ``--config.a.b`` override against the loaded config
and raises a bare ``AttributeError`` (``KeyError`` for an unknown parent) that absl does not
turn into a flag error, and a config file that cannot be read is deferred into an object that
raises on first use. ``run`` therefore parses the flags itself (absl's ``flags_parser`` hook)
and reports both there.
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from bert_jax import hugepages
from bert_jax.config_files import add_config_import_roots

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


def run(
  main: Callable[[list[str]], Any],
  prog: str,
  user_errors: Sequence[type[BaseException]] = (),
) -> None:
  """Runs ``main`` under ``absl.app.run``, reporting user errors as ``prog: error: ...``.

  Started as an entry point (``python -m bert_jax.<name>``, ``bert-jax-<name>``), the process
  first re-executes itself once with huge pages for glibc's malloc where that helps
  (:mod:`bert_jax.hugepages`; ``BERT_JAX_HUGEPAGES=0`` opts out). ``main`` runs with Orbax's and
  jax's INFO chatter kept off the console (``quiet_library_logs``).
  """
  if hugepages.is_entry_point_command(sys.orig_argv):
    hugepages.restart_with_hugepages()
  if _VERBOSE_FLAG not in flags.FLAGS:
    flags.DEFINE_bool(
      _VERBOSE_FLAG, False, "On a user error, print the traceback as well as the one-line error."
    )
  errors = tuple(USER_ERRORS) + tuple(user_errors)
  app.run(
    functools.partial(_call_main, main, prog, errors),
    flags_parser=functools.partial(parse_flags, prog),
  )


def parse_flags(prog: str, argv: list[str]) -> list[str]:
  """Parses ``argv`` into absl's FLAGS; a bad flag or config exits with one line, status 2."""
  add_config_import_roots(argv)  # a config file's ``from configs import ...``, run from anywhere
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    _fail(prog, e, USAGE_EXIT, _verbose_in(argv), hint=True)
  except (AttributeError, KeyError) as e:  # ml_collections: an override of a key not in config
    key = str(e).strip("\"'")
    override = _config_override(argv, key)
    if override is None:
      _fail(prog, e, USAGE_EXIT, _verbose_in(argv), hint=True)
    flag_name, path, arg = override
    message = f"unknown config key {path!r} (from {arg}): --{flag_name}'s file defines no such key"
    _fail(prog, e, USAGE_EXIT, _verbose_in(argv), message=message, hint=True)
  except Exception as e:  # the config file is user code: any error in it is the input's
    message = f"{type(e).__name__}: {one_line(e)}"
    _fail(prog, e, USAGE_EXIT, _verbose_in(argv), message=message, hint=True)
  for name in list(flags.FLAGS):
    flag = flags.FLAGS[name]
    if isinstance(flag.parser, config_flags.config_flags.ConfigFileFlagParser):
      try:
        flag.value.keys()  # a config file that failed to load raises its deferred error here
      except OSError as e:
        cause = e.__cause__ if e.__cause__ is not None else e
        message = f"--{name}={flag.serialize().partition('=')[2]}: {_last_line(str(cause))}"
        _fail(prog, e, USAGE_EXIT, _verbose_parsed(), message=message, hint=True)
      except AttributeError:  # a config that is not a ConfigDict: nothing to check
        pass
  return rest


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


def _call_main(main, prog, errors, argv):
  quiet_library_logs()
  try:
    return main(argv)
  except app.UsageError as e:
    _fail(prog, e, USAGE_EXIT, _verbose_parsed(), hint=True)
  except errors as e:
    _fail(prog, e, ERROR_EXIT, _verbose_parsed())


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
  hint: bool = False,
) -> NoReturn:
  if verbose:
    traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
  line = f"{prog}: error: {message if message is not None else one_line(error)}"
  if hint:
    line += " (--helpshort lists the flags)"
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
