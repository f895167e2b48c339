r"""Sentence retrieval (Tatoeba, BUCC) of a pretrained encoder, without fine-tuning.

Usage::

    python -m xlmeta_jax.retrieval --gin_file=gin/finetune/tatoeba.gin \
        --gin.INITIAL_CHECKPOINT_PATH="'/ckpts/meta/phase2'" \
        --gin.MODEL_DIR="'/runs/tatoeba_meta'"

The same gin files also run through ``python -m xlmeta_jax.finetune``. Writes
``MODEL_DIR/results.json`` (accuracy per language in both directions at the chosen
layer, and a per-layer sweep) and prints the table. The work is done by
:func:`xlmeta_jax.evaluation.retrieval.evaluate_retrieval`.
"""

from __future__ import annotations

import logging
import sys

from xlmeta_jax import gin_cli


def main(argv: list[str] | None = None) -> dict:
    """Parses gin flags, runs the configured ``evaluate_retrieval``, prints its table."""
    argv = sys.argv[1:] if argv is None else argv
    flags = gin_cli.parse_command_line(argv, doc=__doc__, example="gin/finetune/tatoeba.gin")
    if flags is None:
        return {}
    from xlmeta_jax.evaluation import finetuning, retrieval

    gin_cli.apply_gin(flags.gin_files, flags.bindings, flags.search_paths)
    # After parsing: gin logs every include-path probe at INFO.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    results = retrieval.evaluate_retrieval()
    print(finetuning.format_table(results))
    return results


if __name__ == "__main__":
    main()
