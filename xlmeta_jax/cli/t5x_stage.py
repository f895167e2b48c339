"""``python -m xlmeta_jax.t5x_train --phase=NAME``: one phase of our trainer's run file,
derived for t5x's train (:mod:`xlmeta_jax.interop.t5x.stages`, gin/t5x/stage.gin).

Imported by the command only with ``--phase``: it registers our trainer's gin names
(:mod:`xlmeta_jax.cli.runs`), which t5x's own run files must not see (their ``train``
would be ambiguous with ours).
"""

from __future__ import annotations

import re

import gin

from xlmeta_jax import files
from xlmeta_jax.cli import configurables, runs
from xlmeta_jax.cli import flags as gin_flags
from xlmeta_jax.cli import train as train_cli
from xlmeta_jax.interop.t5x import stages
from xlmeta_jax.pretrain import checkpoints, checks


def configured_stage(wanted: str) -> stages.Stage:
    """The phase ``wanted`` of the run the parsed gin config binds (our trainer's run
    file), with the run's settings, once our trainer's checks passed.

    Raises:
      errors.UserError: naming the setting (as ``python -m xlmeta_jax.train`` names it),
        or a phase t5x cannot run.
    """
    q = "xlmeta_jax.pretrain.trainer.train."
    phases = gin_flags.bound(q + "phases", None)
    if phases is None:
        raise stages.StageError(
            "--phase takes a run file of our trainer, which binds "
            f"{q}phases (gin/native/*.gin); gin/meta.gin and gin/xlmr.gin are t5x's own "
            "(their phases by --gin.PHASE)")
    phases = tuple(phases)
    model = train_cli.configured_model()
    corpora = configurables.corpora_settings()
    # MODEL_DIR as our trainer reads it: a shell's path, checked, then absolute (gs:// kept).
    model_dir = files.user_path(gin_flags.bound(q + "model_dir", None), "MODEL_DIR")
    microbatches = gin_flags.bound(q + "microbatches", 1)
    # Our trainer's checks of the run (phase order, lengths against the model, masking
    # against the length, the merge); t5x's mesh is its own (gin/t5x/run.gin).
    checks.validate(model_dir, model, phases, (-1, 1, 1), 1, microbatches,
                    describe=configurables.binding_source, masking=corpora.masking,
                    packed=corpora.packed, merge=gin_flags.bound(q + "merge", None))
    return stages.Stage(
        model_dir=checkpoints.absolute(model_dir), phases=phases,
        index=stages.select_phase(phases, wanted),
        model=model, corpora=corpora, vocab_path=gin_flags.bound(q + "vocab_path", None),
        seed=gin_flags.bound(q + "seed", 0), microbatches=microbatches,
        checkpoint_every=gin_flags.bound(q + "checkpoint_every", 1000),
        keep_checkpoints=gin_flags.bound(q + "keep_checkpoints", 3),
        log_every=gin_flags.bound(q + "log_every", 100))


_MACRO = re.compile(r"^([A-Z][A-Z0-9_]*)\s*=", re.MULTILINE)


def split_t5x_addons(flags: gin_flags.GinFlags) -> tuple[gin_flags.GinFlags, list[str]]:
    """The run file's gin flags, and t5x's own flags for the add-on files among them.

    ``--gin_file=gin/t5x/mesh.gin --gin.MESH_SHAPE="(4, 2)"`` configures t5x's
    partitioner, which our trainer's run file does not know: the add-on file and the
    bindings of the macros it defines go to t5x, after gin/t5x/stage.gin.
    """
    addons = {f: text for f in flags.gin_files
              if (text := gin_flags.t5x_addon_text(f)) is not None}
    macros = {m for text in addons.values() for m in _MACRO.findall(text)}

    def theirs(binding: str) -> bool:
        return binding.partition("=")[0].strip() in macros

    ours = gin_flags.GinFlags(
        gin_files=[f for f in flags.gin_files if f not in addons],
        bindings=[b for b in flags.bindings if not theirs(b)],
        search_paths=flags.search_paths, remaining=flags.remaining)
    return ours, [*(f"--gin_file={f}" for f in addons),
                  *(f"--gin_bindings={b}" for b in flags.bindings if theirs(b))]


def stage_argv(wanted: str, argv: list[str], stage_gin: str) -> list[str]:
    """Derives the phase ``wanted`` of the run file in ``argv``'s gin flags; returns t5x's
    arguments for it (``stage_gin``, gin/t5x/stage.gin, t5x's add-on files with their
    bindings, and the flags that are not gin's)."""
    try:
        flags, addons = split_t5x_addons(gin_flags.parse_gin_flags(argv))
    except ValueError as e:
        raise stages.StageError(str(e)) from None
    if not flags.gin_files:
        raise stages.StageError("--phase needs the run file: --gin_file=gin/native/RUN.gin")
    gin_flags.apply_gin(flags.gin_files, flags.bindings, flags.search_paths,
                        check_macros=True)
    stage = configured_stage(wanted)
    # The data the run file prepares (the demo's corpus), once its settings passed the
    # checks, as our trainer prepares it.
    runs.prepare_data()
    # t5x parses its own config (gin/t5x/stage.gin) into the one global config.
    gin.clear_config()
    stages.set_current(stage)
    return [f"--gin_file={stage_gin}", *addons, *flags.remaining]
