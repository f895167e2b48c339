"""The commands: the only package that parses flags and gin files.

* ``flags``         — t5x-style flags (``--gin_file``, ``--gin.NAME=VALUE``, ...) and
  gin parsing with one-line errors;
* ``configurables`` — the gin names both trainers share (model, optimizer, data, phases);
* ``runs``, ``evaluation_runs``, ``experiment_runs`` — our commands' own gin names: the
  trainer's run and recipes; fine-tuning; the experiment (a command imports only its own,
  so ``python -m xlmeta_jax.train`` loads neither evaluation nor the experiment);
* ``train``, ``finetune``, ``experiment``, ``hf`` — the commands' ``main``
  (``python -m xlmeta_jax.train`` etc. are thin aliases of these).
"""
