"""One planner candidate compiled in its own process (``planner.compile_isolated``).

  python -m bert_jax.plan.compile_worker RESULT.json  < pickled (config, topology, phase, cache_dir)

Compiles the candidate with ``planner.compile_cached`` (so the on-disk cache is filled as
in-process) and writes its JSON result to RESULT.json. A crash of the compiler ends this process
only; the planner records the candidate as failed and goes on.
"""

from __future__ import annotations

import json
import pickle
import sys

from bert_jax.plan.planner import compile_cached


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    print(__doc__, file=sys.stderr)
    return 2
  config, topo, phase, cache_dir = pickle.load(sys.stdin.buffer)
  result = compile_cached(config, topo, phase, cache_dir)
  with open(argv[1], "w") as f:
    json.dump(result, f)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
