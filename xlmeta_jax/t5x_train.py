"""``python -m xlmeta_jax.t5x_train``: t5x's command, quietly (:mod:`xlmeta_jax.cli.t5x_train`)."""

from xlmeta_jax.cli.t5x_train import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
