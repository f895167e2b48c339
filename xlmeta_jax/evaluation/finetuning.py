"""Zero-shot cross-lingual fine-tuning: train on English, evaluate on every language.

:func:`finetune` is the gin entry point of ``python -m xlmeta_jax.finetune``. It loads
the encoder (:mod:`xlmeta_jax.evaluation.encoders`), fine-tunes it with a task head
(:mod:`xlmeta_jax.evaluation.models`) on the English training data, evaluates each
target language, and writes ``MODEL_DIR/results.json``::

    {"task", "metric",
     "languages": {lang: {metric: ..., ...}},
     "average":        mean over all evaluated languages (XTREME's convention),
     "average_target": mean over the languages other than English,
     "english":        the English score,
     "transfer_gap":   english - average_target,
     "model": {...}, "train": {...}, "settings": {...}}

plus ``MODEL_DIR/config.gin`` (the operative gin config) and, for QA, the predicted
answers per language under ``MODEL_DIR/predictions/``. Retrieval tasks (tatoeba, bucc)
are delegated to :func:`xlmeta_jax.evaluation.retrieval.evaluate_retrieval`.

Training is data-parallel: parameters are replicated and every batch is split over all
devices along the mesh's ``data`` axis.
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
from typing import Any

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from xlmeta_jax import partitioning
from xlmeta_jax.evaluation import encoders, features, readers, scorers
from xlmeta_jax.evaluation.models import FineTuneModel, TaskHead
from xlmeta_jax.optimizer import OptimizerConfig, make_optimizer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FineTuneSettings:
    """Hyper-parameters of one fine-tuning run (all settable from gin)."""

    # Longest input in tokens (XTREME: 128 for classification/tagging, 384 for QA).
    max_seq_length: int = 128
    # QA: context tokens between the starts of consecutive windows.
    doc_stride: int = 128
    # QA: questions are truncated to this many tokens.
    max_query_length: int = 64
    # QA: longest answer in tokens considered when decoding.
    max_answer_length: int = 30
    # QA: start / end candidates per window when decoding.
    n_best: int = 20
    # Training batch size (global; divisible by the number of devices).
    batch_size: int = 32
    # Evaluation batch size (rounded up to a multiple of the number of devices).
    eval_batch_size: int = 128
    # Training steps; None: `num_epochs` passes over the training features.
    train_steps: int | None = None
    # Epochs when `train_steps` is None.
    num_epochs: float = 2.0
    # Peak AdamW learning rate.
    learning_rate: float = 2e-5
    # Share of the steps spent in linear warm-up (then linear decay to 0).
    warmup_ratio: float = 0.1
    # Decoupled weight decay (not on biases / LayerNorm).
    weight_decay: float = 0.01
    # Gradient clipping by global norm (0 disables).
    max_grad_norm: float = 1.0
    # Dropout on the encoder and head; None keeps the checkpoint's.
    dropout_rate: float | None = None
    # Compute dtype of the encoder ("float32" or "bfloat16").
    dtype: str = "float32"
    # Use at most this many training examples (None: all), a seeded random subset.
    max_train_examples: int | None = None
    # Evaluate at most this many examples per language (None: all), the first ones.
    max_eval_examples: int | None = None
    # XNLI / PAWS-X: share of English dev lines used for training (see readers).
    train_fraction: float = 0.5
    # Seed of head init, data order and dropout.
    seed: int = 0
    # Log the training loss every this many steps.
    log_every: int = 50


# ----------------------------------------------------------------------------------------
# Training and inference
# ----------------------------------------------------------------------------------------


def _loss(kind: str, outputs, batch, pad_id: int):
    if kind == "classification":
        return optax.softmax_cross_entropy_with_integer_labels(outputs, batch["labels"]).mean()
    if kind == "qa":
        start, end = outputs
        valid = batch["input_ids"] != pad_id
        start = jnp.where(valid, start, -1e9)
        end = jnp.where(valid, end, -1e9)
        ce = optax.softmax_cross_entropy_with_integer_labels
        return 0.5 * (ce(start, batch["start_positions"]) + ce(end, batch["end_positions"])).mean()
    labels = batch["labels"]
    valid = (labels >= 0).astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(outputs, jnp.maximum(labels, 0))
    return (ce * valid).sum() / jnp.maximum(valid.sum(), 1.0)


class _Runner:
    """Jit'ed train / predict functions of one model on a data-parallel mesh."""

    def __init__(self, model: FineTuneModel, params, tx, mesh, seed: int):
        self.model, self.tx, self.mesh = model, tx, mesh
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.params = jax.device_put(params, self.replicated)
        self.opt_state = jax.device_put(tx.init(params), self.replicated)
        self.step = 0
        base_key = jax.random.key(seed)
        pad_id = model.config.pad_token_id
        kind = model.kind

        def train_step(params, opt_state, step, batch):
            def loss_fn(p):
                out = model.apply(
                    {"params": p},
                    batch["input_ids"],
                    deterministic=False,
                    rngs={"dropout": jax.random.fold_in(base_key, step)},
                )
                return _loss(kind, out, batch, pad_id)

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        def predict(params, input_ids):
            return model.apply({"params": params}, input_ids, deterministic=True)

        # Traced on first call, inside _context() (mesh + logical-axis rules).
        self._train = jax.jit(train_step, donate_argnums=(0, 1))
        self._predict = jax.jit(predict)

    def _context(self):
        # An abstract mesh, or Flax's logical activation constraints are no-ops.
        stack = contextlib.ExitStack()
        stack.enter_context(partitioning.mesh_context(self.mesh))
        stack.enter_context(partitioning.axis_rules_context())
        return stack

    def _put(self, arrays: dict[str, np.ndarray]):
        return {
            k: jax.device_put(v, NamedSharding(self.mesh, partitioning.batch_spec(v.ndim)))
            for k, v in arrays.items()
        }

    def train_step(self, batch: dict[str, np.ndarray]) -> float:
        with self._context():
            self.params, self.opt_state, loss = self._train(
                self.params, self.opt_state, jnp.int32(self.step), self._put(batch)
            )
        self.step += 1
        return loss

    def predict(self, input_ids: np.ndarray, batch_size: int):
        """Outputs for every row, in batches padded to ``batch_size`` rows."""
        n = len(input_ids)
        outs = []
        pad = self.model.config.pad_token_id
        for i in range(0, n, batch_size):
            chunk = input_ids[i : i + batch_size]
            rows = len(chunk)
            if rows < batch_size:
                filler = np.full((batch_size - rows, chunk.shape[1]), pad, chunk.dtype)
                chunk = np.concatenate([chunk, filler])
            with self._context():
                out = self._predict(self.params, self._put({"x": chunk})["x"])
            outs.append(jax.tree.map(lambda a, r=rows: np.asarray(a)[:r], out))
        return jax.tree.map(lambda *xs: np.concatenate(xs), *outs)


