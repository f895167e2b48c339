"""``python -m xlmeta_jax.hf``: the Hugging Face conversion command (:mod:`xlmeta_jax.cli.hf`)."""

from xlmeta_jax import errors
from xlmeta_jax.cli.hf import main

__all__ = ["main"]

if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.hf")
