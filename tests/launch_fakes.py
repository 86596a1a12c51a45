"""Stand-ins for the launcher tests: a fake interpreter that records what each process was given
(its argv and jax.distributed environment), and a helper to read those records back."""

from __future__ import annotations

import json
import stat
import sys


def executable(path, text):
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return str(path)


def fake_interpreter(tmp_path):
  """(path, records folder): a stand-in interpreter that records its argv and jax.distributed
  environment (the ``fake_python`` fixture of tests/conftest.py)."""
  record = tmp_path / "records"
  record.mkdir()
  script = f"""#!{sys.executable}
import json, os, sys
keys = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "CUDA_VISIBLE_DEVICES")
rec = {{"argv": sys.argv[1:], **{{k: os.environ.get(k) for k in keys}}}}
with open(os.path.join({str(record)!r}, "p%s.json" % os.environ["JAX_PROCESS_ID"]), "w") as f:
  json.dump(rec, f)
"""
  return executable(tmp_path / "fake_python", script), record


def records(record_dir):
  return sorted(
    (json.loads(p.read_text()) for p in record_dir.glob("p*.json")),
    key=lambda r: int(r["JAX_PROCESS_ID"]),
  )
