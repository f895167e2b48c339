"""Zero-shot cross-lingual fine-tuning: train on English, evaluate on every language.

:func:`finetune` is the gin entry point of ``python -m xlmeta_jax.finetune``. It loads
the encoder (:mod:`xlmeta_jax.evaluation.encoders`), fine-tunes it with a task head
(:mod:`xlmeta_jax.evaluation.models`) on the English training data with XTREME's
recipe, keeps the parameters that score best on English development data where
XTREME's scripts do (``--save_only_best_checkpoint``: every ``eval_every`` steps,
``--save_steps``; XNLI, PAWS-X, PAN-X, UD POS), evaluates each target language, repeats for
``num_seeds`` seeds, and writes ``MODEL_DIR/results.json``::

    {"task", "metric",
     "languages": {lang: {metric: mean over seeds, metric + "_std": ..., ...}},
     "average":        mean over all evaluated languages (XTREME's convention),
     "average_std":    std over seeds of the per-seed averages,
     "average_target": mean over the languages other than English,
     "english":        the English score,
     "transfer_gap":   english - average_target,
     "seeds": [{"seed", "languages", "average", "selected_step", ...} per seed],
     "provenance": {data source, train / selection / eval data, scoring,
                    comparable_to_xtreme, differences},
     "model": {...}, "train": {...}, "settings": {...}}

plus ``MODEL_DIR/config.gin`` (the operative gin config) and, for QA, the predicted
answers per language under ``MODEL_DIR/predictions/``. Retrieval tasks (tatoeba, bucc)
are delegated to :func:`xlmeta_jax.evaluation.retrieval.evaluate_retrieval`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import time
from typing import Any

import gin
import jax
import numpy as np

from xlmeta_jax import errors, files, hosts
from xlmeta_jax.evaluation import (
    encoders,
    features,
    protocol,
    qa_decoding,
    readers,
    scorers,
    training,
)
from xlmeta_jax.evaluation.models import FineTuneModel
from xlmeta_jax.model import partitioning

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FineTuneSettings:
    """Hyper-parameters of one fine-tuning run (all settable from gin).

    Defaults are those of XTREME's scripts for a base-size encoder where they are
    shared (``third_party/run_*.py`` argument defaults); the per-task gin files set the
    rest from ``scripts/train_<task>.sh``.
    """

    # Longest input in tokens (XTREME: 128 for classification/tagging, 384 for QA;
    # retrieval: 512).
    max_seq_length: int = 128
    # QA: context tokens between the starts of consecutive windows.
    doc_stride: int = 128
    # QA: questions are truncated to this many tokens.
    max_query_length: int = 64
    # QA: longest answer in tokens considered when decoding.
    max_answer_length: int = 30
    # QA: start / end candidates per window when decoding.
    n_best: int = 20
    # QA: "xtreme" reads an unknown piece as <unk> when decoding answer text, as
    # XTREME's convert_ids_to_tokens (its span then answers with whole words); "text"
    # uses the piece's own text.
    qa_unknown_pieces: str = "xtreme"
    # Training batch size (global; XTREME: 8 per GPU x 4 accumulation steps = 32).
    batch_size: int = 32
    # Evaluation batch size (rounded up to a multiple of the number of devices).
    eval_batch_size: int = 128
    # Training steps; None: `num_epochs` passes over the training features.
    train_steps: int | None = None
    # Epochs when `train_steps` is None (XTREME's --num_train_epochs).
    num_epochs: float = 3.0
    # Peak AdamW learning rate.
    learning_rate: float = 2e-5
    # Peak learning rate instead for a large encoder (24 or more layers), where XTREME's
    # script sets one for xlm-roberta-large (train_xnli.sh: 3e-5); None: `learning_rate`.
    large_learning_rate: float | None = None
    # Steps of linear warm-up from 0 (then linear decay to 0; XTREME's --warmup_steps;
    # may exceed the training steps, as in Hugging Face's schedule).
    warmup_steps: int = 0
    # Decoupled weight decay (not on biases / LayerNorm).
    weight_decay: float = 0.0
    # AdamW beta1, beta2 and epsilon (Hugging Face AdamW defaults, XTREME's).
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    # Gradient clipping by global norm (0 disables).
    max_grad_norm: float = 1.0
    # Model selection on English dev every this many steps (XTREME's --save_steps with
    # --save_only_best_checkpoint: at its multiples only, not at the last step); None:
    # keep the final parameters.
    eval_every: int | None = None
    # Dropout on the encoder and head; None keeps the checkpoint's.
    dropout_rate: float | None = None
    # Compute dtype of the encoder ("float32" or "bfloat16").
    dtype: str = "float32"
    # Use at most this many training examples (None: all), a seeded random subset.
    max_train_examples: int | None = None
    # Evaluate at most this many examples per language (None: all), the first ones;
    # also caps the selection set; retrieval: sentences (pairs) per language.
    max_eval_examples: int | None = None
    # XNLI / PAWS-X: share of English dev lines used for training (see readers).
    train_fraction: float = 0.5
    # XNLI / PAWS-X: share of English dev lines, taken from the training part, held
    # out for model selection. PAN-X: share of English dev held out for model selection
    # (the rest is English's evaluation set). 0: no selection data.
    select_fraction: float = 0.1
    # Seed of head init, data order and dropout; run i of `num_seeds` uses seed + i.
    seed: int = 42
    # Log the training loss every this many steps.
    log_every: int = 50


# ----------------------------------------------------------------------------------------
# Task plumbing
# ----------------------------------------------------------------------------------------


LARGE_NUM_LAYERS = 24


def settings_for_encoder(s: FineTuneSettings, num_layers: int) -> FineTuneSettings:
    """``s`` with the recipe of the encoder's size: XTREME's scripts switch the learning
    rate for xlm-roberta-large (24 layers), so ``large_learning_rate`` replaces
    ``learning_rate`` for an encoder of 24 or more layers."""
    if s.large_learning_rate is not None and num_layers >= LARGE_NUM_LAYERS:
        return dataclasses.replace(s, learning_rate=s.large_learning_rate)
    return s


def _subsample(examples: list, limit: int | None, seed: int) -> list:
    if limit is None or len(examples) <= limit:
        return examples
    idx = np.sort(np.random.default_rng(seed).choice(len(examples), limit, replace=False))
    return [examples[i] for i in idx]


def _features(spec, examples, tokenizer, s: FineTuneSettings):
    if spec.kind == "classification":
        return features.classification_features(examples, tokenizer, s.max_seq_length)
    if spec.kind == "qa":
        return features.qa_features(
            examples,
            tokenizer,
            max_seq_length=s.max_seq_length,
            doc_stride=s.doc_stride,
            max_query_length=s.max_query_length,
        )
    return features.tagging_features(examples, tokenizer, spec.labels, s.max_seq_length)


def _arrays(feats) -> dict[str, np.ndarray]:
    return feats if isinstance(feats, dict) else feats.arrays()


def _evaluate_language(spec, lang, examples, runner, tokenizer, s, eval_batch_size,
                       feats=None):
    feats = feats if feats is not None else _features(spec, examples, tokenizer, s)
    out = runner.predict(_arrays(feats)["input_ids"], eval_batch_size)
    predictions = None
    if spec.kind == "classification":
        scores = scorers.accuracy(feats["labels"], np.asarray(out).argmax(-1))
    elif spec.kind == "qa":
        predictions = qa_decoding.compute_predictions(
            out[0], out[1], feats, examples,
            n_best=s.n_best, max_answer_length=s.max_answer_length,
            unknown_pieces=s.qa_unknown_pieces,
        )
        refs = {e.id: list(e.answers) for e in examples}
        scores = scorers.qa_scores(
            predictions, refs, normalization=spec.qa_normalization,
            lang=lang if spec.qa_normalization == "mlqa" else None,
        )
    else:
        tags = features.decode_tags(out, feats, examples, spec.labels)
        gold = [list(e.tags) for e in examples]
        # PAN-X: entity F1; UD POS: seqeval F1 over the tags (XTREME) with accuracy.
        scores = scorers.tag_f1(gold, tags) if spec.name == "udpos" else scorers.entity_f1(
            gold, tags)
    return scores, predictions


def format_table(results: dict[str, Any]) -> str:
    """Markdown table of one results.json: one row per language, then the summary
    (``mean ± std`` over seeds when there are several)."""
    metric = results["metric"]
    seeded = len(results.get("seeds", [])) > 1
    extra = [m for m in ("exact_match", "accuracy", "accuracy_xx2en")
             if m != metric and any(m in v for v in results["languages"].values())]
    header = ["language", metric, *extra, "examples"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def cell(v, key):
        if key not in v:
            return ""
        std = v.get(f"{key}_std")
        return f"{v[key]:.2f} ± {std:.2f}" if seeded and std is not None else f"{v[key]:.2f}"

    for lang, v in results["languages"].items():
        cells = [lang, *(cell(v, m) for m in (metric, *extra))]
        cells.append(str(v.get("num_examples", "")))
        lines.append("| " + " | ".join(cells) + " |")
    for key in ("average", "average_target", "english", "transfer_gap"):
        value = results.get(key)
        shown = "n/a" if value is None else f"{value:.2f}"
        if seeded and key == "average" and results.get("average_std") is not None:
            shown += f" ± {results['average_std']:.2f}"
        lines.append("| **" + key + "** | " + shown + " |" + " |" * (len(header) - 2))
    if "provenance" in results and not results["provenance"].get("comparable_to_xtreme"):
        lines.append("")
        lines.append("Not comparable with XTREME's published numbers: "
                     + "; ".join(results["provenance"].get("differences", [])) + ".")
    return "\n".join(lines)


def write_results(model_dir: str | os.PathLike, results: dict[str, Any]) -> pathlib.Path:
    """Writes MODEL_DIR/results.json (atomically) and returns its path."""
    path = pathlib.Path(model_dir) / "results.json"
    files.write_atomic(path, json.dumps(results, indent=2, ensure_ascii=False, sort_keys=False))
    return path


# ----------------------------------------------------------------------------------------
# One seed: train with model selection, evaluate every language
# ----------------------------------------------------------------------------------------


def _selection_score(spec, scores: dict) -> float:
    # XTREME selects classification on accuracy, tagging on seqeval F1.
    return scores["accuracy" if spec.kind == "classification" else "f1"]


def _run_seed(spec, seed, s: FineTuneSettings, cfg, loaded, train_examples, select_examples,
              eval_examples, tokenizer, eval_batch_size, model_dir) -> dict[str, Any]:
    train_examples = _subsample(train_examples, s.max_train_examples, seed)
    train_feats = _arrays(_features(spec, train_examples, tokenizer, s))
    n_train = len(train_feats["input_ids"])
    steps = s.train_steps or max(1, int(s.num_epochs * n_train // s.batch_size))
    log.info("%s seed %d: %d training examples -> %d features, %d steps", spec.name, seed,
             len(train_examples), n_train, steps)
    model = FineTuneModel(cfg, spec.kind, max(len(spec.labels), 2))
    params = training.init_params(model, loaded.params, s.max_seq_length, seed)
    tx = training.make_finetune_optimizer(
        learning_rate=s.learning_rate, warmup_steps=s.warmup_steps, total_steps=steps,
        weight_decay=s.weight_decay, b1=s.adam_b1, b2=s.adam_b2, eps=s.adam_eps,
        max_grad_norm=s.max_grad_norm,
        # run_tag.py steps its scheduler before the optimizer.
        schedule_offset=1 if spec.kind == "tagging" else 0,
    )
    runner = training.Runner(model, params, tx, partitioning.create_mesh(data=-1), seed)
    select = select_examples if s.eval_every is not None else None
    select_feats = _features(spec, select, tokenizer, s) if select else None
    best = {"score": 0.0, "step": None, "params": None}
    history = []

    def consider(step):
        scores, _ = _evaluate_language(spec, "en", select, runner, tokenizer, s,
                                       eval_batch_size, select_feats)
        score = _selection_score(spec, scores)
        history.append({"step": step, "score": score})
        log.info("%s seed %d step %d: English dev %.2f", spec.name, seed, step, score)
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
        raise FloatingPointError(f"{spec.name}: non-finite training loss (first at step {bad[0]})")
    if best["params"] is not None and best["step"] != steps:
        runner.load_params(best["params"])
    selected = best["step"] if best["params"] is not None else steps

    per_lang = {}
    for lang, examples in eval_examples.items():
        scores, predictions = _evaluate_language(spec, lang, examples, runner, tokenizer, s,
                                                 eval_batch_size)
        per_lang[lang] = scores
        log.info("%s %s seed %d: %s", spec.name, lang, seed,
                 {k: round(v, 2) for k, v in scores.items()})
        if predictions is not None:
            folder = model_dir / "predictions" / (f"seed{seed}" if seed != s.seed else "")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{lang}.json").write_text(
                json.dumps(predictions, ensure_ascii=False, indent=1))
    return {
        "seed": seed,
        "languages": per_lang,
        **scorers.transfer_summary(per_lang, spec.metric),
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


def _aggregate(runs: list[dict], metric: str) -> dict[str, Any]:
    """Mean (and sample std over seeds, 0 for one seed) per language and of the average."""

    def std(xs):
        return float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0

    languages = {}
    for lang in runs[0]["languages"]:
        entry = {}
        for key, value in runs[0]["languages"][lang].items():
            values = [r["languages"][lang][key] for r in runs]
            if key.startswith("num_"):
                entry[key] = value
                continue
            entry[key] = float(np.mean(values))
            entry[f"{key}_std"] = std(values)
        languages[lang] = entry
    return {
        "languages": languages,
        **scorers.transfer_summary(languages, metric),
        "average_std": std([r["average"] for r in runs]),
    }


def _check_model_dir(model_dir: pathlib.Path, checkpoint: str) -> None:
    """Refuses a MODEL_DIR holding the evaluation of another checkpoint (it would be replaced).

    Raises:
      errors.UserError: naming MODEL_DIR and both checkpoints.
    """
    path = model_dir / "results.json"
    if not path.is_file():
        return
    try:
        recorded = (json.loads(path.read_text()).get("model") or {}).get("checkpoint")
    except (ValueError, OSError, AttributeError):
        recorded = None
    same = recorded is not None and (recorded == checkpoint or (
        ":" not in checkpoint and os.path.abspath(recorded) == os.path.abspath(checkpoint)))
    if not same:
        raise errors.UserError(
            f"MODEL_DIR {model_dir} holds the results of checkpoint {recorded or 'unknown'}, "
            f"not {checkpoint}: choose another MODEL_DIR for this checkpoint"
        )


def _record_config(model_dir: pathlib.Path) -> None:
    """Writes MODEL_DIR/config.gin, called once the checkpoint and data have been read.

    So a run that fails on its inputs leaves neither the file nor MODEL_DIR behind.
    """
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.gin").write_text(gin.operative_config_str())


@gin.configurable(denylist=["settings"])
def finetune(
    task: str = gin.REQUIRED,
    initial_checkpoint_path: str = gin.REQUIRED,
    model_dir: str = gin.REQUIRED,
    data_dir: str | None = None,
    vocab_path: str | None = None,
    languages: list[str] | None = None,
    settings: FineTuneSettings | None = None,
    allow_pickle: bool = False,
    data_source: str = "local",
    tfds_data_dir: str | None = None,
    num_seeds: int = 1,
    **overrides,
) -> dict[str, Any]:
    """Fine-tunes on English and evaluates zero-shot on every language of ``task``.

    Args:
      task: a task of :data:`xlmeta_jax.evaluation.readers.TASKS`.
      initial_checkpoint_path: see :mod:`xlmeta_jax.evaluation.encoders`.
      model_dir: output folder (results.json, config.gin, predictions/).
      data_dir: folder laid out like ``../shared/data`` (default: that folder).
      vocab_path: SentencePiece model overriding the checkpoint's; required for
        ``init:<size>`` (None there: a demo vocabulary is trained into MODEL_DIR).
      languages: evaluation languages (default: all of the task's).
      settings: hyper-parameters; ``overrides`` (any FineTuneSettings field, e.g. from
        gin ``finetune.batch_size = 16``) replace single fields.
      allow_pickle: let a Hugging Face checkpoint load from ``pytorch_model.bin``.
      data_source: "local" (files under ``data_dir``) or "tfds" (TFDS builders, see
        :mod:`xlmeta_jax.evaluation.tfds_readers`; needs internet the first time).
      tfds_data_dir: TFDS data directory (None: TFDS's default).
      num_seeds: independent fine-tuning runs (seeds ``seed``, ``seed + 1``, ...);
        results are the mean with the std over seeds (``--seeds=N`` on the command
        line).

    Returns:
      The results dictionary written to ``MODEL_DIR/results.json``.

    Raises:
      hosts.MultiHostError: in a multi-process run (``jax.process_count() > 1``): the
        loop feeds host-local batches and one process writes MODEL_DIR.
    """
    if jax.process_count() > 1:
        raise hosts.MultiHostError(hosts.one_host_message(
            "finetune", jax.process_index(), jax.process_count()))
    spec = readers.get_task(task)
    known = {f.name for f in dataclasses.fields(FineTuneSettings)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"finetune: unknown settings {unknown}; known: {sorted(known)}")
    s = dataclasses.replace(settings or FineTuneSettings(), **overrides)
    if num_seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {num_seeds}")
    if s.qa_unknown_pieces not in qa_decoding.UNKNOWN_PIECES:
        raise ValueError(f"finetune.qa_unknown_pieces must be one of "
                         f"{qa_decoding.UNKNOWN_PIECES}, got {s.qa_unknown_pieces!r}")
    if s.eval_every is not None and s.eval_every < 1:
        raise ValueError(f"finetune.eval_every must be >= 1 or None, got {s.eval_every}")
    _check_model_dir(pathlib.Path(model_dir), initial_checkpoint_path)
    if data_source not in ("local", "tfds"):
        raise ValueError(f"data_source must be 'local' or 'tfds', got {data_source!r}")
    if spec.kind == "retrieval":
        from xlmeta_jax.evaluation import retrieval

        if data_source != "local":
            raise ValueError(f"{task} has no TFDS builder: use data_source='local'")
        model_dir = pathlib.Path(model_dir)
        results = retrieval.evaluate_retrieval(
            task, initial_checkpoint_path, model_dir, data_dir=data_dir, vocab_path=vocab_path,
            languages=languages, max_seq_length=s.max_seq_length,
            batch_size=s.eval_batch_size, max_sentences=s.max_eval_examples, dtype=s.dtype,
            seed=s.seed, allow_pickle=allow_pickle,
            provenance={"provenance": protocol.provenance(
                task, "local", str(readers.resolve_data_dir(data_dir)), dataclasses.asdict(s),
                None)},
        )
        _record_config(model_dir)
        return results
    langs = readers.check_languages(task, languages)
    model_dir = pathlib.Path(model_dir)
    split = dict(train_fraction=s.train_fraction, select_fraction=s.select_fraction)
    if data_source == "local":
        resolved_dir = str(readers.resolve_data_dir(data_dir))
        load_train = lambda: readers.load_train(task, data_dir, **split)
        load_select = lambda: readers.load_select(task, data_dir, **split)
        load_eval = lambda lang: readers.load_eval(task, lang, data_dir, **split)
    else:
        from xlmeta_jax.evaluation import tfds_readers

        resolved_dir = tfds_data_dir
        if languages is None:
            langs = tuple(x for x in langs if x in tfds_readers.TFDS_LANGUAGES.get(task, ()))
        for lang in langs:
            tfds_readers.check_task(task, lang)
        load_train = lambda: tfds_readers.load_train(task, tfds_data_dir)
        load_select = lambda: tfds_readers.load_select(task, tfds_data_dir)
        load_eval = lambda lang: tfds_readers.load_eval(task, lang, tfds_data_dir)

    n_dev = jax.device_count()
    if s.batch_size % n_dev:
        raise ValueError(
            f"batch_size={s.batch_size} is not divisible by the {n_dev} devices "
            "(data-parallel fine-tuning splits every batch over all devices)"
        )
    eval_batch_size = math.ceil(s.eval_batch_size / n_dev) * n_dev

    if initial_checkpoint_path.startswith("init:") and vocab_path is None:
        from xlmeta_jax.evaluation import demo_vocab

        model_dir.mkdir(parents=True, exist_ok=True)
        vocab_path = demo_vocab.build_demo_vocab(model_dir / "demo_spm", data_dir)
    loaded = encoders.load_encoder(initial_checkpoint_path, vocab_path, allow_pickle=allow_pickle)
    cfg = loaded.config.replace(dtype=s.dtype)
    # results.json's settings then record the learning rate actually used.
    s = settings_for_encoder(s, cfg.num_layers)
    if s.dropout_rate is not None:
        cfg = cfg.replace(dropout_rate=s.dropout_rate, attention_dropout_rate=s.dropout_rate)
    if s.max_seq_length > cfg.max_length:
        raise ValueError(
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
    _record_config(model_dir)
    runs = [
        _run_seed(spec, s.seed + i, s, cfg, loaded, train_examples, select_examples,
                  eval_examples, tokenizer, eval_batch_size, model_dir)
        for i in range(num_seeds)
    ]
    results = {
        "task": task,
        "metric": spec.metric,
        **_aggregate(runs, spec.metric),
        "seeds": runs,
        "provenance": protocol.provenance(task, data_source, resolved_dir,
                                          dataclasses.asdict(s), len(train_examples)),
        "model": {
            "checkpoint": initial_checkpoint_path,
            "source": loaded.source,
            "vocab_path": tokenizer.model_path,
            "encoder": dataclasses.asdict(cfg),
        },
        "train": runs[0]["train"],
        "total_seconds": time.time() - t0,
        "settings": {**dataclasses.asdict(s), "num_seeds": num_seeds},
        "data_source": data_source,
    }
    log.info("results written to %s", write_results(model_dir, results))
    return results
