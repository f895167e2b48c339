"""Contrastive fine-tuning of an encoder into a sentence embedder, evaluated before and after.

``python -m xlmeta_jax.finetune --gin_file=gin/finetune/embeddings.gin`` builds an
:class:`EmbeddingConfig` (gin: ``embeddings.<field>``) and runs :func:`train_embeddings`:

1. read and check the training rows (:mod:`xlmeta_jax.evaluation.pairs`), the checkpoint
   and the evaluation data, before anything is written; the rows' ids come through their
   seqio task (:mod:`xlmeta_jax.evaluation.pair_task`), from its token cache when
   ``CACHE_DIR`` names one;
2. score the retrieval tasks (Tatoeba, BUCC, through their scorers) with the initial
   weights, pooled and normalised as the loss will see them; kept in
   ``MODEL_DIR/before.json``;
3. train (:mod:`xlmeta_jax.evaluation.embedding_step`) with checkpoints under
   ``MODEL_DIR/embeddings/<step>`` in the trainer's format: parameters, optimizer state,
   the step, and the embedding settings in its metadata. A rerun resumes from the latest
   checkpoint and reads the batches the uninterrupted run reads (the step decides them);
   a rerun with other settings is refused, naming them;
4. score again and write ``MODEL_DIR/results.json``: per task and language, before,
   after and the difference.

The final checkpoint is an ordinary one: ``hf to_hf`` exports it as a
sentence-transformers folder, :func:`xlmeta_jax.evaluation.embeddings.load` reads it,
and fine-tuning and continued pretraining take it as ``INITIAL_CHECKPOINT_PATH``.
"""

from __future__ import annotations

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
    embeddings,
    encoders,
    lareqa,
    pairs,
    scorers,
    tasks,
    training,
)
from xlmeta_jax.evaluation.embedding_config import (
    LAREQA_SETS,
    PHASE,
    RUN_FIELDS,
    EmbeddingConfig,
    bad,
)
from xlmeta_jax.evaluation.embedding_step import make_embedding_step
from xlmeta_jax.evaluation.settings import RetrievalSettings
from xlmeta_jax.evaluation.tasks.base import TaskError
from xlmeta_jax.model import partitioning
from xlmeta_jax.pretrain import checkpoints, run_dir
from xlmeta_jax.pretrain.progress import Writer

# Under the progress logger, which the command prints on stdout (logs.show_progress).
log = logging.getLogger("xlmeta_jax.train.embeddings")

# --------------------------------------------------------------------------------------
# Inputs: rows, evaluation data, the checkpoint.
# --------------------------------------------------------------------------------------


def _evaluation_data(config: EmbeddingConfig) -> dict[str, dict[str, Any]]:
    """{task: {language: its data}}, read before anything is trained."""
    out = {}
    for name in config.evaluate:
        if name in LAREQA_SETS:
            known = lareqa.XQUAD_R_LANGUAGES if name == "xquad_r" else lareqa.MLQA_R_LANGUAGES
            langs = [lang for lang in (config.eval_languages or known) if lang in known]
            if not langs:
                raise bad("eval_languages", config.eval_languages,
                           f"none of them is one of {name}'s {known}")
            try:
                out[name] = lareqa.read(name, config.data_dir, langs)
            except TaskError as e:
                raise bad("evaluate", config.evaluate, str(e)) from None
            continue
        task = tasks.get(name)
        langs = list(config.eval_languages or task.languages)
        try:
            task.check_retrieval_languages(langs)
        except TaskError as e:
            raise bad("eval_languages", config.eval_languages, str(e)) from None
        out[name] = {lang: task.read(lang, config.data_dir) for lang in langs}
    return out


def _evaluation_sentences(data: dict[str, dict[str, Any]]) -> set[str]:
    """The Tatoeba and BUCC sentences (LAReQA's pool is paragraphs of Wikipedia articles
    that FLORES-style bitext does not hold)."""
    sentences: set[str] = set()
    for name, by_lang in data.items():
        if name in LAREQA_SETS:
            continue
        for value in by_lang.values():
            for part in value:
                if isinstance(part, dict):
                    sentences.update(s.strip() for s in part.values())
                elif isinstance(part, list):
                    sentences.update(s.strip() for s in part)
    return sentences


def row_source(config: EmbeddingConfig, tokenizer=None):
    """The rows' :class:`~xlmeta_jax.evaluation.pair_task.RowSource`, encoded with
    ``tokenizer`` (the encoder's)."""
    from xlmeta_jax.evaluation import pair_task  # noqa: PLC0415 - seqio and TensorFlow, on use

    return pair_task.RowSource(
        train_files=tuple(config.train_files), bitext_dir=config.bitext_dir,
        bitext_languages=tuple(config.bitext_languages), bitext_pivot=config.bitext_pivot,
        bitext_split=config.bitext_split,
        tokenizer_path=tokenizer.model_path if tokenizer is not None else "",
        tokenizer_kind=tokenizer.kind if tokenizer is not None else None)


