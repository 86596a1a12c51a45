"""The benchmarks' command-line flags: argparse, with absl's spellings where a benchmark takes a
list or a boolean, so ``--sizes=tiny,mini``, ``--torch``, ``--notorch`` and ``--torch=false``
all work as they do for ``bert_jax``'s commands."""

from __future__ import annotations

import argparse

_TRUE, _FALSE = ("true", "t", "1", "yes", "y"), ("false", "f", "0", "no", "n")


def parser(description: str | None) -> argparse.ArgumentParser:
  """A parser whose help shows ``description`` (a module's docstring) as it is written."""
  return argparse.ArgumentParser(
    description=description, formatter_class=argparse.RawDescriptionHelpFormatter
  )


def _bool(text: str) -> bool:
  if text.lower() in _TRUE:
    return True
  if text.lower() in _FALSE:
    return False
  raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_bool(p: argparse.ArgumentParser, name: str, default: bool, help: str) -> None:
  """``--name``, ``--name=true|false`` and ``--noname``."""
  p.add_argument(
    f"--{name}", nargs="?", const=True, default=default, type=_bool, metavar="BOOL", help=help
  )
  p.add_argument(f"--no{name}", dest=name, action="store_false", help=argparse.SUPPRESS)


def add_list(p: argparse.ArgumentParser, name: str, default: list, help: str, type=str) -> None:
  """``--name=a,b,c``: a comma-separated list of ``type`` (empty: [])."""

  def parse(text: str) -> list:
    return [type(v.strip()) for v in text.split(",") if v.strip()]

  p.add_argument(f"--{name}", default=list(default), type=parse, help=f"{help} (comma-separated)")
