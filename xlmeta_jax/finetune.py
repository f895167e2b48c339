r"""Zero-shot cross-lingual evaluation: fine-tune on English, test on every language.

Usage (t5x-style gin flags, see :mod:`xlmeta_jax.gin_cli`)::

    python -m xlmeta_jax.finetune --gin_file=gin/finetune/tydiqa.gin \
        --gin.INITIAL_CHECKPOINT_PATH="'/ckpts/meta/phase2'" \
        --gin.MODEL_DIR="'/runs/tydiqa_meta'"

``INITIAL_CHECKPOINT_PATH`` is a pretraining checkpoint, a Hugging Face XLM-R
directory, a ``python -m xlmeta_jax.hf to_flax`` output, or ``init:tiny`` (random
weights; demos). Writes ``MODEL_DIR/results.json`` and ``MODEL_DIR/config.gin``, and
prints a table of per-language scores. Every ``gin/finetune/*.gin`` file runs this way
(the retrieval ones too). The work is done by
:func:`xlmeta_jax.evaluation.finetuning.finetune`.
"""

from __future__ import annotations

import logging
import sys

from xlmeta_jax import gin_cli


def main(argv: list[str] | None = None) -> dict:
    """Parses gin flags, runs the configured ``finetune`` and prints its table."""
    argv = sys.argv[1:] if argv is None else argv
    flags = gin_cli.parse_command_line(argv, doc=__doc__, example="gin/finetune/tydiqa.gin")
    if flags is None:
        return {}
    # Imported after the flags are checked: pulls in jax.
    from xlmeta_jax.evaluation import finetuning

    gin_cli.apply_gin(flags.gin_files, flags.bindings, flags.search_paths)
    # After parsing: gin logs every include-path probe at INFO.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    results = finetuning.finetune()
    print(finetuning.format_table(results))
    return results


if __name__ == "__main__":
    main()
