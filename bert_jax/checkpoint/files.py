"""File primitives every writer and JSON reader of bert_jax uses: nothing is ever half-written.

  write_json(path, obj)           JSON, atomically (a temp file beside it, then rename)
  read_json(path)                 JSON; a missing or malformed file is an error naming it
  atomic_write(path, write)       any file: ``write(tmp_path)`` fills a temp file, then rename
  with replace_dir(out, overwrite) as tmp:
    ...write into tmp...          a sibling directory that replaces ``out`` when the block ends

A temp file or directory is removed when its write fails. Files and directories are created
with the modes the umask gives (as ``open``/``mkdir`` would), not the 0600/0700 of ``tempfile``.
``write_json`` and ``read_json`` take local paths or any ``etils.epath`` path (gs://...).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from etils import epath


def _sibling(path: str | os.PathLike, tag: str) -> str:
  """A unique hidden name beside ``path`` (same directory, hence same filesystem: rename works)."""
  head, name = os.path.split(os.fspath(path).rstrip("/"))
  return os.path.join(head, f".{name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def write_json(path: str | os.PathLike, obj: Any) -> None:
  """Writes ``obj`` as indented, key-sorted JSON atomically (temp file, then rename)."""
  path = epath.Path(path)
  tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
  try:
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)
  except BaseException:
    if tmp.exists():
      tmp.unlink()
    raise


def read_json(path: str | os.PathLike) -> Any:
  """The JSON in ``path``. FileNotFoundError / ValueError naming the file when it is missing,
  not UTF-8 text or not valid JSON."""
  path = epath.Path(path)
  try:
    text = path.read_text()
  except FileNotFoundError as e:
    raise FileNotFoundError(f"{path}: no such file") from e
  except UnicodeDecodeError as e:
    raise ValueError(
      f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); expected JSON"
    ) from e
  try:
    return json.loads(text)
  except ValueError as e:
    raise ValueError(f"{path}: not valid JSON: {e}") from e


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
  """``write(tmp)`` creates a temp file beside local ``path``; it then replaces ``path``."""
  tmp = _sibling(path, "tmp")
  try:
    write(tmp)
    os.replace(tmp, path)
  except BaseException:
    if os.path.lexists(tmp):
      os.unlink(tmp)
    raise


def ensure_replaceable(out_dir: str | os.PathLike, overwrite: bool = False) -> None:
  """FileExistsError when ``replace_dir(out_dir, overwrite)`` would refuse: ``out_dir`` is a file,
  or a non-empty directory and not ``overwrite``. For checking before slow work."""
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise FileExistsError(f"{out_dir} exists and is not a directory")
  if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
    raise FileExistsError(f"{out_dir} exists and is not empty (pass overwrite=True)")


@contextlib.contextmanager
def replace_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> Iterator[str]:
  """Yields an empty directory beside local ``out_dir`` that takes its place when the block
  succeeds: afterwards ``out_dir`` holds exactly what was written there (nothing stale from
  before). On any error the temp directory is removed and ``out_dir`` is left as it was.

  A non-empty ``out_dir`` is a FileExistsError unless ``overwrite`` (``ensure_replaceable``,
  checked before anything is written). ``overwrite`` replaces the directory as a whole: the old
  one is renamed aside, the new one renamed into place (the old one is put back if that
  fails), then the old one is removed.
  """
  out_dir = os.path.abspath(out_dir)
  ensure_replaceable(out_dir, overwrite)
  os.makedirs(os.path.dirname(out_dir), exist_ok=True)
  tmp = _sibling(out_dir, "new")
  os.mkdir(tmp)  # mode 0777 & ~umask, like any directory the user creates
  try:
    yield tmp
    old = _sibling(out_dir, "old") if os.path.exists(out_dir) else None
    if old:
      os.rename(out_dir, old)
    try:
      os.rename(tmp, out_dir)
    except BaseException:
      if old:
        os.rename(old, out_dir)
      raise
    if old:
      shutil.rmtree(old, ignore_errors=True)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
