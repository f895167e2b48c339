"""The experiment's configuration, the state of its folder and its stages.

:func:`experiment` checks the settings (gin/experiments/*.gin bind them, through
``xlmeta_jax.cli``); :func:`run` prepares the corpus, pretrains every arm x seed with
:func:`xlmeta_jax.pretrain.trainer.train`, evaluates each final checkpoint as soon as it
exists with :func:`xlmeta_jax.evaluation.finetune.finetune` (one ``FineTuneConfig`` per
task, made from the task's gin files) and writes ``results.json`` and the report. Each
stage first looks at what MODEL_DIR already holds, so a rerun resumes.

Layout of MODEL_DIR: ``pretrain/<arm>/seed<k>/`` (a trainer run each),
``eval/<arm>/seed<k>/<task>/`` (a fine-tune run each), ``experiment.json`` (the
plan, checked on resume), ``config.gin``, ``results.json``, ``report.md``, ``*.png``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from xlmeta_jax import errors, files
from xlmeta_jax.data import feeding
from xlmeta_jax.data.corpora import Corpora
from xlmeta_jax.evaluation import finetune as evaluation_finetune
from xlmeta_jax.evaluation import tasks as evaluation_tasks
from xlmeta_jax.experiment.arms import ALL_ARMS, ARMS, ArmError, Budget
from xlmeta_jax.experiment.results import write_results
from xlmeta_jax.experiment.spec import Experiment
from xlmeta_jax.experiment.state import (
    ExperimentError,
    check_model_dir,
    evaluation_done,
    final_checkpoint,
    pretraining_done,
)
from xlmeta_jax.model import network
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain import trainer

log = logging.getLogger("xlmeta_jax.train")


# ============================================================================
# Configuration.
# ============================================================================


def experiment(
    *,
    name: str = "experiment",
    model_dir: str,
    arms: Sequence[str] = ARMS,
    seeds: Sequence[int] = (0, 1),
    meta_steps: int,
    xling_steps: int,
    batch_size: int,
    sequence_length: int,
    model: network.EncoderConfig,
    optimizer: OptimizerConfig,
    english_task: str,
    xling_mixture: str,
    tasks: Sequence[str] = ("pawsx", "xnli", "panx", "udpos", "tatoeba"),
    finetune_gin_files: Sequence[str] = (),
    finetune_bindings: Sequence[str] = (),
    finetune_seeds: int = 1,
    data_dir: str | None = None,
    prepare: Callable[[], Any] | None = None,
    corpora: Corpora | None = None,
    feeder: Callable[..., Any] = feeding.make_mlm_iterator,
    config_text: str | None = None,
    train: Callable[..., dict] = trainer.train,
    train_settings: dict | None = None,
    finetunes: dict | None = None,
    recipes: dict | None = None,
    released: dict | None = None,
) -> Experiment:
    """The experiment's settings, checked (gin entry point of the experiment).

    Args:
      name: shown in the report.
      model_dir: the experiment's folder (gin macro MODEL_DIR).
      arms: arms to run, some of :data:`ALL_ARMS` (default: :data:`ARMS`, not annealed).
      seeds: pretraining seeds (init, dropout, data order); each arm runs each seed, and
        the fine-tuning of a checkpoint uses the same seed.
      meta_steps: English steps of the meta arm (META_STEPS).
      xling_steps: multilingual steps of the meta arm (XLING_STEPS).
      batch_size: global batch of every phase.
      sequence_length: packed sequence length of every phase.
      model: the encoder, e.g. ``@xlmeta_jax.model.network.get_config()``.
      optimizer: AdamW settings of every phase (its total_steps is set per phase).
      english_task: seqio task of the English phase.
      xling_mixture: seqio mixture of the multilingual phases.
      tasks: evaluation tasks, each run with ``gin/finetune/<task>.gin``.
      finetune_gin_files: gin files applied after each task's file (e.g. a size override).
      finetune_bindings: gin bindings applied after those files.
      finetune_seeds: N fine-tuning runs per checkpoint and task (seeds k*N .. k*N + N - 1
        for pretraining seed k; the evaluation reports their mean).
      data_dir: evaluation data, laid out like ``../shared/data`` (the fine-tune
        command's DATA_DIR; None: its default).
      prepare: called once before anything trains (e.g. writes the corpus and vocabulary).
      corpora: the corpus settings of the pretraining tasks (default: ``Corpora()``).
      feeder: builds a phase's batches (``feeding.make_mlm_iterator``).
      config_text: the experiment's configuration, for MODEL_DIR/config.gin.
      train: runs one arm x seed (default :func:`trainer.train` with its defaults).
      train_settings: the mesh_shape, rng_impl and microbatches ``train`` applies.
      finetunes: per task, its ``FineTuneConfig`` (the checkpoint, folder and seed are
        set per run); a task without one is refused when it is evaluated.
      recipes: per recipe arm (``arms.RECIPES``), the function it calls instead of the
        recipe's own (the command passes gin's configurables: ``experiment_runs.recipes``).
      released: arms that are released models, not pretrained here: arm name -> a Hugging
        Face folder (mmBERT, ModernBERT, XLM-R as released). Each is evaluated exactly as
        the pretrained arms, per seed (the fine-tuning seeds), in its own tokenizer; it is
        run after ``arms``.
    """
    released = dict(released or {})
    for arm, folder in released.items():
        if arm in ALL_ARMS or not isinstance(arm, str) or not arm.isidentifier():
            raise ExperimentError(f"experiment.released: {arm!r} must be a new arm name (a "
                                  f"word, none of {ALL_ARMS})")
        if not os.path.isfile(os.path.join(os.fspath(folder), "config.json")):
            raise ExperimentError(f"experiment.released[{arm!r}] = {folder!r} is not a "
                                  "Hugging Face model folder (no config.json)")
    arms = tuple(arms) + tuple(a for a in released if a not in arms)
    bad = [a for a in arms if a not in ALL_ARMS and a not in released]
    if bad or not arms or len(set(arms)) != len(arms):
        raise ExperimentError(f"experiment.arms={list(arms)}: expected distinct arms of "
                              f"{ALL_ARMS}")
    seeds = tuple(seeds)
    if not seeds or len(set(seeds)) != len(seeds) or not all(
            isinstance(s, int) and s >= 0 for s in seeds):
        raise ExperimentError(f"SEEDS (experiment.seeds) = {list(seeds)}: expected distinct "
                              "integers >= 0")
    for key, value in (("meta_steps", meta_steps), ("xling_steps", xling_steps),
                       ("batch_size", batch_size), ("sequence_length", sequence_length)):
        if not errors.is_count(value):
            raise ExperimentError(f"experiment.{key}={value!r}: expected a positive integer")
    if not errors.is_count(finetune_seeds):
        raise ExperimentError(f"experiment.finetune_seeds={finetune_seeds!r}: expected an "
                              "integer >= 1")
    if not isinstance(model, network.EncoderConfig):
        raise ExperimentError("experiment.model must be an EncoderConfig (@xlmeta_jax.model."
                              f"network.get_config()), got {type(model).__name__}")
    if not isinstance(optimizer, OptimizerConfig):
        raise ExperimentError("experiment.optimizer must be an OptimizerConfig "
                              f"(@xlmeta_jax.model.optimizer.OptimizerConfig()), got "
                              f"{type(optimizer).__name__}")
    tasks = tuple(tasks)

    unknown = [t for t in tasks if t not in evaluation_tasks.names()]
    if unknown or len(set(tasks)) != len(tasks):
        raise ExperimentError(f"experiment.tasks={list(tasks)}: expected distinct tasks of "
                              f"{sorted(evaluation_tasks.names())}")
    model_dir = files.user_path(model_dir, "MODEL_DIR")
    data_dir = files.user_path(data_dir, "experiment.data_dir")
    exp = Experiment(
        name=name, model_dir=model_dir, arms=arms, seeds=seeds,
        budget=Budget(meta_steps, xling_steps, batch_size, sequence_length),
        model=model, optimizer=optimizer, english_task=english_task,
        xling_mixture=xling_mixture, tasks=tasks,
        finetune_gin_files=tuple(finetune_gin_files),
        finetune_bindings=tuple(finetune_bindings), finetune_seeds=finetune_seeds,
        data_dir=data_dir, prepare=prepare,
        # The joint arm's mixture takes the meta arm's English share (tasks.register adds
        # xlmeta_joint with it).
        corpora=dataclasses.replace(Corpora() if corpora is None else corpora,
                                    joint_english_share=Budget(
                                        meta_steps, xling_steps, batch_size,
                                        sequence_length).english_share),
        feeder=feeder, config_text=config_text, train=train,
        train_settings=dict(train_settings or {}), finetunes=dict(finetunes or {}),
        recipes=dict(recipes or {}),
        released={a: os.path.abspath(os.fspath(f)) for a, f in released.items()},
    )
    for arm in arms:
        try:
            exp.phases(arm)
        except ArmError as e:
            raise ExperimentError(str(e)) from None
    return exp


# ============================================================================
# Stages: pretrain, evaluate, collect.
# ============================================================================


def pretrain(exp: Experiment, arm: str, seed: int) -> dict:
    """Runs (or resumes) one arm x seed with the trainer; returns the trainer's summary."""
    done = pretraining_done(exp, arm, seed)
    if done is not None:
        if arm in exp.released:
            log.info("[%s seed %d] a released model, evaluated as it is: %s", arm, seed,
                     exp.released[arm])
        else:
            log.info("[%s seed %d] pretraining finished earlier (%s)", arm, seed,
                     exp.run_dir(arm, seed))
        return done
    log.info("[%s seed %d] pretraining: %s", arm, seed,
             " then ".join(f"{p.task} x {p.num_steps} steps" for p in exp.phases(arm)))
    return exp.train(model_dir=exp.run_dir(arm, seed), model=exp.model,
                     phases=exp.phases(arm), seed=seed, corpora=exp.corpora,
                     feeder=exp.feeder, config_text=exp.config_text,
                     **({"merge": m} if (m := exp.merge(arm)) else {}))