def _init_params(model: FineTuneModel, encoder_params, max_seq_length: int, seed: int):
    """Head params from a fresh init; encoder params from the checkpoint (shape-checked),
    or freshly initialised too when there is no checkpoint (``init:<size>``)."""
    cfg = model.config
    dummy = jnp.full((1, max_seq_length), cfg.pad_token_id + 1, jnp.int32)
    key = jax.random.key(seed)
    with partitioning.axis_rules_context():
        if encoder_params is None:
            init = jax.jit(lambda r: nn.unbox(model.init(r, dummy, deterministic=True)["params"]))
            return jax.device_get(init(key))
        # Only the head is initialised: a pretrained encoder's init would be thrown away.
        shapes = jax.eval_shape(
            lambda r: nn.unbox(model.init(r, dummy, deterministic=True)["params"]), key
        )
        head = TaskHead(cfg, model.kind, model.num_labels)
        hidden = jnp.zeros((1, max_seq_length, cfg.hidden_size), jnp.dtype(cfg.dtype))
        head_params = jax.device_get(
            jax.jit(lambda r: nn.unbox(head.init(r, hidden, True)["params"]))(key)
        )
    expected = jax.tree_util.tree_structure(shapes["encoder"])
    got = jax.tree_util.tree_structure(encoder_params)
    if expected != got:
        raise ValueError(
            "checkpoint encoder parameters do not match the encoder config: "
            f"expected tree {expected}, got {got}"
        )
    for (path, a), b in zip(
        jax.tree_util.tree_flatten_with_path(shapes["encoder"])[0],
        jax.tree.leaves(encoder_params),
    ):
        if a.shape != np.shape(b):
            raise ValueError(
                f"checkpoint parameter encoder{jax.tree_util.keystr(path)} has shape "
                f"{np.shape(b)}, the config expects {a.shape}"
            )
    encoder = jax.tree.map(
        lambda a, b: np.asarray(b, dtype=a.dtype), shapes["encoder"], encoder_params
    )
    return {"encoder": encoder, "head": head_params}


