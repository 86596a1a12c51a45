"""The device check's time-to-quality section: benchmarks.quality.time_to_quality on the
accelerator, a short budget per recipe, bfloat16.

The three recipes (bert_jax's paper and fast recipes, transformers' BertForPreTraining with SDPA
and torch AdamW) pre-train BERT-mini on the built-in corpus (the CPython sources: the device
machine has no ``../shared`` data) for the same wall-clock budget each, one after the other, in
child processes (each has the accelerator to itself), and report held-out MLM accuracy against
training seconds and the time each takes to reach the PyTorch reference's final accuracy.

The section is time-boxed like every other one of the check: the recipes' budget is what is left
of the section's share after a fixed allowance per recipe for what the benchmark does not count
as training (its probe, the final evaluation, interpreter starts); a section that would leave
less than ``MIN_RECIPE_S`` of training per recipe is skipped with a note. The benchmark's own
summary is read back (a second, ``--notrain`` pass assembles what finished when the first was
stopped by the box), so a partial section still reports its finished recipes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from benchmarks.common import REPO
from benchmarks.common.process import ChildFailed, run

RECIPES = ("bert_jax_paper", "bert_jax_fast", "pytorch_sdpa")
# Seconds the benchmark spends outside the recipes' training clocks: preparing the corpus
# (vocabulary, TFRecords) once, and per recipe its probe, final evaluation and interpreter
# starts (a CPU smoke run's children start slower).
DATA_S = {"full": 30.0, "quick": 60.0}
OVERHEAD_S = {"full": 40.0, "quick": 60.0}
MIN_RECIPE_S = 15.0


def budget_per_recipe(section_s: float, quick: bool) -> float:
  """Training seconds per recipe that fit in ``section_s`` (0: the section does not fit)."""
  kind = "quick" if quick else "full"
  per = (section_s - DATA_S[kind]) / len(RECIPES) - OVERHEAD_S[kind]
  return per if per >= MIN_RECIPE_S else 0.0


def command(workdir: str, out: str, recipe_s: float, quick: bool, train: bool = True) -> list[str]:
  """The benchmark's command: mini in bfloat16 (tiny in float32 for a CPU smoke run), the
  built-in corpus, four evaluations per recipe, no GLUE stage."""
  size, dtype, documents, eval_batch = (
    ("tiny", "float32", 400, 16) if quick else ("mini", "bfloat16", 0, 64)
  )
  return [
    sys.executable, "-m", "benchmarks.quality.time_to_quality",
    f"--workdir={workdir}", f"--out={out}", f"--size={size}", f"--dtype={dtype}",
    "--corpora=cpython", f"--max_documents={documents}", f"--eval_batch_size={eval_batch}",
    f"--budget_minutes={recipe_s / 60.0:.4f}", f"--eval_every_seconds={recipe_s / 4.0:.2f}",
    "--warmup_steps=100", "--probe_steps=10", f"--recipes={','.join(RECIPES)}", "--noglue",
    *([] if train else ["--notrain"]),
  ]  # fmt: skip


def section(section_s: float, quick: bool) -> dict:
  """Runs the section in at most ``section_s`` seconds; its summary (the benchmark's ``summary``:
  per recipe steps, tokens, final MLM accuracy, seconds to the reference's final accuracy and
  the ratio), or a note saying why there is none."""
  recipe_s = budget_per_recipe(section_s, quick)
  if not recipe_s:
    return dict(note=f"skipped: {section_s:.0f} s left for the section, too little for 3 recipes")
  with tempfile.TemporaryDirectory(prefix="device_check_ttq_") as tmp:
    workdir, out = os.path.join(tmp, "work"), os.path.join(tmp, "out")
    result: dict = dict(budget_seconds_per_recipe=round(recipe_s, 1))
    try:
      run(command(workdir, out, recipe_s, quick), cwd=REPO, timeout_s=section_s)
    except (ChildFailed, subprocess.SubprocessError, OSError) as e:
      result["note"] = f"stopped: {type(e).__name__}: {str(e).splitlines()[-1][-300:]}"
      try:  # what finished before the box or the failure
        run(command(workdir, out, recipe_s, quick, train=False), cwd=REPO, timeout_s=120)
      except (ChildFailed, subprocess.SubprocessError, OSError):
        return result
    reports = [f for f in os.listdir(out) if f.endswith(".json")] if os.path.isdir(out) else []
    if not reports:
      result.setdefault("note", "no report written")
      return result
    with open(os.path.join(out, reports[0])) as f:
      report = json.load(f)
    result.update(
      command=report["command"],
      summary=report["summary"],
      curves={
        name: [
          {k: e.get(k) for k in ("step", "train_seconds", "tokens", "mlm_accuracy", "mlm_loss")}
          for e in r["evals"]
        ]
        for name, r in report["runs"].items()
      },
    )
    return result


def table_lines(ttq: dict) -> list[str]:
  """The check's table lines for the section."""
  lines = ["", "time to quality (held-out MLM accuracy; each recipe the same training budget):"]
  if "summary" not in ttq:
    return lines + [f"  {ttq.get('note', 'not run')}"]
  s = ttq["summary"]
  ref = s.get("reference_final_mlm_accuracy")
  lines.append(
    f"  budget {ttq['budget_seconds_per_recipe']:.0f} s per recipe; reference "
    f"({s['reference']}) final accuracy {'-' if ref is None else f'{ref:.4f}'}"
  )
  lines.append(f"  {'recipe':<16} {'steps':>7} {'MLM acc':>8} {'s to ref':>9} {'ratio':>6}")
  for name, r in s["recipes"].items():
    acc, reach, ratio = (
      r["mlm_accuracy"],
      r["seconds_to_reference_accuracy"],
      r["ratio_to_reference"],
    )
    lines.append(
      f"  {name:<16} {r['steps'] or 0:>7} {'-' if acc is None else f'{acc:.4f}':>8} "
      f"{'-' if reach is None else f'{reach:.0f}':>9} {'-' if ratio is None else f'{ratio:.2f}':>6}"
    )
  if "note" in ttq:
    lines.append(f"  note: {ttq['note']}")
  return lines
