r"""Launch bert_jax jobs and sweeps locally, on TPU VMs, under SLURM or on Kubernetes.

  python -m launch run --job=pretrain --config=configs/pretrain.py:tiny --workdir=/tmp/pt \
      --target=local --num_processes=2 -- --config.num_train_steps=20
  python -m launch run --job=pretrain --config=configs/pretrain.py:base --workdir=gs://b/pt \
      --target=tpu --tpu_name=pod --zone=us-central2-b --project=p --dry_run
  python -m launch sweep --job=finetune --config=configs/glue.py:rte --workdir=/tmp/rte \
      --sweep=sweeps/glue_paper_grid.py:3 --parallel=2
  python -m launch results --workdir=/tmp/rte [--metric=dev.accuracy]
  python -m launch glue --init_checkpoint=CKPT --data_dir=../shared/data/glue --workdir=/tmp/glue \
      [--protocol=quick|paper] [--seeds=5] [--tasks=cola,rte] [--parallel=2] [--dry_run]

Arguments after ``--`` go to the entry point verbatim (``--config.*`` ones are checked first).
Target settings are flags named like the target's fields (see ``launch/targets/``).
"""

import dataclasses
import sys

from absl import app, flags

from .glue import Suite, run_glue
from .job import Job, LaunchError
from .launch import launch
from .results import mean_and_spread, write_results
from .sweep import load_sweep, plan_sweep, run_sweep
from .targets import TARGETS, make_target, setting_help

FLAGS = flags.FLAGS
COMMANDS = ("run", "sweep", "results", "glue")
flags.DEFINE_string("job", "pretrain", "pretrain, finetune, evaluate, probe or a module path.")
flags.DEFINE_string("config", "", "The job's config, path.py[:arg].")
flags.DEFINE_string("workdir", None, "The run's workdir (a sweep's root directory).")
flags.DEFINE_enum("target", "local", sorted(TARGETS), "Where the job runs.")
flags.DEFINE_bool("dry_run", False, "Print exactly what would run; start nothing.")
flags.DEFINE_string("python", None, "Interpreter (default: this one locally, python3 remotely).")
flags.DEFINE_string("sweep", None, "sweep: the sweep file, path.py[:arg].")
flags.DEFINE_integer("parallel", 1, "sweep: local runs at a time.")
flags.DEFINE_string("metric", None, "results: the metric to sort by (default: primary).")
flags.DEFINE_enum("mode", "auto", ["auto", "max", "min"], "results: is higher or lower better.")
flags.DEFINE_string("init_checkpoint", "", "glue: the checkpoint to fine-tune (any kind).")
flags.DEFINE_string("data_dir", "", "glue: the GLUE root (CoLA/, SST-2/, ...).")
flags.DEFINE_list("tasks", [], "glue: the tasks to run (default: every task with data).")
flags.DEFINE_enum("protocol", "quick", ["quick", "paper"], "glue: median over seeds or grid.")
flags.DEFINE_integer("seeds", 0, "glue: seeds per setting (default: quick 5, paper 1).")

_TYPES = {
  "str": flags.DEFINE_string,
  "int": flags.DEFINE_integer,
  "float": flags.DEFINE_float,
  "bool": flags.DEFINE_bool,
}
_SETTINGS: dict[str, list[str]] = {}  # setting -> the targets that have it


def _define_target_flags():
  """One flag per target setting (dataclass field), documented from the target's docstring."""
  fields, helps, defaults = {}, {}, {}
  for name, cls in TARGETS.items():
    for f in dataclasses.fields(cls):
      _SETTINGS.setdefault(f.name, []).append(name)
      fields.setdefault(f.name, f)
      helps.setdefault(f.name, setting_help(name).get(f.name, ""))
      defaults.setdefault(f.name, []).append(f"{name}: {f.default!r}")
  for key, f in fields.items():
    define = _TYPES.get(str(f.type), flags.DEFINE_multi_string)
    default = (
      f"default {f.default!r}"
      if len(defaults[key]) == 1
      else f"defaults {'; '.join(defaults[key])}"
    )
    define(key, None, f"[{', '.join(_SETTINGS[key])}] {helps[key]} ({default})")


_define_target_flags()


def target_from_flags():
  given = {k: FLAGS[k].value for k in _SETTINGS if FLAGS[k].present}
  wrong = sorted(k for k in given if FLAGS.target not in _SETTINGS[k])
  if wrong:
    raise LaunchError(f"--{' --'.join(wrong)} not a setting of the {FLAGS.target} target")
  given = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
  return make_target(FLAGS.target, given)


def main(argv):
  if len(argv) < 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f"usage: python -m launch {{{'|'.join(COMMANDS)}}} [flags] [-- args]")
  if not FLAGS.workdir:
    raise app.UsageError("--workdir is required")
  try:
    if argv[1] == "results":
      mode = {"auto": None, "max": True, "min": False}[FLAGS.mode]
      tables = write_results(FLAGS.workdir, FLAGS.metric, mode)
      print(
        f"best run: {tables.best_run['run']} ({tables.metric} = "
        f"{tables.best_run[tables.metric]:.4f}); tables in {FLAGS.workdir}/results.md\n"
        f"best configuration: {tables.describe_config(tables.best_config)} ({tables.metric} = "
        f"{mean_and_spread(tables.best_config, tables.metric)})"
      )
      return 0
    target = target_from_flags()
    python = FLAGS.python or (sys.executable if target.on_this_machine else "python3")
    job = Job(FLAGS.job, FLAGS.config, FLAGS.workdir, extra_args=tuple(argv[2:]), python=python)
    if argv[1] == "glue":
      suite = Suite(
        FLAGS.workdir,
        FLAGS.init_checkpoint,
        FLAGS.data_dir,
        FLAGS.protocol,
        tuple(FLAGS.tasks),
        FLAGS.seeds,
        tuple(argv[2:]),
        python,
        FLAGS.config.partition(":")[0] or "configs/glue.py",
      )
      return run_glue(suite, target, FLAGS.parallel, FLAGS.dry_run)
    if argv[1] == "run":
      return launch(job, target, dry_run=FLAGS.dry_run)
    runs = plan_sweep(job, load_sweep(FLAGS.sweep or ""), FLAGS.workdir, FLAGS.sweep or "sweep")
    statuses = run_sweep(runs, target, FLAGS.parallel, FLAGS.dry_run)
    if FLAGS.dry_run or not target.results_on_return:
      return max(statuses.values(), default=0)
    failed = sorted(name for name, status in statuses.items() if status)
    try:
      write_results(FLAGS.workdir)
      print(f"sweep: results in {FLAGS.workdir}/results.md; failed: {failed or 'none'}")
    except LaunchError as e:  # e.g. no run complete yet
      print(f"sweep: no results table: {e}; failed: {failed or 'none'}")
    return 1 if failed else 0
  except LaunchError as e:
    print(f"launch: error: {e}", file=sys.stderr)
    return 2


def run():
  """The ``bert-jax-launch`` console script: the same as ``python -m launch``."""
  app.run(main)


if __name__ == "__main__":
  run()
