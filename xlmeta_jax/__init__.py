"""xlmeta_jax: cross-lingual language model meta-pretraining in JAX/Flax."""

# The project's repository: setup.py, README and the notebooks' Colab badges and clone
# cells name it (tests/test_repo.py checks they agree).
REPOSITORY = "https://github.com/xlmeta/xlmeta_jax"