def finetune_argv(exp: Experiment, arm: str, seed: int, task: str) -> list[str]:
    """Arguments of ``python -m xlmeta_jax.finetune`` for one evaluation."""
    checkpoint = final_checkpoint(exp, arm, seed) or os.path.join(exp.run_dir(arm, seed),
                                                                  "<final checkpoint>")
    return [
        f"--gin_file=finetune/{task}.gin",
        *(f"--gin_file={f}" for f in exp.finetune_gin_files),
        *([f"--gin.DATA_DIR={os.path.abspath(exp.data_dir)!r}"] if exp.data_dir else []),
        *(f"--gin_bindings={b}" for b in exp.finetune_bindings),
        f"--gin.INITIAL_CHECKPOINT_PATH={checkpoint!r}",
        f"--gin.MODEL_DIR={exp.eval_dir(arm, seed, task)!r}",
        f"--gin.finetune.seed={seed * exp.finetune_seeds}",
        *([f"--seeds={exp.finetune_seeds}"] if exp.finetune_seeds > 1 else []),
    ]


def evaluation_config(exp: Experiment, arm: str, seed: int, task: str,
                      checkpoint: str) -> evaluation_finetune.FineTuneConfig:
    """The evaluation of one arm x seed's final checkpoint on ``task``.

    The task's config (its gin files with the experiment's fine-tune files and
    bindings) with this run's checkpoint, folder and seeds: fine-tuning seeds
    ``seed * finetune_seeds`` onwards. Its config.gin is the task's, with the values of
    this run appended (as ``finetune_argv`` binds them).
    """
    template = exp.finetunes.get(task)
    if template is None:
        raise ExperimentError(f"no fine-tuning config of task {task!r} (experiment.tasks)")
    model_dir = exp.eval_dir(arm, seed, task)
    first_seed = seed * exp.finetune_seeds
    config_text = template.config_text
    if config_text is not None:
        config_text += (f"\n# This run of the experiment:\nINITIAL_CHECKPOINT_PATH = "
                        f"{checkpoint!r}\nMODEL_DIR = {model_dir!r}\n"
                        f"finetune.seed = {first_seed}\n")
    return dataclasses.replace(
        template, initial_checkpoint_path=checkpoint, model_dir=model_dir,
        settings=dataclasses.replace(template.settings, seed=first_seed),
        num_seeds=exp.finetune_seeds, config_text=config_text)


