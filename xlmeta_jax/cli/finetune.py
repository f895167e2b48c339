r"""Zero-shot cross-lingual evaluation: fine-tune on English, test on every language.

Usage (t5x-style gin flags, see :mod:`xlmeta_jax.cli.flags`)::

    python -m xlmeta_jax.finetune --gin_file=gin/finetune/tydiqa.gin \
        --gin.INITIAL_CHECKPOINT_PATH="'/ckpts/meta'" \
        --gin.MODEL_DIR="'/runs/tydiqa_meta'" [--seeds=5]

    # CPU-sized demo of any task: add the demo override file.
    python -m xlmeta_jax.finetune --gin_file=gin/finetune/pawsx.gin \
        --gin_file=gin/finetune/demo.gin \
        --gin.INITIAL_CHECKPOINT_PATH="'init:tiny'" --gin.MODEL_DIR="'/tmp/pawsx_demo'"

``INITIAL_CHECKPOINT_PATH`` is a pretraining run (its MODEL_DIR: the last configured
phase's final checkpoint), a phase or step directory, a Hugging Face XLM-R directory,
a ``python -m xlmeta_jax.hf to_flax`` output, or ``init:tiny`` (random weights;
demos). ``--seeds=N`` fine-tunes N times (seeds ``seed`` .. ``seed + N - 1``) and
reports mean ± std. The sentence-retrieval tasks run through the same command
(``gin/finetune/tatoeba.gin``, ``gin/finetune/bucc.gin``: no fine-tuning). Writes
``MODEL_DIR/results.json`` and ``MODEL_DIR/config.gin``, and prints a table of
per-language scores. The work is done by
:func:`xlmeta_jax.evaluation.finetune.finetune`, configured by the gin configurable
:func:`xlmeta_jax.cli.evaluation_runs.finetune_config`. It runs on one host: started on several
(``--process_count=N`` with N > 1, or on every VM of a multi-host TPU slice) it stops at
once with one line (:mod:`xlmeta_jax.hosts`).
"""

from __future__ import annotations

import logging
import sys

from xlmeta_jax import errors, hosts, logs
from xlmeta_jax.cli import evaluation_runs
from xlmeta_jax.cli import flags as gin_cli
from xlmeta_jax.evaluation import embedding_config, embedding_run
from xlmeta_jax.evaluation import finetune as evaluation_finetune
from xlmeta_jax.evaluation import results as evaluation_results

# The task files --help lists, the CPU-size add-on and the embeddings demo
# (finetune/base.gin is included by every task file, not run alone).
GIN_FILES = ("finetune/[!b]*.gin", "finetune/bucc.gin", "demo_embeddings.gin")


def help_text() -> str:
    return gin_cli.help_text(
        "xlmeta_jax.finetune",
        "Zero-shot cross-lingual evaluation: fine-tunes a pretrained encoder on English and "
        "tests it on every language of the task; the sentence-retrieval tasks (Tatoeba, "
        "BUCC) run through it without fine-tuning. INITIAL_CHECKPOINT_PATH is a pretraining "
        "run (its MODEL_DIR), a phase or step folder, a Hugging Face XLM-R folder, a `hf "
        "to_flax` output or init:tiny. Writes MODEL_DIR/results.json and config.gin and "
        "prints the per-language table.",
        gin_files=GIN_FILES,
        example="python -m xlmeta_jax.finetune --gin_file=gin/finetune/pawsx.gin "
                "--gin_file=gin/finetune/demo.gin --gin.INITIAL_CHECKPOINT_PATH=\"'init:tiny'\" "
                "--gin.MODEL_DIR=\"'/tmp/pawsx_demo'\"",
        flags=(("--seeds=N", "fine-tune N times (seeds seed .. seed+N-1), report mean ± std"),
               ("--process_count=N", "runs on one host: N > 1 (or a multi-host TPU VM "
                "slice) stops at once")),
    )


def _own_flags() -> errors.ArgumentParser:
    parser = errors.own_flags_parser("python -m xlmeta_jax.finetune")
    parser.add_argument("--seeds", type=errors.positive_int, default=None)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Parses gin flags and ``--seeds``, runs the configured ``finetune``, prints its table."""
    argv = sys.argv[1:] if argv is None else list(argv)
    own, argv = _own_flags().parse_known_args(argv)
    seeds = own.seeds
    if not gin_cli.wants_help(argv):
        # Every host of a pod would fine-tune alone and write the same MODEL_DIR: refuse
        # before any checkpoint or data is read and before MODEL_DIR exists.
        argv = hosts.require_one_host(argv, "finetune")
    flags = gin_cli.parse_command_line(argv, doc=help_text(),
                                       example="gin/finetune/tydiqa.gin")
    if flags is None:
        return {}
    logs.quiet_start()
    gin_cli.apply_gin(flags.gin_files, flags.bindings, flags.search_paths, check_macros=True)
    # After parsing: gin logs every include-path probe at INFO.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if evaluation_runs.bound_task() == embedding_config.TASK:
        # gin/finetune/embeddings.gin: contrastive training, scored before and after.
        logs.show_progress()
        results = embedding_run.train_embeddings(evaluation_runs.embeddings_config())
        print(embedding_run.format_table(results))
        return results
    results = evaluation_finetune.finetune(
        evaluation_runs.finetune_config(**({} if seeds is None else {"num_seeds": seeds})))
    print(evaluation_results.format_table(results))
    return results


if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.finetune")
