"""``python -m xlmeta_jax.t5x_train``: t5x's own ``python -m t5x.train``, started quietly.

The same command (its flags, gin files and run): t5x's module runs as the main module
(``runpy``), as ``python -m`` runs it. What differs is before it: TensorFlow is imported
as our commands import it (:func:`xlmeta_jax.logs.quiet_start`), so neither its
start-up lines nor, on a host without NVIDIA GPUs, the ``cuInit`` error line of t5x's
hiding the GPUs from TensorFlow are printed. Both come before t5x reads the gin files,
where the rest is set up (gin/t5x/run.gin: our checks, one-line errors and progress
lines), so only a command started before t5x can drop them. ``XLMETA_DEBUG=1`` keeps
them, and t5x's whole log.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
from collections.abc import Sequence

from absl import flags as absl_flags

from xlmeta_jax import errors, logs, platforms
from xlmeta_jax.cli import flags as gin_flags

T5X_MAIN = "t5x.train"
# What a command that needs t5x says where it is not installed (docs/t5x.md).
T5X_MISSING = ("t5x is not installed (it is not on the package index): pip install -c "
               "constraints.txt -e '.[t5x]', then t5x, airio and jestimator with --no-deps "
               "from git, as docs/t5x.md shows")

HELP_FLAGS = ("--help", "-h", "--helpfull", "--helpshort")
PROG = "python -m xlmeta_jax.t5x_train"
# What t5x's train reads for one phase of a run file of our trainer (--phase).
STAGE_GIN = "gin/t5x/stage.gin"
PHASE_FLAG = "--phase"

HELP_HEADER = f"""\
python -m xlmeta_jax.t5x_train: t5x's `python -m t5x.train`, with the same flags and gin
files, started without TensorFlow's start-up lines. Example (phase 1 of the demo):

  python -m xlmeta_jax.t5x_train --gin_file=gin/t5x/demo.gin --gin.MODEL_DIR="'runs/t5x'"

  {errors.DEBUG_FLAG}   t5x's whole log and the traceback of an error (also {errors.DEBUG_ENV}=1)

The run files: gin/meta.gin (phases 1 and 2 by --gin.PHASE), gin/xlmr.gin, gin/t5x/demo.gin.

Any phase of a run file of our own trainer (gin/native/*.gin), one command per phase:

  python -m xlmeta_jax.t5x_train --gin_file=gin/native/annealed.gin --phase=stage2 \
    --gin.MODEL_DIR="'/runs/annealed_t5x'" ...the run's other flags...

  --phase=NAME   the phase to train (its name, or its number from 1); the run file's gin
                 flags are read as python -m xlmeta_jax.train reads them, and every t5x
                 setting of the phase derives from its Phase (gin/t5x/stage.gin);
                 an explicit mesh: --gin_file=gin/t5x/mesh.gin --gin.MESH_SHAPE="(4, 2)"

t5x's flags (absl) follow.
"""


def checked_bindings() -> tuple[str, ...]:
    """The command line's gin bindings (t5x's ``--gin_bindings``), once checked.

    gin takes any ``NAME = VALUE`` as a macro definition, and t5x parses the command
    line with the files, so a misspelt ``--gin.BATCH_SIZ=8`` would train with
    BATCH_SIZE's default. A macro that no binding reads (``%NAME``) cannot change the run
    whatever its spelling, so it is refused, naming the closest macros that are read.
    gin/t5x/run.gin evaluates this (``checked_model.command_line``) before t5x builds
    anything, for ``python -m t5x.train`` and this command alike.

    Raises:
      flags.GinConfigError: a command-line macro that no binding reads.
    """
    if "gin_bindings" not in absl_flags.FLAGS:
        return ()
    bindings = tuple(absl_flags.FLAGS["gin_bindings"].value or ())
    gin_flags.check_macro_bindings(bindings, known=gin_flags.used_macros())
    return bindings


def _pop_phase(argv: list[str]) -> tuple[str | None, list[str]]:
    """``--phase=NAME`` (or ``--phase NAME``) out of ``argv``: (NAME or None, the rest)."""
    wanted, rest = None, []
    it = iter(argv)
    for arg in it:
        name, eq, value = arg.partition("=")
        if name != PHASE_FLAG:
            rest.append(arg)
            continue
        wanted = value if eq else next(it, "")
        if not wanted:
            raise StageFlagError(f"{PHASE_FLAG} needs a phase (its name or number)")
    return wanted, rest


class StageFlagError(errors.UserError, ValueError):
    """A malformed --phase flag."""


def main(argv: Sequence[str] | None = None) -> None:
    """Runs ``python -m t5x.train`` with ``argv`` (default: this command's arguments).

    ``--debug`` is ours (absl would refuse it): it sets ``XLMETA_DEBUG=1``, which
    gin/t5x/run.gin's progress module and error handler read. ``--help`` prints what this
    command adds before t5x's flags, and exits 0 (absl's help exits 1).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if importlib.util.find_spec("t5x") is None:
        # Not on the package index: the install line, before anything starts.
        print(f"python -m xlmeta_jax.t5x_train: error: {T5X_MISSING}", file=sys.stderr)
        sys.exit(errors.EXIT_USER_ERROR)
    if errors.DEBUG_FLAG in argv:
        argv = [a for a in argv if a != errors.DEBUG_FLAG]
        os.environ[errors.DEBUG_ENV] = "1"
    wants_help = any(a in HELP_FLAGS for a in argv)
    if wants_help:
        print(HELP_HEADER)
        sys.stdout.flush()
    platforms.prefer_cpu_without_tpu()
    if not errors.debug_requested(()):
        logs.quiet_start(import_tensorflow=True)
    if not wants_help:
        try:
            wanted, argv = _pop_phase(argv)
            if wanted is not None:
                # Our trainer's gin names (which t5x's own configs must not see: `train`
                # would be ambiguous) only for --phase.
                from xlmeta_jax.cli import t5x_stage  # noqa: PLC0415 - see above

                argv = t5x_stage.stage_argv(wanted, argv, STAGE_GIN)
        except Exception as e:  # noqa: BLE001 - a user error is one line, a bug re-raised
            message = errors.user_message(e)
            if message is None or errors.debug_requested(()):
                raise
            print(f"{PROG}: error: {message}", file=sys.stderr)
            sys.exit(errors.EXIT_USER_ERROR)
    # absl parses sys.argv; runpy puts t5x's file in sys.argv[0].
    sys.argv = [T5X_MAIN, *argv]
    try:
        runpy.run_module(T5X_MAIN, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if wants_help and e.code == 1:
            sys.exit(0)
        raise