def evaluate(exp: Experiment, arm: str, seed: int, task: str) -> dict:
    """Fine-tunes / evaluates one checkpoint on one task (unless done earlier)."""
    checkpoint = final_checkpoint(exp, arm, seed)
    if checkpoint is None:
        raise ExperimentError(f"[{arm} seed {seed}] {task}: pretraining has not finished")
    done = evaluation_done(exp, arm, seed, task, checkpoint)
    if done is not None:
        log.info("[%s seed %d] %s evaluated earlier", arm, seed, task)
        return done
    log.info("[%s seed %d] %s (as python -m xlmeta_jax.finetune %s)", arm, seed, task,
             " ".join(finetune_argv(exp, arm, seed, task)))
    evaluation_finetune.finetune(evaluation_config(exp, arm, seed, task, checkpoint))
    results = evaluation_done(exp, arm, seed, task, checkpoint)
    if results is None:
        raise ExperimentError(f"the {task} evaluation of {checkpoint} wrote no results.json")
    return results


def check_hosts(exp: Experiment) -> None:
    """Refuses, before anything runs, an experiment with evaluations on several processes.

    The evaluations run on one host (every host would fine-tune alone and write the
    same files): on a pod the experiment can pretrain only,
    and a rerun of the same command on one host resumes with the evaluations.

    Raises:
      ExperimentError: ``jax.process_count() > 1`` and ``experiment.tasks`` is not empty.
    """
    if jax.process_count() > 1 and exp.tasks:
        raise ExperimentError(
            f"the experiment's evaluations run on one host: this is process "
            f"{jax.process_index()} of {jax.process_count()}; pretrain on the pod with "
            "--gin.xlmeta_jax.experiment.runner.experiment.tasks=[] and rerun the command without "
            "it on one host (one VM) to evaluate")


def run(exp: Experiment, command: str = "") -> dict:
    """Runs (or resumes) the whole experiment; returns its results."""
    check_hosts(exp)
    # One writer of the experiment's own files when a pod pretrains (check_hosts).
    writer = jax.process_index() == 0
    check_model_dir(exp, write=writer)
    if writer and exp.config_text is not None:
        files.write_atomic(os.path.join(exp.model_dir, "config.gin"), exp.config_text)
    t0 = time.time()
    todo = [(a, s) for a in exp.arms for s in exp.seeds if pretraining_done(exp, a, s) is None]
    if todo and exp.prepare is not None:
        exp.prepare()
    # Each checkpoint is evaluated as soon as it exists: results.json grows run by run.
    for arm in exp.arms:
        for seed in exp.seeds:
            pretrain(exp, arm, seed)
            for task in exp.tasks:
                evaluate(exp, arm, seed, task)
            write_results(exp, command)
    results = write_results(exp, command)
    log.info("experiment %s finished in %s: %s", exp.name,
             format_duration(time.time() - t0),
             os.path.join(exp.model_dir, "report.md"))
    return results


def format_duration(seconds: float) -> str:
    """``1h02m`` / ``3m05s`` / ``12s``."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"