def read_rows(config: EmbeddingConfig, excluded: set[str]
              ) -> tuple[list[pairs.Pair], np.ndarray, dict]:
    """Every training row, the indices of those kept (none of their texts is an evaluation
    sentence), and where they came from (counts per source, rows dropped)."""
    rows, sources = row_source(config).read()
    kept = (pairs.without_texts(rows, excluded) if config.exclude_evaluation_sentences
            else range(len(rows)))
    return rows, np.asarray(kept, np.int64), {
        "sources": sources, "rows": len(kept), "dropped_evaluation_sentences":
        len(rows) - len(kept)}


def token_arrays(config: EmbeddingConfig, rows: Sequence[pairs.Pair], tokenizer, pad: int
                 ) -> dict[str, np.ndarray]:
    """Every column of every row as one ``[rows, length]`` id array (queries:
    query_length; the documents: document_length), through the rows' seqio task: read
    from the token cache in ``config.cache_dir``, or tokenized on the way."""
    from xlmeta_jax.evaluation import pair_task  # noqa: PLC0415 - seqio and TensorFlow, on use

    return pair_task.token_arrays(
        row_source(config, tokenizer), rows,
        {"query": config.query_length, "document": config.document_length}, pad,
        cache_dir=config.cache_dir)


def cache_rows(config: EmbeddingConfig, cache_dir: str, *, overwrite: bool = False,
               num_shards: int | None = None, beam_args: Sequence[str] = ()) -> str:
    """Writes the token cache of the run's rows, in its encoder's tokenizer, under
    ``cache_dir`` (``python -m xlmeta_jax.tools.caching`` with the run's gin flags).

    Returns:
      The cache folder.
    """
    from xlmeta_jax.evaluation import pair_task  # noqa: PLC0415 - seqio and TensorFlow, on use

    loaded = encoders.load_encoder(config.initial_checkpoint_path,
                                   allow_pickle=config.allow_pickle)
    return pair_task.cache(row_source(config, loaded.tokenizer), cache_dir,
                           overwrite=overwrite, num_shards=num_shards, beam_args=beam_args)


# --------------------------------------------------------------------------------------
# Evaluation: the retrieval tasks' scorers on the embedder.
# --------------------------------------------------------------------------------------


def evaluate(embedder: embeddings.Embedder, data: dict[str, dict[str, Any]],
             config: EmbeddingConfig) -> dict[str, Any]:
    """{task: {"languages": {lang: scores}, summary}}, as the tasks score them."""
    out = {}
    for name, by_lang in data.items():
        if name in LAREQA_SETS:
            result = lareqa.evaluate(embedder.encode, by_lang)
            per_lang = result["languages"]
            out[name] = {"metric": "map_at_20", "languages": per_lang,
                         "average": result["map"] * 100, "pool": result["pool"],
                         "differences": result["differences"]}
            continue
        task = tasks.get(name)
        per_lang = {lang: task.score_language(lang, d, embedder, 0, RetrievalSettings(),
                                              config.max_eval_sentences)["scores"]
                    for lang, d in by_lang.items()}
        out[name] = {"metric": task.metric, "languages": per_lang,
                     **scorers.transfer_summary(per_lang, task.metric)}
    return out


def _compare(before: dict, after: dict) -> dict[str, Any]:
    out = {}
    for name, b in before.items():
        metric, a = b["metric"], after[name]
        out[name] = {"metric": metric, "languages": {
            lang: {"before": b["languages"][lang][metric], "after": a["languages"][lang][metric],
                   "difference": a["languages"][lang][metric] - b["languages"][lang][metric]}
            for lang in b["languages"]}}
    return out


# --------------------------------------------------------------------------------------
# The run.
# --------------------------------------------------------------------------------------


