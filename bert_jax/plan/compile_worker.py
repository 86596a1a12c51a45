"""A compile run in its own process (``bert_jax.plan.isolation.run_in_child``).

  python -m bert_jax.plan.compile_worker RESULT.json  < pickled (target, args)

``target`` names one of ``TARGETS``: ``compile_cached`` (a planner candidate; args: config,
topology, phase, cache_dir: the on-disk cache is filled as in-process) or
``compile_for_topology`` (args: config, topology, keyword arguments). The JSON result goes to
RESULT.json; a ValueError (bad input, a step that does not compile) is written there as
``{"raised": <type name>, "message": ...}``. A crash of the compiler ends this process only.
SIGINT (the terminal's Ctrl-C) ends it at once, mid-compile. With ``BERT_JAX_COMPILE_STATUS``
set, ``compile_for_topology`` writes the step it is compiling to that file
(``isolation.read_status``).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys


def _compile_cached(config, topo, phase, cache_dir):
  # The compiler's modules (JAX, the model) load here, after main() made SIGINT end this
  # process at once: a Ctrl-C during a child's start then ends it without a traceback.
  from bert_jax.plan.planner import compile_cached  # noqa: PLC0415 (after SIGINT's default)

  return compile_cached(config, topo, phase, cache_dir)


def _compile_for_topology(config, topo, kwargs):
  from bert_jax.plan.compiler import compile_for_topology  # noqa: PLC0415 (after SIGINT's default)
  from bert_jax.plan.isolation import STATUS_ENV  # noqa: PLC0415 (after SIGINT's default)

  status = os.environ.get(STATUS_ENV)
  if status:

    def on_step(step: str) -> None:
      with open(status, "w") as f:
        f.write(step)

    kwargs = dict(kwargs, on_step=on_step)
  result = compile_for_topology(config, topo, **kwargs)
  result.pop("reports")  # the compiled executables; the steps hold their numbers
  return result


TARGETS = {"compile_cached": _compile_cached, "compile_for_topology": _compile_for_topology}


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    print(__doc__, file=sys.stderr)
    return 2
  signal.signal(signal.SIGINT, signal.SIG_DFL)  # an interrupt ends the compile, no traceback
  target, args = pickle.load(sys.stdin.buffer)
  try:
    result = TARGETS[target](*args)
  except ValueError as e:
    result = dict(raised=type(e).__name__, message=str(e))
  with open(argv[1], "w") as f:
    json.dump(result, f)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
