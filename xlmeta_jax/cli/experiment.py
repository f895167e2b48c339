"""``python -m xlmeta_jax.experiment``: runs the experiment, or prints its plan.

The logic lives in :mod:`xlmeta_jax.experiment.runner`; see the package docstring.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

from xlmeta_jax import errors, logs
from xlmeta_jax.cli import configurables, evaluation_runs, experiment_runs, runs
from xlmeta_jax.cli import flags as gin_cli
from xlmeta_jax.cli import train as train_cli
from xlmeta_jax.experiment import plan, runner

# The experiment files --help lists (cpu_finetune.gin, tiny_finetune.gin are the
# experiments' fine-tuning add-ons, not experiments).
GIN_FILES = ("experiments/cpu.gin", "experiments/tiny.gin", "experiments/xlmr_base.gin")

FLAGS = (
    ("--dry_run", "print the plan (every run and evaluation, what is done) and its "
     "estimated time from measured step rates; run nothing"),
    *train_cli.HELP_FLAGS,
)


def help_text() -> str:
    return gin_cli.help_text(
        "xlmeta_jax.experiment",
        "Meta-pretraining against single-phase baselines at equal compute: pretrains every "
        "arm (meta, xlmr, joint, xling_only) x seed, fine-tunes and evaluates each final "
        "checkpoint on the configured tasks, writes results.json, report.md and plots "
        "into MODEL_DIR. Rerunning the same command resumes; nothing finished is redone.",
        gin_files=GIN_FILES,
        example="python -m xlmeta_jax.experiment --gin_file=gin/experiments/cpu.gin "
                "--gin.MODEL_DIR=\"'runs/cpu_experiment'\" --dry_run",
        flags=FLAGS,
    )


def main(argv: Sequence[str]) -> dict | None:
    """Parses the command line, then runs the experiment or prints its plan."""
    argv = list(argv)
    if gin_cli.wants_help(argv):
        print(help_text())
        return None
    train_cli.setup_logging()
    try:
        flags = gin_cli.parse_gin_flags(argv)
    except ValueError as e:
        raise runner.ExperimentError(str(e)) from None
    own = errors.own_flags_parser("python -m xlmeta_jax.experiment")
    own.add_argument("--dry_run", action="store_true")
    own, rest = own.parse_known_args(flags.remaining)
    dry_run = own.dry_run
    rest = train_cli.initialize_distributed(rest, prog="xlmeta_jax.experiment")
    if rest:
        raise runner.ExperimentError(f"unknown arguments {rest} (see --help)")
    if not flags.gin_files:
        raise runner.ExperimentError(
            "no --gin_file given (e.g. --gin_file=gin/experiments/cpu.gin)")
    logs.quiet_start()
    exp = configured_experiment(flags)
    if dry_run:
        # A stored experiment of another plan, or a MODEL_DIR in the way, is refused
        # before the estimate measures anything; a dry run writes nothing.
        runner.check_model_dir(exp, write=False)
        print(plan.plan(exp))
        return None
    # Before the corpus is prepared or anything pretrains: no pod time is spent.
    runner.check_hosts(exp)
    return runner.run(exp, "python -m xlmeta_jax.experiment " + " ".join(argv))


def _parse_experiment(flags) -> None:
    gin_cli.apply_gin(flags.gin_files, flags.bindings, flags.search_paths, check_macros=True)


def configured_experiment(flags) -> runner.Experiment:
    """The experiment the gin flags describe, with every task's evaluation config.

    gin holds one config at a time: the experiment's is parsed, each task's fine-tune
    files into its ``FineTuneConfig``, and the experiment's is parsed again for the run
    (its trainer and its recipe arms' recipes read its bindings while it runs).
    """
    _parse_experiment(flags)
    first = experiment_runs.experiment(recipes=experiment_runs.recipes())
    finetunes = {task: finetune_config(first, task, flags.search_paths)
                 for task in first.tasks}
    _parse_experiment(flags)
    return experiment_runs.experiment(
        recipes=experiment_runs.recipes(),
        corpora=configurables.corpora_settings(),
        feeder=configurables.make_mlm_iterator, config_text=gin_cli.config_text(),
        train=functools.partial(runs.train, describe=configurables.binding_source),
        train_settings={name: gin_cli.bound(f"xlmeta_jax.pretrain.trainer.train.{name}",
                                            default)
                        for name, default in (("mesh_shape", (-1, 1, 1)),
                                              ("rng_impl", "threefry2x32"),
                                              ("microbatches", 1))},
        finetunes=finetunes)


def finetune_config(exp: runner.Experiment, task: str, search_paths=()):
    """The ``FineTuneConfig`` of ``task`` as the experiment runs it (checkpoint, folder
    and seed are set per run): ``gin/finetune/<task>.gin``, the experiment's fine-tune
    files and bindings, and its DATA_DIR."""
    # In the order of finetune_argv's flags: DATA_DIR, the bindings, then the run's values.
    bindings = [f"DATA_DIR = {os.path.abspath(exp.data_dir)!r}"] if exp.data_dir else []
    bindings += [*exp.finetune_bindings, "INITIAL_CHECKPOINT_PATH = '<per run>'",
                 "MODEL_DIR = '<per run>'"]
    gin_cli.apply_gin([f"finetune/{task}.gin", *exp.finetune_gin_files], bindings,
                      search_paths, check_macros=True)
    return evaluation_runs.finetune_config()


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.experiment")
