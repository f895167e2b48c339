"""The pretraining data pipeline: vocabulary, corpora, seqio preprocessing, feeding.

Modules (TensorFlow/seqio are imported only by the pipeline modules, never by
the network, train step or benchmark):

* ``languages``      — the 100 XLM-R/CC-100 language codes (no heavy imports);
* ``mixtures``       — alpha sampling rates and the cached corpus counts (no TF);
* ``vocabulary``     — SentencePiece training command, special ids, fertility;
* ``corpora``        — gin-configurable corpus locations (English, CC-100, mC4);
* ``providers``      — seqio data sources and the alpha-sampled mixture;
* ``preprocessors``  — tokenize, pack and mask inside tf.data;
* ``feeding``        — ``make_mlm_iterator``: sharded global batches, save/restore;
* ``caching``        — offline cache of tokens in seqio's format;
* ``throughput``     — tokens/s of the whole pipeline on this host;
* ``english_pd``     — the shared public-domain English as text files.

The tasks themselves are registered by importing ``tasks`` (names in
``tasks/names.py``). See docs/data.md.
"""