def _check_model_dir(model_dir: pathlib.Path, config: EmbeddingConfig) -> int | None:
    """The latest step of a previous run of the same config in MODEL_DIR (None: none).

    Raises:
      errors.UserError: MODEL_DIR is a file, or holds a run of other settings or of
        another command.
    """
    problem = files.not_a_folder(model_dir, "MODEL_DIR")
    if problem:
        raise errors.UserError(problem)
    if not model_dir.exists() or not any(model_dir.iterdir()):
        return None
    phase = model_dir / PHASE
    steps = sorted(int(p.name) for p in phase.iterdir() if p.name.isdigit()) if phase.is_dir() \
        else []
    if not steps:
        if (model_dir / "before.json").is_file():
            return None
        raise errors.UserError(f"MODEL_DIR {model_dir} holds something else than a "
                               "contrastive run: choose a new folder")
    meta = checkpoints.read_meta(phase / str(steps[-1]))
    recorded = meta.get("embedding_run") or {}
    mine = config.recorded()
    changed = [k for k in RUN_FIELDS if k in recorded and recorded[k] != mine[k]]
    if changed:
        k = changed[0]
        raise run_dir.RunConfigMismatch(
            f"MODEL_DIR {model_dir} holds a contrastive run with embeddings.{k}="
            f"{recorded[k]!r}, not {mine[k]!r}: choose a new MODEL_DIR, or keep the setting "
            "to resume")
    return steps[-1]


def train_embeddings(config: EmbeddingConfig) -> dict[str, Any]:
    """Trains and evaluates one contrastive run (see module doc).

    Returns:
      The results written to ``MODEL_DIR/results.json``.
    """
    if jax.process_count() > 1:
        raise hosts.MultiHostError(hosts.one_host_message(
            "embeddings", jax.process_index(), jax.process_count()))
    model_dir = pathlib.Path(config.model_dir)
    resume_from = _check_model_dir(model_dir, config)

    # ---- inputs, all read and checked before anything is written --------------------
    data = _evaluation_data(config)
    all_rows, kept, provenance = read_rows(config, _evaluation_sentences(data))
    if not kept.size:
        raise pairs.PairsError("no training rows left after dropping those that hold an "
                               "evaluation sentence")
    order = pairs.BatchOrder([all_rows[i] for i in kept], config.batch_size, config.seed)
    loaded = encoders.load_encoder(config.initial_checkpoint_path,
                                   allow_pickle=config.allow_pickle)
    if loaded.masked_lm_params is None:
        raise errors.UserError(f"INITIAL_CHECKPOINT_PATH {config.initial_checkpoint_path}: "
                               "contrastive training starts from trained weights")
    cfg = loaded.config
    if config.dropout_rate is not None:
        cfg = cfg.replace(dropout_rate=config.dropout_rate,
                          attention_dropout_rate=config.dropout_rate)
    longest = max(config.query_length, config.document_length)
    if longest > cfg.max_length:
        field = "query_length" if config.query_length > cfg.max_length else "document_length"
        raise bad(field, longest, f"{longest} exceeds the encoder's {cfg.max_length} "
                   "positions")
    mesh = partitioning.create_mesh(*config.mesh_shape)
    if (config.mini_batch_size is not None and mesh.devices.size > 1
            and jax.default_backend() == "cpu"):
        # XLA's CPU runtime can stall, then abort, running collectives inside GradCache's
        # loops on several host devices of a loaded machine (seen with fake CPU devices).
        raise bad("mini_batch_size", config.mini_batch_size,
                   f"GradCache on {mesh.devices.size} CPU devices is not supported: use one "
                   "CPU device (mesh_shape=(1, 1, 1)) or mini_batch_size=None")
    shards = partitioning.batch_shards(mesh)
    for field in ("batch_size", "mini_batch_size"):
        value = getattr(config, field)
        if value is not None and value % shards:
            raise bad(field, value, f"{value} is not divisible by the mesh's {shards} batch "
                       "shards (data x fsdp)")
    arrays = {k: v[kept] for k, v in token_arrays(config, all_rows, loaded.tokenizer,
                                                  cfg.pad_token_id).items()}
    settings = embeddings.EmbeddingSettings(pooling=config.pooling,
                                            max_seq_length=config.document_length)

    # ---- MODEL_DIR: held by this run ---------------------------------------------------
    model_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir.RunLock(os.fspath(model_dir)).acquire()
    try:
        if config.config_text is not None:
            files.write_atomic(model_dir / "config.gin", config.config_text)
        before_path = model_dir / "before.json"
        if before_path.is_file():
            before = json.loads(before_path.read_text())
        else:
            log.info("scoring %s with the initial weights", ", ".join(config.evaluate))
            before = evaluate(embeddings.from_loaded(
                loaded, settings, batch_size=config.eval_batch_size), data, config)
            files.write_atomic(before_path, json.dumps(before, indent=1))
        state, losses, seconds = _train(config, cfg, loaded, order, arrays, mesh,
                                        resume_from, settings)
        after = evaluate(embeddings.from_loaded(
            loaded, settings, batch_size=config.eval_batch_size,
            params=jax.device_get(state.params["encoder"])), data, config)
        results = {
            "task": "embeddings",
            "evaluation": _compare(before, after),
            "before": before, "after": after,
            "train": {"steps": config.steps, "rows": provenance["rows"],
                      "data": provenance, "losses": losses, "seconds": seconds,
                      "first_loss": losses[0] if losses else None,
                      "final_loss": losses[-1] if losses else None},
            "model": {"checkpoint": config.initial_checkpoint_path, "source": loaded.source,
                      "vocab_path": loaded.tokenizer.model_path,
                      "encoder": dataclasses.asdict(cfg)},
            "settings": config.recorded(),
            "embedding": dataclasses.asdict(settings),
        }
        files.write_atomic(model_dir / "results.json",
                           json.dumps(results, indent=1, ensure_ascii=False))
    finally:
        lock.release()
    log.info("results written to %s", model_dir / "results.json")
    return results


