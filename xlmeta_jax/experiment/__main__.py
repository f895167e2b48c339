"""``python -m xlmeta_jax.experiment``: the experiment (:mod:`xlmeta_jax.cli.experiment`)."""

from xlmeta_jax import errors
from xlmeta_jax.cli.experiment import main

if __name__ == "__main__":
    errors.exit_with(main, prog="xlmeta_jax.experiment")
