"""The commands: the only package that parses flags and gin files.

* ``flags``         — t5x-style flags (``--gin_file``, ``--gin.NAME=VALUE``, ...) and
  gin parsing with one-line errors;
* ``configurables`` — every gin-configurable name the gin files bind;
* ``train``, ``finetune``, ``experiment``, ``hf`` — the commands' ``main``
  (``python -m xlmeta_jax.train`` etc. are thin aliases of these).
"""