def _train(config: EmbeddingConfig, cfg, loaded, order: pairs.BatchOrder,
           arrays: dict[str, np.ndarray], mesh, resume_from: int | None,
           settings: embeddings.EmbeddingSettings):
    """The loop: from the initial weights or the latest checkpoint to ``steps``."""
    schedule = training.hf_linear_schedule(config.learning_rate, config.warmup_steps,
                                           config.steps)
    tx = training.make_finetune_optimizer(
        learning_rate=config.learning_rate, warmup_steps=config.warmup_steps,
        total_steps=config.steps, weight_decay=config.weight_decay, b1=config.adam_b1,
        b2=config.adam_b2, eps=config.adam_eps, max_grad_norm=config.max_grad_norm)
    fns = make_embedding_step(cfg, tx, mesh, config.loss(), seed=config.seed,
                              schedule=schedule)
    ckpt = checkpoints.PhaseCheckpoints(
        os.fspath(pathlib.Path(config.model_dir) / PHASE),
        save_interval_steps=config.checkpoint_every, max_to_keep=config.keep_checkpoints)
    meta = {"phase": PHASE, "run_phases": [PHASE], "num_steps": config.steps,
            "model_config": dataclasses.asdict(cfg), "vocab_path": loaded.tokenizer.model_path,
            "tokenizer": loaded.tokenizer.record(),
            "initialized_from": config.initial_checkpoint_path,
            embeddings.META_KEY: dataclasses.asdict(settings),
            "embedding_run": config.recorded(), "metrics": {}}
    losses: list[float] = []
    t0 = time.time()
    writer = Writer(os.fspath(pathlib.Path(config.model_dir) / "tensorboard"))
    try:
        if resume_from is not None:
            state, stored = ckpt.restore(resume_from, fns.abstract_state)
            losses = list(stored.get("losses", []))
            log.info("resuming from step %d of %d", resume_from, config.steps)
        else:
            params = jax.tree.map(np.asarray, loaded.masked_lm_params)
            state = fns.from_params(jax.device_put(params, fns.state_sharding.params))
        start = int(jax.device_get(state.step))
        batches = order.batches(start)
        recent = []
        for step in range(start + 1, config.steps + 1):
            idx = np.asarray(next(batches))
            state, metrics = fns.train_step(state, {k: v[idx] for k, v in arrays.items()})
            recent.append(metrics)
            if step % config.log_every == 0 or step == config.steps:
                values = jax.device_get(recent)
                loss = float(np.mean([m["loss"] for m in values]))
                if not math.isfinite(loss):
                    raise errors.NonFiniteError(
                        f"non-finite contrastive loss by step {step}: lower "
                        "embeddings.learning_rate")
                losses += [float(m["loss"]) for m in values]
                writer.scalars(step, {k: float(v) for k, v in values[-1].items()})
                log.info("step %d/%d loss %.4f", step, config.steps, loss)
                recent = []
            if step % config.checkpoint_every == 0 or step == config.steps:
                if recent:
                    losses += [float(m["loss"]) for m in jax.device_get(recent)]
                    recent = []
                ckpt.save(step, state, None, {**meta, "phase_step": step, "losses": losses},
                          force=step == config.steps)
        if start == config.steps:
            log.info("all %d steps were trained; scoring the final checkpoint", config.steps)
        ckpt.wait()
    finally:
        ckpt.close()
        writer.close()
    return state, losses, time.time() - t0


def format_table(results: dict[str, Any]) -> str:
    """Per task and language: the score before, after, and the difference."""
    lines = []
    for name, by_task in results["evaluation"].items():
        lines.append(f"{name} ({by_task['metric']}): before -> after")
        for lang, v in by_task["languages"].items():
            lines.append(f"  {lang:8s} {v['before']:6.2f} -> {v['after']:6.2f} "
                         f"({v['difference']:+.2f})")
    train = results["train"]
    lines.append(f"loss {train['first_loss']:.4f} -> {train['final_loss']:.4f} over "
                 f"{train['steps']} steps of {train['rows']} rows")
    return "\n".join(lines)
