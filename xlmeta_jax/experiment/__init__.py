r"""The experiment: meta-pretraining against single-phase baselines at equal compute.

One command pretrains every arm x seed, evaluates each final checkpoint on the
configured tasks (zero-shot: fine-tune on English, test on every language; Tatoeba
retrieval without fine-tuning) and writes ``results.json``, ``report.md`` and PNG
plots into MODEL_DIR::

  python -m xlmeta_jax.experiment --gin_file=gin/experiments/cpu.gin \
    --gin.MODEL_DIR="'runs/cpu_experiment'"

Rerunning the command resumes: finished pretraining runs, fine-tunings and
evaluations are not redone; an interrupted one continues from its last checkpoint.
``--dry_run`` prints the plan and its estimated time (from measured step rates) and
runs nothing. Gin flags as every command (``--gin_file``, ``--gin.NAME=VALUE``,
``--gin_bindings``, ``--gin_search_paths``); docs/experiments.md describes it.

Modules:

* :mod:`~xlmeta_jax.experiment.arms`: the arms (meta, xlmr, joint, xling_only) as
  trainer phases;
* :mod:`~xlmeta_jax.experiment.runner`: configuration (gin), stages, resume;
* :mod:`~xlmeta_jax.experiment.plan`: the plan and its time estimate;
* :mod:`~xlmeta_jax.experiment.report`: tables and plots from results.json;
* :mod:`~xlmeta_jax.experiment.plots`: the figures (chance lines, layers), also the
  notebooks';
* :mod:`~xlmeta_jax.data.experiment_corpus`: the CPU experiment's corpus from ../shared/data.
"""
