"""The seqio Tasks and Mixtures of the project: names and registration.

The design card's ``tasks`` package; the code lives in :mod:`xlmeta_jax.data.tasks`
(registration) and :mod:`xlmeta_jax.data.task_names` (names). Importing registers
nothing. Once the corpora are known (after gin is parsed, or in a notebook),
:func:`register` adds the tasks and mixtures through seqio's public registries; then
``seqio.get_mixture_or_task('xlmeta_cc100')`` works as anywhere::

  import seqio, tasks
  tasks.register(vocab_path="/data/spm.model", cc100_dir="/data/cc100",
                 languages=["en", "sw", "zh-Hans"], alpha=0.3)
  ds = seqio.get_mixture_or_task("xlmeta_cc100").get_dataset(
      {"inputs": 512, "targets": 512}, split="train")

Settings: :class:`xlmeta_jax.data.corpora.Corpora`.
"""

from xlmeta_jax.data import task_names as names
from xlmeta_jax.data.tasks import language_probabilities, register

__all__ = ["language_probabilities", "names", "register"]
