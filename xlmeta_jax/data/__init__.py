"""The data: languages, the vocabulary, the pretraining corpora and their seqio tasks.

Modules (TensorFlow/seqio are imported only by the pipeline modules, never by
the model, train step or benchmark; none uses gin):

* ``languages``      — the 100 XLM-R/CC-100 language codes (no heavy imports);
* ``text_files``     — reading and scanning text files, alpha sampling rates and the
  cached corpus counts (no TF);
* ``vocabulary``     — the one SentencePiece trainer, special ids, fertility;
* ``corpora``        — the corpus settings (``Corpora``) and file listing (no TF);
* ``seeds``          — the seeds of a run's data streams (phase and host);
* ``providers``      — seqio data sources of text files and TFDS documents;
* ``preprocessors``  — tokenize, pack and mask inside tf.data;
* ``task_names``, ``tasks`` — the seqio tasks and mixtures and their registration
  (``tasks.register``; the top-level ``tasks`` package re-exports them);
* ``feeding``        — a phase's sharded global batches in one call (``phase_batches``):
  a seqio source's (``make_mlm_iterator``) or the synthetic stream's, save/restore,
  and the iterator's Orbax checkpoint item;
* ``english_pd``, ``demo_corpus``, ``experiment_corpus`` — corpus builders: the shared
  public-domain English as text files, the demo's corpus, the CPU experiment's corpus.

The batch contract is :mod:`xlmeta_jax.model.mlm`; the throughput and offline-cache
commands live in :mod:`xlmeta_jax.tools`. See docs/data.md.
"""
