"""Zero-shot cross-lingual fine-tuning: train on English, evaluate on every language.

:func:`finetune` runs one :class:`FineTuneConfig` (``python -m xlmeta_jax.finetune``
builds it from the gin bindings ``finetune.<field>``, see
:mod:`xlmeta_jax.cli.configurables`). It loads the encoder
(:mod:`xlmeta_jax.evaluation.encoders`), fine-tunes it with the task's head
(:mod:`xlmeta_jax.evaluation.models`) on the English training data with XTREME's
recipe, keeps the parameters that score best on English development data where
XTREME's scripts do (``--save_only_best_checkpoint``: every ``eval_every`` steps,
``--save_steps``; XNLI, PAWS-X, PAN-X, UD POS), evaluates each target language, repeats
for ``num_seeds`` seeds, and writes ``MODEL_DIR/results.json``
(:mod:`xlmeta_jax.evaluation.results`), ``MODEL_DIR/config.gin`` (``config_text``) and,
for QA, the predicted answers per language under ``MODEL_DIR/predictions/``. A retrieval
task fine-tunes nothing: its own :meth:`evaluate` runs instead. What differs between
tasks is asked of the task object (:mod:`xlmeta_jax.evaluation.tasks`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from xlmeta_jax import errors, files, hosts
from xlmeta_jax.evaluation import (
    demo_vocab,
    encoders,
    qa_decoding,
    readers,
    scorers,
    tasks,
    training,
)
from xlmeta_jax.evaluation.models import FineTuneModel
from xlmeta_jax.evaluation.results import aggregate, write_results
from xlmeta_jax.evaluation.settings import (
    FineTuneSettings,
    RetrievalSettings,
    settings_for_encoder,
)
from xlmeta_jax.evaluation.tasks.base import FineTunedTask, TaskError
from xlmeta_jax.model import partitioning
from xlmeta_jax.pretrain import run_dir

log = logging.getLogger(__name__)

DATA_SOURCES = ("local", "tfds")


@dataclasses.dataclass(frozen=True)
class FineTuneConfig:
    """One evaluation run: which task, which checkpoint, where, with which settings."""

    # A registered task (xlmeta_jax.evaluation.tasks.names()).
    task: str
    # The checkpoint evaluated: a pretraining run, phase or step folder, a Hugging Face
    # XLM-R folder, a `hf to_flax` output or init:<size> (see evaluation/encoders.py).
    initial_checkpoint_path: str
    # Output folder: results.json, config.gin, predictions/.
    model_dir: str
    # Folder laid out like ../shared/data (None: that folder).
    data_dir: str | None = None
    # SentencePiece model overriding the checkpoint's; None with init:<size> trains a demo
    # vocabulary into MODEL_DIR.
    vocab_path: str | None = None
    # Evaluation languages (None: all of the task's).
    languages: Sequence[str] | None = None
    # Fine-tuning hyper-parameters (retrieval uses the sequence length, evaluation batch,
    # sentence limit, dtype and seed).
    settings: FineTuneSettings = dataclasses.field(default_factory=FineTuneSettings)
    # Layer, pooling and neighbourhood of the retrieval tasks.
    retrieval: RetrievalSettings = dataclasses.field(default_factory=RetrievalSettings)
    # Let a Hugging Face checkpoint load from pytorch_model.bin (a pickle).
    allow_pickle: bool = False
    # "local" (files under data_dir) or "tfds" (TFDS builders; internet the first time).
    data_source: str = "local"
    # TFDS data directory (None: TFDS's default).
    tfds_data_dir: str | None = None
    # Independent fine-tuning runs (seeds seed, seed + 1, ...): mean and std over them.
    num_seeds: int = 1
    # Written to MODEL_DIR/config.gin once the inputs are read (the command's operative
    # gin config); None writes no config.gin.
    config_text: str | None = None

    def __post_init__(self):
        # Paths as a shell user means them (~, $HOME), by their gin macros' names.
        for field, setting in (("initial_checkpoint_path", "INITIAL_CHECKPOINT_PATH"),
                               ("model_dir", "MODEL_DIR"), ("data_dir", "DATA_DIR"),
                               ("vocab_path", "VOCAB_PATH"),
                               ("tfds_data_dir", "finetune.tfds_data_dir")):
            object.__setattr__(self, field, files.user_path(getattr(self, field), setting))

    @classmethod
    def from_kwargs(cls, **kwargs) -> FineTuneConfig:
        """A config from flat keyword arguments: FineTuneSettings fields go to ``settings``.

        Raises:
          TypeError: naming the arguments that are neither a config nor a settings field.
        """
        own = {f.name for f in dataclasses.fields(cls)} - {"settings"}
        known = {f.name for f in dataclasses.fields(FineTuneSettings)}
        unknown = sorted(set(kwargs) - own - known)
        if unknown:
            raise TypeError(f"finetune: unknown settings {unknown}; known: {sorted(known)}")
        settings = FineTuneSettings(**{k: v for k, v in kwargs.items() if k in known})
        return cls(settings=settings, **{k: v for k, v in kwargs.items() if k in own})


def _subsample(examples: list, limit: int | None, seed: int) -> list:
    if limit is None or len(examples) <= limit:
        return examples
    idx = np.sort(np.random.default_rng(seed).choice(len(examples), limit, replace=False))
    return [examples[i] for i in idx]


def _arrays(feats) -> dict[str, np.ndarray]:
    return feats if isinstance(feats, dict) else feats.arrays()


def _evaluate_language(task: FineTunedTask, lang, examples, runner, tokenizer,
                       s: FineTuneSettings, eval_batch_size, feats=None):
    feats = feats if feats is not None else task.features(examples, tokenizer, s)
    out = runner.predict(_arrays(feats)["input_ids"], eval_batch_size)
    return task.score(lang, examples, feats, out, s)


def _run_seed(task: FineTunedTask, seed, s: FineTuneSettings, cfg, loaded, train_examples,
              select_examples, eval_examples, tokenizer, eval_batch_size,
              model_dir) -> dict[str, Any]:
    """Trains with model selection and evaluates every language, for one seed."""
    train_examples = _subsample(train_examples, s.max_train_examples, seed)
    train_feats = _arrays(task.features(train_examples, tokenizer, s))
    n_train = len(train_feats["input_ids"])
    steps = s.train_steps or max(1, int(s.num_epochs * n_train // s.batch_size))
    log.info("%s seed %d: %d training examples -> %d features, %d steps", task.name, seed,
             len(train_examples), n_train, steps)
    model = FineTuneModel(cfg, task.head, task.num_labels)
    params = training.init_params(model, loaded.params, s.max_seq_length, seed)
    tx = training.make_finetune_optimizer(
        learning_rate=s.learning_rate, warmup_steps=s.warmup_steps, total_steps=steps,
        weight_decay=s.weight_decay, b1=s.adam_b1, b2=s.adam_b2, eps=s.adam_eps,
        max_grad_norm=s.max_grad_norm, schedule_offset=task.schedule_offset,
    )
    runner = training.Runner(model, params, tx, partitioning.create_mesh(data=-1), seed)
    select = select_examples if s.eval_every is not None else None
    select_feats = task.features(select, tokenizer, s) if select else None
    best = {"score": 0.0, "step": None, "params": None}
    history = []

    def consider(step):
        scores, _ = _evaluate_language(task, "en", select, runner, tokenizer, s,
                                       eval_batch_size, select_feats)
        score = task.selection_score(scores)
        history.append({"step": step, "score": score})
        log.info("%s seed %d step %d: English dev %.2f", task.name, seed, step, score)
        # Strictly better, as XTREME's `result > best_score` (first best wins).
        if score > best["score"]:
            best.update(score=score, step=step, params=runner.host_params())

    losses, t_train = [], time.time()
    for step, idx in enumerate(training.batches(n_train, s.batch_size, steps, seed), start=1):
        losses.append(runner.train_step({k: v[idx] for k, v in train_feats.items()}))
        if step % s.log_every == 0 or step == steps:
            recent = float(np.mean(jax.device_get(losses[-s.log_every :])))
            log.info("step %d/%d loss %.4f", step, steps, recent)
        # As XTREME: only at multiples of --save_steps, never at a final step between
        # them; with no pass at all (fewer steps), the final parameters are kept.
        if select and step % s.eval_every == 0:
            consider(step)
    losses = [float(x) for x in jax.device_get(losses)]
    train_seconds = time.time() - t_train
    bad = [i for i, x in enumerate(losses, start=1) if not math.isfinite(x)]
    if bad:
        raise FloatingPointError(f"{task.name}: non-finite training loss (first at step {bad[0]})")
    if best["params"] is not None and best["step"] != steps:
        runner.load_params(best["params"])
    selected = best["step"] if best["params"] is not None else steps

    per_lang = {}
    for lang, examples in eval_examples.items():
        scores, predictions = _evaluate_language(task, lang, examples, runner, tokenizer, s,
                                                 eval_batch_size)
        per_lang[lang] = scores
        log.info("%s %s seed %d: %s", task.name, lang, seed,
                 {k: round(v, 2) for k, v in scores.items()})
        if predictions is not None:
            folder = model_dir / "predictions" / (f"seed{seed}" if seed != s.seed else "")
            folder.mkdir(parents=True, exist_ok=True)
            files.write_atomic(folder / f"{lang}.json",
                               json.dumps(predictions, ensure_ascii=False, indent=1))
    return {
        "seed": seed,
        "languages": per_lang,
        **scorers.transfer_summary(per_lang, task.metric),
        "selected_step": selected,
        "selection": history,
        "train": {
            "examples": len(train_examples),
            "features": n_train,
            "steps": steps,
            "first_loss": losses[0],
            "final_loss": float(np.mean(losses[-max(1, min(s.log_every, len(losses))):])),
            "seconds": train_seconds,
        },
    }


def _check_model_dir(model_dir: pathlib.Path, checkpoint: str, task: str | None = None
                     ) -> None:
    """Refuses a MODEL_DIR that is a file, or holds the evaluation of another checkpoint
    or another task (it would be replaced).

    Raises:
      errors.UserError: naming MODEL_DIR (and both checkpoints).
    """
    problem = files.not_a_folder(model_dir, "MODEL_DIR")
    if problem:
        raise errors.UserError(problem)
    path = model_dir / "results.json"
    if not path.is_file():
        return
    try:
        stored = json.loads(path.read_text())
        recorded = (stored.get("model") or {}).get("checkpoint")
        recorded_task = stored.get("task")
    except (ValueError, OSError, AttributeError):
        recorded, recorded_task = None, None
    if task is not None and recorded_task is not None and recorded_task != task:
        raise errors.UserError(
            f"MODEL_DIR {model_dir} holds the results of task {recorded_task}; {task} "
            "would replace them: choose another MODEL_DIR for this task"
        )
    same = recorded is not None and (recorded == checkpoint or (
        ":" not in checkpoint and os.path.abspath(recorded) == os.path.abspath(checkpoint)))
    if not same:
        raise errors.UserError(
            f"MODEL_DIR {model_dir} holds the results of checkpoint {recorded or 'unknown'}, "
            f"not {checkpoint}: choose another MODEL_DIR for this checkpoint"
        )


def _record_config(model_dir: pathlib.Path, config_text: str | None) -> None:
    """Writes MODEL_DIR/config.gin, called once the checkpoint and data have been read.

    So a run that fails on its inputs leaves neither the file nor MODEL_DIR behind.
    """
    if config_text is None:
        return
    model_dir.mkdir(parents=True, exist_ok=True)
    files.write_atomic(model_dir / "config.gin", config_text)


def _check(config: FineTuneConfig) -> None:
    s = config.settings
    if config.num_seeds < 1:
        raise TaskError(f"--seeds must be >= 1, got {config.num_seeds}")
    if s.qa_unknown_pieces not in qa_decoding.UNKNOWN_PIECES:
        raise TaskError(f"finetune.qa_unknown_pieces must be one of "
                        f"{qa_decoding.UNKNOWN_PIECES}, got {s.qa_unknown_pieces!r}")
    if s.eval_every is not None and s.eval_every < 1:
        raise TaskError(f"finetune.eval_every must be >= 1 or None, got {s.eval_every}")
    _check_model_dir(pathlib.Path(config.model_dir), config.initial_checkpoint_path,
                     config.task)
    if config.data_source not in DATA_SOURCES:
        raise TaskError(f"data_source must be 'local' or 'tfds', got {config.data_source!r}")


def _retrieve(task, config: FineTuneConfig) -> dict[str, Any]:
    """A retrieval task's evaluation (no fine-tuning), with the run's provenance."""
    s = config.settings
    if config.data_source != "local":
        raise TaskError(f"{task.name} has no TFDS builder: use data_source='local'")
    model_dir = pathlib.Path(config.model_dir)
    results = task.evaluate(
        config.initial_checkpoint_path, model_dir, data_dir=config.data_dir,
        vocab_path=config.vocab_path, languages=config.languages, settings=config.retrieval,
        max_seq_length=s.max_seq_length, batch_size=s.eval_batch_size,
        max_sentences=s.max_eval_examples, dtype=s.dtype, seed=s.seed,
        allow_pickle=config.allow_pickle,
        provenance={"provenance": task.provenance(
            "local", str(readers.resolve_data_dir(config.data_dir)), dataclasses.asdict(s),
            None)},
    )
    _record_config(model_dir, config.config_text)
    return results


def finetune(config: FineTuneConfig) -> dict[str, Any]:
    """Fine-tunes on English and evaluates zero-shot on every language of the task.

    Args:
      config: the run (see :class:`FineTuneConfig`).

    Returns:
      The results dictionary written to ``MODEL_DIR/results.json``.

    Raises:
      hosts.MultiHostError: in a multi-process run (``jax.process_count() > 1``): the
        loop feeds host-local batches and one process writes MODEL_DIR.
      TaskError: an unknown task or language, or a bad setting.
    """
    if jax.process_count() > 1:
        raise hosts.MultiHostError(hosts.one_host_message(
            "finetune", jax.process_index(), jax.process_count()))
    task = tasks.get(config.task)
    _check(config)
    with _held(pathlib.Path(config.model_dir)):
        if not task.fine_tunes:
            return _retrieve(task, config)
        return _finetune(task, config)


@contextlib.contextmanager
def _held(model_dir: pathlib.Path):
    """MODEL_DIR locked for this evaluation (a second one there is refused, naming this).

    A MODEL_DIR that the evaluation created and that holds nothing but the lock when it
    ends (the run failed on its inputs) is removed again.
    """
    if not run_dir.RunLock.supported(os.fspath(model_dir)):
        yield
        return
    created = not model_dir.exists()
    lock = run_dir.RunLock(os.fspath(model_dir)).acquire()
    try:
        yield
    finally:
        lock.release()
        if created and [p.name for p in model_dir.iterdir()] == [run_dir.LOCK_NAME]:
            (model_dir / run_dir.LOCK_NAME).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                model_dir.rmdir()


def _finetune(task, config: FineTuneConfig) -> dict[str, Any]:
    s = config.settings
    langs = task.check_languages(config.languages)
    model_dir = pathlib.Path(config.model_dir)
    data_dir, tfds_dir = config.data_dir, config.tfds_data_dir
    split = dict(train_fraction=s.train_fraction, select_fraction=s.select_fraction)
    if config.data_source == "local":
        resolved_dir = str(readers.resolve_data_dir(data_dir))
        load_train = lambda: task.load_train(data_dir, **split)  # noqa: E731
        load_select = lambda: task.load_select(data_dir, **split)  # noqa: E731
        load_eval = lambda lang: task.load_eval(lang, data_dir, **split)  # noqa: E731
    else:
        resolved_dir = tfds_dir
        if config.languages is None:
            langs = tuple(x for x in langs if x in task.tfds_languages)
        for lang in langs:
            task.check_tfds(lang)
        load_train = lambda: task.tfds_train(tfds_dir)  # noqa: E731
        load_select = lambda: task.tfds_select(tfds_dir)  # noqa: E731
        load_eval = lambda lang: task.tfds_eval(lang, tfds_dir)  # noqa: E731

    n_dev = jax.device_count()
    if s.batch_size % n_dev:
        raise TaskError(
            f"batch_size={s.batch_size} is not divisible by the {n_dev} devices "
            "(data-parallel fine-tuning splits every batch over all devices)"
        )
    eval_batch_size = math.ceil(s.eval_batch_size / n_dev) * n_dev

    vocab_path = config.vocab_path
    if config.initial_checkpoint_path.startswith("init:") and vocab_path is None:
        model_dir.mkdir(parents=True, exist_ok=True)
        vocab_path = demo_vocab.build_demo_vocab(model_dir / "demo_spm", data_dir)
    loaded = encoders.load_encoder(config.initial_checkpoint_path, vocab_path,
                                   allow_pickle=config.allow_pickle)
    cfg = loaded.config.replace(dtype=s.dtype)
    # results.json's settings then record the learning rate actually used.
    s = settings_for_encoder(s, cfg.num_layers)
    if s.dropout_rate is not None:
        cfg = cfg.replace(dropout_rate=s.dropout_rate, attention_dropout_rate=s.dropout_rate)
    if s.max_seq_length > cfg.max_length:
        raise TaskError(
            f"max_seq_length={s.max_seq_length} exceeds the encoder's {cfg.max_length} positions"
        )
    tokenizer = loaded.tokenizer

    # Read every language first, so a missing file fails before training.
    t0 = time.time()
    train_examples = load_train()
    select_examples = load_select() if s.eval_every is not None else None
    if select_examples is not None:
        select_examples = select_examples[: s.max_eval_examples]
    eval_examples = {lang: load_eval(lang)[: s.max_eval_examples] for lang in langs}
    _record_config(model_dir, config.config_text)
    runs = [
        _run_seed(task, s.seed + i, s, cfg, loaded, train_examples, select_examples,
                  eval_examples, tokenizer, eval_batch_size, model_dir)
        for i in range(config.num_seeds)
    ]
    results = {
        "task": task.name,
        "metric": task.metric,
        **aggregate(runs, task.metric),
        "seeds": runs,
        "provenance": task.provenance(config.data_source, resolved_dir, dataclasses.asdict(s),
                                      len(train_examples)),
        "model": {
            "checkpoint": config.initial_checkpoint_path,
            "source": loaded.source,
            "vocab_path": tokenizer.model_path,
            "encoder": dataclasses.asdict(cfg),
        },
        "train": runs[0]["train"],
        "total_seconds": time.time() - t0,
        "settings": {**dataclasses.asdict(s), "num_seeds": config.num_seeds},
        "data_source": config.data_source,
    }
    log.info("results written to %s", write_results(model_dir, results))
    return results
