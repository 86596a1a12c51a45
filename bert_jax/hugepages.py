"""Transparent huge pages for the host allocator: entry points restart once with glibc's
``glibc.malloc.hugetlb=1`` tunable.

XLA:CPU allocates a step's temporaries and outputs afresh with ``malloc`` on every call, and
glibc serves each allocation above its mmap threshold (at most 32 MiB) with a fresh ``mmap``
that it unmaps again on ``free``: every step faults its large buffers back in, 4 KiB at a time.
The MLM decoder's float32 logits alone (640 rows x 30,522) are ~20,000 faults per call; their
product took 26 ms, 11 ms into memory that stays mapped. With the tunable, glibc advises its
mappings (and its heap) as transparent huge pages, 2 MiB each: ~250 faults and 13 ms there;
whole pre-training steps on a 2-core CPU ran 1.1-1.6x faster at BERT-tiny to -small and level
at -base (benchmarks/results/history/host_memory_huge_pages.md).

The tunable is read by the dynamic loader when a process starts, so it cannot be switched on
later: ``restart_with_hugepages`` re-executes the current command line (same process id,
arguments and environment, plus the tunable) before anything has run. It does nothing where
the change cannot help or was declined:

* not Linux with glibc >= 2.35 (the first glibc with the tunable);
* the kernel's THP mode is not ``madvise`` (``always`` gives huge pages already, ``never``
  refuses them; /sys/kernel/mm/transparent_hugepage/enabled);
* ``GLIBC_TUNABLES`` already sets ``glibc.malloc.hugetlb`` (any value: the user's choice);
* ``BERT_JAX_HUGEPAGES=0`` (opt out);
* the host has an accelerator (``bert_jax.accelerators``: its device files), or
  ``JAX_PLATFORMS`` names one first (``tpu``, ``cuda``, ...): the step's buffers are then in the
  accelerator's memory, and host memory is left as the user started it.

A restart says so in one line on stderr before the process is replaced.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping, Sequence

from bert_jax.accelerators import accelerator_on_host

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "BERT_JAX_HUGEPAGES"
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"
MIN_GLIBC = (2, 35)


def thp_mode(path: str = THP_MODE_FILE) -> str | None:
  """The kernel's transparent-huge-page mode (the bracketed word: always, madvise or never)."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return None
  start, end = text.find("["), text.find("]")
  return text[start + 1 : end] if 0 <= start < end else None


def glibc_version() -> tuple[int, ...] | None:
  name, version = platform.libc_ver()
  if name != "glibc" or not version:
    return None
  try:
    return tuple(int(part) for part in version.split(".")[:2])
  except ValueError:
    return None


def tunables_with_hugepages(
  environ: Mapping[str, str],
  mode: str | None,
  glibc: tuple[int, ...] | None,
  accelerator: str | None = None,
) -> str | None:
  """The ``GLIBC_TUNABLES`` value to restart with, or None where nothing is to be done
  (``accelerator``: the host's, 'tpu' or 'gpu', or None)."""
  if environ.get(OPT_OUT, "1") == "0" or mode != "madvise" or accelerator is not None:
    return None
  if glibc is None or glibc < MIN_GLIBC:
    return None
  first_platform = environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
  if first_platform not in ("", "cpu"):
    return None
  items = [item for item in environ.get("GLIBC_TUNABLES", "").split(":") if item]
  if any(item.partition("=")[0] == TUNABLE for item in items):
    return None
  return ":".join([*items, f"{TUNABLE}=1"])


def restart_command(orig_argv: Sequence[str], executable: str) -> tuple[str, list[str]] | None:
  """``(program, argv)`` that re-runs this process's command line: the interpreter's own
  options, then ``-m module`` or a script, then its arguments; None where the command cannot be
  re-run as it was (``-c`` code or an interactive interpreter)."""
  args = list(orig_argv[1:])
  if not executable or not args or "-c" in args or args[0] == "-":
    return None
  return executable, [orig_argv[0], *args]


def is_entry_point_command(orig_argv: Sequence[str]) -> bool:
  """Whether the process was started as one of our entry points: ``python [opts] -m
  bert_jax.<name>`` or an installed ``bert-jax-<name>`` script (not, e.g., a test runner that
  calls an entry point's ``run`` in its own process)."""
  args = list(orig_argv[1:])
  if "-m" in args:
    index = args.index("-m")
    return index + 1 < len(args) and args[index + 1].startswith("bert_jax.")
  return bool(args) and os.path.basename(args[0]).startswith("bert-jax-")


def restart_with_hugepages() -> None:
  """Re-executes this process with the tunable set, where it can help (see the module's doc);
  otherwise returns. Call it first, before any work: ``execv`` replaces the process."""
  accelerator = accelerator_on_host(os.environ)
  tunables = tunables_with_hugepages(os.environ, thp_mode(), glibc_version(), accelerator)
  command = restart_command(sys.orig_argv, sys.executable)
  if tunables is None or command is None:
    return
  os.environ["GLIBC_TUNABLES"] = tunables
  print(
    f"bert_jax: restarting with GLIBC_TUNABLES={tunables} (transparent huge pages for the "
    f"CPU's buffers; {OPT_OUT}=0 opts out)",
    file=sys.stderr,
  )
  sys.stdout.flush()
  sys.stderr.flush()
  os.execv(*command)
