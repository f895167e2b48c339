"""The pretraining data pipeline: vocabulary, corpora, seqio preprocessing, feeding.

Modules (TensorFlow/seqio are imported only by the pipeline modules, never by
the network, train step or benchmark; none uses gin):

* ``languages``      — the 100 XLM-R/CC-100 language codes (no heavy imports);
* ``mixtures``       — alpha sampling rates and the cached corpus counts (no TF);
* ``vocabulary``     — SentencePiece training command, special ids, fertility;
* ``corpora``        — the corpus settings (``Corpora``) and file listing (no TF);
* ``providers``      — seqio data sources of text files and TFDS documents;
* ``preprocessors``  — tokenize, pack and mask inside tf.data;
* ``feeding``        — ``make_mlm_iterator``: sharded global batches, save/restore;
* ``english_pd``     — the shared public-domain English as text files.

The tasks and mixtures are registered by ``tasks.register`` (names in
``tasks/names.py``); the batch contract is :mod:`xlmeta_jax.mlm`; the throughput
and offline-cache commands live in :mod:`xlmeta_jax.tools`. See docs/data.md.
"""
