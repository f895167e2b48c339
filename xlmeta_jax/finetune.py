"""``python -m xlmeta_jax.finetune``: the fine-tuning command (:mod:`xlmeta_jax.cli.finetune`)."""

from xlmeta_jax import errors
from xlmeta_jax.cli.finetune import main

__all__ = ["main"]

if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.finetune")