def _batches(n: int, batch_size: int, steps: int, seed: int):
    rng = np.random.default_rng(seed)
    order = np.zeros((0,), np.int64)
    for _ in range(steps):
        while len(order) < batch_size:
            order = np.concatenate([order, rng.permutation(n)])
        yield order[:batch_size]
        order = order[batch_size:]


# ----------------------------------------------------------------------------------------
# Task plumbing
# ----------------------------------------------------------------------------------------


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


def _evaluate_language(spec, lang, examples, runner, tokenizer, s, eval_batch_size):
    feats = _features(spec, examples, tokenizer, s)
    out = runner.predict(_arrays(feats)["input_ids"], eval_batch_size)
    predictions = None
    if spec.kind == "classification":
        scores = scorers.accuracy(feats["labels"], np.asarray(out).argmax(-1))
    elif spec.kind == "qa":
        predictions = features.decode_qa(
            out[0], out[1], feats, examples,
            n_best=s.n_best, max_answer_length=s.max_answer_length,
        )
        refs = {e.id: list(e.answers) for e in examples}
        scores = scorers.qa_scores(
            predictions, refs, normalization=spec.qa_normalization,
            lang=lang if spec.qa_normalization == "mlqa" else None,
        )
    else:
        tags = features.decode_tags(out, feats, examples, spec.labels)
        gold = [list(e.tags) for e in examples]
        scores = (
            scorers.entity_f1(gold, tags) if spec.metric == "f1"
            else scorers.token_accuracy(gold, tags)
        )
    return scores, predictions


