"""``python -m xlmeta_jax.train``: the pretraining command (:mod:`xlmeta_jax.cli.train`)."""

from xlmeta_jax.cli.train import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    run()
