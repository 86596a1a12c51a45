"""Output paths that cannot destroy the inputs: checked before any work, one line naming both.

  check_outputs({"--output": out}, {"--workdir": workdir}, replaced=("--output",))
  check_outputs({"--output_file": out, "--summary_file": summary}, {"--input_file": text})
  check_outputs({"--output_file": out}, {"--checkpoint": ckpt}, sealed=("--checkpoint",))
  check_parent("--output_file", out)      # its folder exists (and is a folder)
  input_paths("data/*.txt,extra.txt")     # the files a comma-separated list of globs names
  check_workdir("--workdir", workdir, config)   # a run's workdir against its config's inputs

``check_outputs`` compares resolved real paths (symlinks, ``..``, relative paths) and raises
ValueError, one line naming both flags and both paths as given, when

* an output is an input (the same file or folder);
* an output contains an input (an output folder above an input file or folder);
* an output in ``replaced`` (a folder the run replaces as a whole, or a run's workdir) lies
  inside an input folder;
* an output lies inside a ``sealed`` input: a checkpoint, whose folder (``checkpoint_folders``:
  the directory, a TF checkpoint prefix's folder, the workdir of a saved step) a run reads
  as a whole, so no output may be written anywhere in it;
* two outputs are the same path.

An input that does not exist stands for the files it is the prefix of as well (a TF checkpoint
``bert_model.ckpt``: ``.index``, ``.data-*``). Paths with a scheme (``gs://...``) and empty
values are skipped: they are not local files.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Union

PathLike = Union[str, os.PathLike]
Paths = Union[PathLike, Sequence[PathLike], None]


def _local(path: PathLike | None) -> bool:
  return bool(path) and "://" not in os.fspath(path)


def _real(path: PathLike) -> str:
  return os.path.realpath(os.path.expanduser(os.fspath(path)))


def _within(inner: str, outer: str) -> bool:
  """``inner`` lies strictly inside ``outer`` (both real paths)."""
  return inner != outer and os.path.commonpath([inner, outer]) == outer


def _each(paths: Paths) -> Iterable[str]:
  if paths is None or isinstance(paths, (str, os.PathLike)):
    paths = [paths] if paths else []
  for p in paths:
    if _local(p):
      p = os.fspath(p)
      yield p
      if not os.path.exists(p):  # a TF checkpoint prefix: its files (.index, .data-*, .meta)
        yield from sorted(glob.glob(glob.escape(p) + ".*"))


def checkpoint_folders(path: PathLike | None) -> list[str]:
  """The folders a checkpoint ``path`` is read from as a whole: the directory itself (a
  TF checkpoint prefix or a file: its folder), and for one saved step of a run
  (``<workdir>/checkpoints/<step>``) the workdir (its vocabulary and model config are read
  too)."""
  if not _local(path):
    return []
  path = os.fspath(path).rstrip(os.sep) or os.sep
  if not os.path.exists(path) and not glob.glob(glob.escape(path) + ".*"):
    return []  # no checkpoint there (nor a TF prefix's files): its loading reports that
  folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
  out = [folder]
  name, parent = os.path.basename(_real(folder)), os.path.dirname(_real(folder))
  if name.isdigit() and os.path.basename(parent) == "checkpoints":
    out.append(os.path.dirname(parent))
  return out


def input_paths(spec: str | Sequence[str] | None) -> list[str]:
  """The local paths a comma-separated list (or a list) of files or glob patterns names (a
  pattern: its matches)."""
  items = spec.split(",") if isinstance(spec, str) else list(spec or [])
  out: list[str] = []
  for item in (i.strip() for i in items):
    if not _local(item):
      continue
    if glob.has_magic(item):
      out.extend(sorted(glob.glob(item, recursive=True)))
    else:
      out.append(item)
  return out


# Run-config keys (configs/*.py) that name what a run reads: checkpoints, vocabularies, data.
CONFIG_INPUT_KEYS = (
  "init_checkpoint",
  "vocab_file",
  "bert_config_file",
  "data_dir",
  "tfds_data_dir",
  "train_file",
  "dev_file",
  "test_file",
  "predict_file",
  "private_attributes_file",
  "input_files",
  "eval_input_files",
  "phase2.input_files",
  "phase2.eval_input_files",
)


def config_inputs(config: Mapping) -> dict[str, list[str]]:
  """``{"config.<key>": paths}`` for each key of ``CONFIG_INPUT_KEYS`` that ``config`` sets
  (globs and comma-separated lists expanded by ``input_paths``)."""
  out = {}
  for key in CONFIG_INPUT_KEYS:
    value = config
    for part in key.split("."):
      value = value.get(part) if isinstance(value, Mapping) or hasattr(value, "get") else None
      if value is None:
        break
    if isinstance(value, str) and value:
      out[f"config.{key}"] = input_paths(value)
  return out


def check_workdir(flag: str, workdir: PathLike, config: Mapping, **inputs: Paths) -> None:
  """ValueError (one line) when a run's ``workdir`` is, contains or lies inside an input that
  ``config`` names (``config_inputs``; ``config.init_checkpoint`` sealed) or one of ``inputs``
  (flag=paths, flags without their dashes); or when a file stands where its folder would be
  made."""
  named = config_inputs(config)
  named.update({f"--{k}": v for k, v in inputs.items()})
  check_outputs({flag: workdir}, named, replaced=(flag,), sealed=("config.init_checkpoint",))
  check_parent(flag, workdir, create=True)


def check_outputs(
  outputs: Mapping[str, PathLike | None],
  inputs: Mapping[str, Paths],
  *,
  replaced: Collection[str] = (),
  sealed: Collection[str] = (),
) -> None:
  """ValueError (one line) when an output would overwrite, replace or lie over an input, or two
  outputs are the same path; see the module docstring. ``outputs`` and ``inputs`` map a flag
  (as the user typed it, e.g. "--output" or "config.init_checkpoint") to its path (an input
  may be several); ``replaced`` names the outputs that must not lie inside any input folder;
  ``sealed`` the inputs (checkpoints) no output may lie inside."""
  outs = [(flag, os.fspath(p), _real(p)) for flag, p in outputs.items() if _local(p)]
  ins = [(flag, p, _real(p)) for flag, paths in inputs.items() for p in _each(paths)]
  for oflag, out, real_out in outs:
    noun = "folder" if oflag in replaced or os.path.isdir(real_out) else "path"
    for iflag, inp, real_in in ins:
      if real_out == real_in:
        raise ValueError(
          f"{oflag}={out} is the input {iflag}={inp}: writing it would destroy the input; "
          f"choose another {noun}"
        )
      if _within(real_in, real_out):
        raise ValueError(
          f"{oflag}={out} contains the input {iflag}={inp}: writing it could destroy the input; "
          "choose a folder outside it"
        )
      if oflag in replaced and _within(real_out, real_in):
        raise ValueError(
          f"{oflag}={out} lies inside the input {iflag}={inp}: writing it would change the "
          "input; choose a folder outside it"
        )
  _check_sealed(outs, {flag: inputs[flag] for flag in sealed if flag in inputs})
  for i, (flag_a, out_a, real_a) in enumerate(outs):
    for flag_b, out_b, real_b in outs[i + 1 :]:
      if real_a == real_b:
        raise ValueError(
          f"{flag_a}={out_a} and {flag_b}={out_b} are the same path: one output would replace "
          "the other; choose different paths"
        )


def _check_sealed(outs: list[tuple[str, str, str]], sealed: Mapping[str, Paths]) -> None:
  for iflag, paths in sealed.items():
    for inp in (p for p in (paths if isinstance(paths, (list, tuple)) else [paths]) if _local(p)):
      for folder in checkpoint_folders(inp):
        for oflag, out, real_out in outs:
          if real_out == _real(folder) or _within(real_out, _real(folder)):
            where = "" if _real(folder) == _real(inp) else f" (its folder {folder})"
            raise ValueError(
              f"{oflag}={out} lies inside the checkpoint {iflag}={inp}{where}: writing it "
              "would change the checkpoint; choose a path outside it"
            )


def check_parent(flag: str, path: PathLike | None, create: bool = False) -> None:
  """ValueError (one line) unless the folder ``path`` is written into can be used: it exists
  and is a folder, or (``create``) it can be made, no part of it being a file. Also refuses a
  ``path`` that is an existing folder where a file is to be written (``create`` False), or an
  existing file where a folder is to be made (``create``)."""
  if not _local(path):
    return
  path = os.fspath(path)
  if not create and os.path.isdir(path):
    raise ValueError(f"{flag}={path} is a folder: name a file to write")
  if create and os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{flag}={path} is a file, not a folder")
  parent = os.path.dirname(os.path.abspath(os.path.expanduser(path)))
  probe = parent
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise ValueError(f"{flag}={path}: {probe} is a file, not a folder")
  if probe != parent and not create:
    raise ValueError(f"{flag}={path}: the folder {os.path.dirname(path)} does not exist")
