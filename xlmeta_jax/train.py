r"""Command line of the trainer (logic: :mod:`xlmeta_jax.trainer`).

  python -m xlmeta_jax.train --gin_file=gin/meta.gin \
    --gin.MODEL_DIR="'/path/run'" --gin.VOCAB_PATH="'/path/spm.model'"
"""

from xlmeta_jax.trainer import run

if __name__ == "__main__":
    run()