def format_table(results: dict[str, Any]) -> str:
    """Markdown table of one results.json: one row per language, then the summary."""
    metric = results["metric"]
    extra = [m for m in ("exact_match",) if any(m in v for v in results["languages"].values())]
    header = ["language", metric, *extra, "examples"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for lang, v in results["languages"].items():
        cells = [lang, f"{v[metric]:.2f}", *(f"{v[m]:.2f}" for m in extra)]
        cells.append(str(v.get("num_examples", "")))
        lines.append("| " + " | ".join(cells) + " |")
    for key in ("average", "average_target", "english", "transfer_gap"):
        value = results.get(key)
        shown = "n/a" if value is None else f"{value:.2f}"
        lines.append("| **" + key + "** | " + shown + " |" + " |" * (len(header) - 2))
    return "\n".join(lines)


def write_results(model_dir: str | os.PathLike, results: dict[str, Any]) -> pathlib.Path:
    """Writes MODEL_DIR/results.json (atomically) and returns its path."""
    path = pathlib.Path(model_dir) / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2, ensure_ascii=False, sort_keys=False))
    tmp.replace(path)
    return path


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

    Returns:
      The results dictionary written to ``MODEL_DIR/results.json``.
    """
    spec = readers.get_task(task)
    langs = readers.check_languages(task, languages)
    if spec.kind == "retrieval":
        from xlmeta_jax.evaluation import retrieval

        # Unset values are left to evaluate_retrieval's own gin bindings.
        optional = dict(data_dir=data_dir, vocab_path=vocab_path, languages=languages)
        return retrieval.evaluate_retrieval(
            task=task, initial_checkpoint_path=initial_checkpoint_path, model_dir=model_dir,
            allow_pickle=allow_pickle, **{k: v for k, v in optional.items() if v is not None},
        )
    known = {f.name for f in dataclasses.fields(FineTuneSettings)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"finetune: unknown settings {unknown}; known: {sorted(known)}")
    s = dataclasses.replace(settings or FineTuneSettings(), **overrides)
    model_dir = pathlib.Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.gin").write_text(gin.operative_config_str())
    if data_source == "local":
        readers._data_dir(data_dir)
        load_train = lambda: readers.load_train(task, data_dir, train_fraction=s.train_fraction)
        load_eval = lambda lang: readers.load_eval(
            task, lang, data_dir, train_fraction=s.train_fraction
        )
    elif data_source == "tfds":
        from xlmeta_jax.evaluation import tfds_readers

        if languages is None:
            langs = tuple(x for x in langs if x in tfds_readers.TFDS_LANGUAGES.get(task, ()))
        for lang in langs:
            tfds_readers._check(task, lang)
        load_train = lambda: tfds_readers.load_train(task, tfds_data_dir)
        load_eval = lambda lang: tfds_readers.load_eval(task, lang, tfds_data_dir)
    else:
        raise ValueError(f"data_source must be 'local' or 'tfds', got {data_source!r}")

    n_dev = jax.device_count()
    if s.batch_size % n_dev:
        raise ValueError(
            f"batch_size={s.batch_size} is not divisible by the {n_dev} devices "
            "(data-parallel fine-tuning splits every batch over all devices)"
        )
    eval_batch_size = math.ceil(s.eval_batch_size / n_dev) * n_dev

    if initial_checkpoint_path.startswith("init:") and vocab_path is None:
        from xlmeta_jax.evaluation import demo_vocab

        vocab_path = demo_vocab.build_demo_vocab(model_dir / "demo_spm", data_dir)
    loaded = encoders.load_encoder(initial_checkpoint_path, vocab_path, allow_pickle=allow_pickle)
    cfg = loaded.config.replace(dtype=s.dtype)
    if s.dropout_rate is not None:
        cfg = cfg.replace(dropout_rate=s.dropout_rate, attention_dropout_rate=s.dropout_rate)
    if s.max_seq_length > cfg.max_length:
        raise ValueError(
            f"max_seq_length={s.max_seq_length} exceeds the encoder's {cfg.max_length} positions"
        )
    tokenizer = loaded.tokenizer

    # Read every language first, so a missing file fails before training.
    t0 = time.time()
    train_examples = _subsample(load_train(), s.max_train_examples, s.seed)
    eval_examples = {lang: load_eval(lang)[: s.max_eval_examples] for lang in langs}
    train_feats = _arrays(_features(spec, train_examples, tokenizer, s))
    n_train = len(train_feats["input_ids"])
    steps = s.train_steps or max(1, math.ceil(s.num_epochs * n_train / s.batch_size))
    log.info("%s: %d training examples -> %d features, %d steps", task, len(train_examples),
             n_train, steps)

    model = FineTuneModel(cfg, spec.kind, max(len(spec.labels), 2))
    params = _init_params(model, loaded.params, s.max_seq_length, s.seed)
    opt_cfg = OptimizerConfig(
        learning_rate=s.learning_rate,
        warmup_steps=int(s.warmup_ratio * steps),
        total_steps=steps,
        b2=0.999,
        eps=1e-8,
        weight_decay=s.weight_decay,
        max_grad_norm=s.max_grad_norm,
    )
    mesh = partitioning.create_mesh(data=-1)
    runner = _Runner(model, params, make_optimizer(opt_cfg), mesh, s.seed)

    losses = []
    t_train = time.time()
    for step, idx in enumerate(_batches(n_train, s.batch_size, steps, s.seed), start=1):
        losses.append(runner.train_step({k: v[idx] for k, v in train_feats.items()}))
        if step % s.log_every == 0 or step == steps:
            recent = float(np.mean(jax.device_get(losses[-s.log_every :])))
            log.info("step %d/%d loss %.4f", step, steps, recent)
    losses = [float(x) for x in jax.device_get(losses)]
    train_seconds = time.time() - t_train
    bad = [i for i, x in enumerate(losses, start=1) if not math.isfinite(x)]
    if bad:
        raise FloatingPointError(f"{task}: non-finite training loss (first at step {bad[0]})")

    t_eval = time.time()
    per_lang = {}
    for lang in langs:
        scores, predictions = _evaluate_language(
            spec, lang, eval_examples[lang], runner, tokenizer, s, eval_batch_size
        )
        per_lang[lang] = scores
        log.info("%s %s: %s", task, lang, {k: round(v, 2) for k, v in scores.items()})
        if predictions is not None:
            (model_dir / "predictions").mkdir(exist_ok=True)
            (model_dir / "predictions" / f"{lang}.json").write_text(
                json.dumps(predictions, ensure_ascii=False, indent=1)
            )
    results = {
        "task": task,
        "metric": spec.metric,
        "languages": per_lang,
        **scorers.transfer_summary(per_lang, spec.metric),
        "model": {
            "checkpoint": initial_checkpoint_path,
            "source": loaded.source,
            "vocab_path": tokenizer.model_path,
            "encoder": dataclasses.asdict(cfg),
        },
        "train": {
            "examples": len(train_examples),
            "features": n_train,
            "steps": steps,
            "first_loss": losses[0],
            "final_loss": float(np.mean(losses[-max(1, min(s.log_every, len(losses))):])),
            "seconds": train_seconds,
        },
        "eval_seconds": time.time() - t_eval,
        "total_seconds": time.time() - t0,
        "settings": dataclasses.asdict(s),
        "data_source": data_source,
    }
    write_results(model_dir, results)
    return results
