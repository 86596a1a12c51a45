"""The codebase's shape, measured from the files: lines by folder, the largest files, the
members of ``Task`` and ``Job``, function-level imports, the places that choose an attention
kernel and the places that build a ``BertConfig`` from a run config.

  python -m benchmarks.codebase.house [--repo=DIR] [--json=OUT]
  python -m benchmarks.codebase.house --repo=DIR --before=OLD.json --markdown=OUT.md  # a table

Counted statically (``ast``): nothing is imported. A "place that chooses a kernel" is a function
that calls ``resolve_attention_kernel`` or ``_auto_kernel``; a "place that builds a BertConfig
from a run config" is a function that calls ``.replace(`` on a ``BertConfig`` with a keyword read
from a config (``config.``) or calls ``BertConfig.from_preset`` with ``config.``; both lists name
``file:function``. Clone pairs come from the ``duplicates`` tool where it is installed.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import shutil
import subprocess

SOURCE_ROOTS = ("bert_jax", "launch", "configs", "benchmarks")


def python_files(repo: str) -> list[str]:
  out = []
  for root in SOURCE_ROOTS:
    for dirpath, dirnames, filenames in os.walk(os.path.join(repo, root)):
      dirnames[:] = [d for d in dirnames if d != "__pycache__"]
      out += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
  return sorted(out)


def _lines(path: str) -> int:
  with open(path, encoding="utf-8") as f:
    return sum(1 for _ in f)


def lines_by_folder(repo: str, files: list[str]) -> dict[str, int]:
  """Lines per package folder (``bert_jax/tasks/glue``: its own files, not its subfolders')."""
  counts: dict[str, int] = collections.Counter()
  for path in files:
    counts[os.path.relpath(os.path.dirname(path), repo)] += _lines(path)
  return dict(sorted(counts.items()))


def _class_members(tree: ast.Module, name: str) -> dict[str, list[str]] | None:
  for node in ast.walk(tree):
    if isinstance(node, ast.ClassDef) and node.name == name:
      attrs, methods, abstract = [], [], []
      for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
          methods.append(item.name)
          decorators = [ast.unparse(d) for d in item.decorator_list]
          if any("abstractmethod" in d for d in decorators):
            abstract.append(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
          attrs.append(item.target.id)
        elif isinstance(item, ast.Assign):
          attrs += [t.id for t in item.targets if isinstance(t, ast.Name)]
      return dict(attributes=attrs, methods=methods, abstract=abstract)
  return None


def function_level_imports(trees: dict[str, ast.Module]) -> dict[str, int]:
  """Per file: import statements inside a function body."""
  out = {}
  for path, tree in trees.items():
    n = 0
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n += sum(
          isinstance(inner, (ast.Import, ast.ImportFrom))
          for inner in ast.walk(node)
          if inner is not node
        )
    if n:
      out[path] = n
  return out


def _functions(tree: ast.Module):
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      yield node


def kernel_choosers(trees: dict[str, ast.Module]) -> list[str]:
  out = []
  for path, tree in trees.items():
    for fn in _functions(tree):
      calls = {ast.unparse(c.func).split(".")[-1] for c in ast.walk(fn) if isinstance(c, ast.Call)}
      if calls & {"resolve_attention_kernel", "_auto_kernel"}:
        out.append(f"{path}:{fn.name}")
  return sorted(set(out))


def _reads_config(node: ast.AST) -> bool:
  """Whether ``node`` reads ``config.key`` or ``config[key]``."""
  return any(
    isinstance(n, (ast.Attribute, ast.Subscript))
    and isinstance(n.value, ast.Name)
    and n.value.id == "config"
    for n in ast.walk(node)
  )


def bert_config_builders(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
  """Functions that apply run-config values to a ``BertConfig`` (a ``.replace(...)`` whose
  keywords read ``config.``, in a function that names BertConfig or bert_config), and those
  that choose the base architecture from the config (``BertConfig.from_preset(config...)``)."""
  settings, presets = [], []
  for path, tree in trees.items():
    for fn in _functions(tree):
      text = ast.unparse(fn)
      for call in ast.walk(fn):
        if not isinstance(call, ast.Call):
          continue
        func = ast.unparse(call.func)
        if (
          func.endswith(".replace")
          and not func.startswith("dataclasses")
          and any(_reads_config(fn if k.arg is None else k.value) for k in call.keywords)
          and ("BertConfig" in text or "bert_config" in text or "bert" in func)
        ):
          settings.append(f"{path}:{fn.name}")
        elif func.endswith("BertConfig.from_preset") and _reads_config(call):
          presets.append(f"{path}:{fn.name}")
  return dict(run_settings=sorted(set(settings)), base_preset=sorted(set(presets)))


def clone_pairs(repo: str) -> str:
  if not shutil.which("duplicates"):
    return "duplicates tool not installed"
  done = subprocess.run(
    ["duplicates", "--repo", repo, "--seconds", "120"], capture_output=True, text=True, check=False
  )
  return done.stdout.splitlines()[0] if done.stdout else done.stderr.strip()


def measure(repo: str) -> dict:
  files = python_files(repo)
  trees = {}
  for path in files:
    with open(path, encoding="utf-8") as f:
      trees[os.path.relpath(path, repo)] = ast.parse(f.read(), filename=path)
  largest = sorted(((_lines(p), os.path.relpath(p, repo)) for p in files), reverse=True)[:8]
  members = {}
  for cls, where in (("Task", "bert_jax/tasks/base.py"), ("Job", "bert_jax/train/job.py")):
    found = _class_members(trees[where], cls) if where in trees else None
    if found:
      members[cls] = dict(found, total=len(found["attributes"]) + len(found["methods"]))
  fli = function_level_imports({p: t for p, t in trees.items() if not p.startswith("benchmarks")})
  return dict(
    files=len(files),
    lines=sum(_lines(p) for p in files),
    lines_by_folder=lines_by_folder(repo, files),
    largest_files=[dict(file=f, lines=n) for n, f in largest],
    members=members,
    function_level_imports=dict(total=sum(fli.values()), files=fli),
    kernel_choosers=kernel_choosers(trees),
    bert_config_builders=bert_config_builders(trees),
    clone_pairs=clone_pairs(repo),
  )


def _top_folder(folder: str) -> str:
  parts = folder.split("/")
  return "/".join(parts[:2]) if parts[0] == "bert_jax" and len(parts) > 1 else parts[0]


def markdown(before: dict, after: dict) -> str:
  """The before/after table of two measurements."""

  def members(d, cls):
    m = d["members"].get(cls, {})
    return f"{m.get('total', 0)} ({len(m.get('attributes', []))} attributes, " + (
      f"{len(m.get('methods', []))} methods, {len(m.get('abstract', []))} abstract)"
    )

  def places(items):
    return "<br>".join(f"`{x}`" for x in items) or "none"

  rows = [
    ("Python files / lines", f"{before['files']} / {before['lines']:,}",
     f"{after['files']} / {after['lines']:,}"),
    ("members of `Task`", members(before, "Task"), members(after, "Task")),
    ("members of `Job`", members(before, "Job"), members(after, "Job")),
    ("function-level imports (bert_jax, launch, configs)",
     before["function_level_imports"]["total"], after["function_level_imports"]["total"]),
    ("places that choose the attention kernel", places(before["kernel_choosers"]),
     places(after["kernel_choosers"])),
    ("places that apply run-config values to a `BertConfig`",
     places(before["bert_config_builders"]["run_settings"]),
     places(after["bert_config_builders"]["run_settings"])),
    ("places that pick the base preset from a config",
     len(before["bert_config_builders"]["base_preset"]),
     len(after["bert_config_builders"]["base_preset"])),
    ("clone pairs (`duplicates`, whole tree)", before["clone_pairs"], after["clone_pairs"]),
  ]  # fmt: skip
  lines = ["| | before | after |", "|---|---|---|"]
  lines += [f"| {name} | {b} | {a} |" for name, b, a in rows]
  lines += ["", "Lines by folder (bert_jax's subpackages with their subfolders, launch):", ""]
  lines += ["| folder | before | after |", "|---|---|---|"]
  totals: dict[str, list[int]] = {}
  for i, d in enumerate((before, after)):
    for folder, n in d["lines_by_folder"].items():
      if folder.startswith(("bert_jax", "launch")):
        totals.setdefault(_top_folder(folder), [0, 0])[i] += n
  lines += [f"| {f} | {b:,} | {a:,} |" for f, (b, a) in sorted(totals.items())]
  lines += ["", "Largest files:", "", "| before | after |", "|---|---|"]
  for x, y in zip(before["largest_files"][:5], after["largest_files"][:5]):
    lines.append(f"| {x['file']} ({x['lines']}) | {y['file']} ({y['lines']}) |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repo", default=".", help="the checkout to measure")
  p.add_argument("--json", default="", help="write the figures here")
  p.add_argument("--before", default="", help="an earlier --json: print the before/after table")
  p.add_argument("--markdown", default="", help="with --before: write the table here")
  args = p.parse_args(argv)
  result = measure(os.path.abspath(args.repo))
  text = json.dumps(result, indent=1)
  if args.json:
    with open(args.json, "w") as f:
      f.write(text + "\n")
  if args.before:
    with open(args.before) as f:
      text = markdown(json.load(f), result)
    if args.markdown:
      with open(args.markdown, "w") as f:
        f.write(text)
  print(text)


if __name__ == "__main__":
  main()
