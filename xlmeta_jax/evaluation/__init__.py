"""Zero-shot cross-lingual evaluation: tasks, fine-tuning, retrieval, scorers, readers.

``tasks`` holds one object per benchmark (``tasks.get(name)``); ``finetune.finetune``
runs a :class:`~xlmeta_jax.evaluation.finetune.FineTuneConfig`; ``results`` aggregates
and writes results.json. Nothing in this package imports gin (the command line's
configurables live in :mod:`xlmeta_jax.cli.configurables`), nor TensorFlow or seqio at
module import time.
"""
