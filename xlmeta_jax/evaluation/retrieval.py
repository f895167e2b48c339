"""Sentence retrieval without fine-tuning: how well aligned are the representations?

* Tatoeba (LASER v1, up to 1000 translation pairs per language): every sentence is
  embedded as the mean of one layer's hidden states over its tokens (``<s>`` and
  ``</s>`` included, as XTREME's mean pooling), and each sentence retrieves its cosine
  nearest neighbour among the other side's sentences. Accuracy is reported in both
  directions (``xx -> en`` is XTREME's number) for the chosen layer, and for every
  layer (embedding output = layer 0) as a sweep.
* BUCC 2018 (zh-en dev here): bitext mining with the ratio margin of Artetxe & Schwenk
  (k = 4 nearest neighbours each way), forward direction (each source sentence's best
  English candidate), F1 against the gold pairs at the best threshold (XTREME tunes
  the threshold on dev; with only dev data this is an optimistic figure).

Results go to ``MODEL_DIR/results.json`` in the format of
:mod:`xlmeta_jax.evaluation.finetuning` (no English row: English is the retrieval side).
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from xlmeta_jax.evaluation import encoders, readers, scorers
from xlmeta_jax.evaluation.finetuning import write_results
from xlmeta_jax.evaluation.tokenization import Tokenizer
from xlmeta_jax.network import Encoder, EncoderConfig

log = logging.getLogger(__name__)


class SentenceEmbedder:
    """Mean-pooled hidden states of every layer of an encoder, in batches."""

    def __init__(self, cfg: EncoderConfig, params, tokenizer: Tokenizer, *,
                 max_seq_length: int = 128, batch_size: int = 64):
        if max_seq_length > cfg.max_length:
            raise ValueError(
                f"max_seq_length={max_seq_length} exceeds the encoder's {cfg.max_length} positions"
            )
        self.cfg, self.tokenizer = cfg, tokenizer
        self.max_seq_length, self.batch_size = max_seq_length, batch_size
        encoder = Encoder(cfg)
        self.params = params

        def embed(params, ids):
            _, hidden = encoder.apply(
                {"params": params}, ids, deterministic=True, output_hidden_states=True
            )
            mask = (ids != cfg.pad_token_id).astype(jnp.float32)[..., None]
            stacked = jnp.stack(hidden).astype(jnp.float32)  # [layers+1, B, L, H]
            return (stacked * mask).sum(2) / jnp.maximum(mask.sum(1), 1.0)

        self._embed = jax.jit(embed)

    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        """[num_layers + 1, len(sentences), hidden] float32 embeddings."""
        ids = [self.tokenizer.single(x, self.max_seq_length)
               for x in self.tokenizer.encode_batch(sentences)]
        # Sorting by length keeps padding (and the number of compiled shapes) small.
        order = np.argsort([len(x) for x in ids], kind="stable")
        out = np.zeros((self.cfg.num_layers + 1, len(ids), self.cfg.hidden_size), np.float32)
        for i in range(0, len(ids), self.batch_size):
            idx = order[i : i + self.batch_size]
            width = min(self.max_seq_length, -(-max(len(ids[j]) for j in idx) // 32) * 32)
            batch = np.full((self.batch_size, width), self.cfg.pad_token_id, np.int32)
            for r, j in enumerate(idx):
                batch[r, : len(ids[j])] = ids[j]
            emb = np.asarray(self._embed(self.params, batch))
            out[:, idx] = emb[:, : len(idx)]
        return out


def _fresh_params(cfg: EncoderConfig, seed: int):
    dummy = jnp.full((1, 8), cfg.pad_token_id + 1, jnp.int32)
    return jax.device_get(nn.unbox(Encoder(cfg).init(jax.random.key(seed), dummy)["params"]))


def _knn_mean(x: np.ndarray, y: np.ndarray, k: int, chunk: int = 2048) -> np.ndarray:
    """Mean cosine of each row of x to its k nearest rows of y (unit rows)."""
    out = np.zeros(len(x), np.float32)
    for i in range(0, len(x), chunk):
        sim = x[i : i + chunk] @ y.T
        top = np.partition(sim, -k, axis=1)[:, -k:]
        out[i : i + chunk] = top.mean(1)
    return out


def mine_bitext(
    src: np.ndarray, tgt: np.ndarray, k: int = 4, chunk: int = 2048
) -> tuple[np.ndarray, np.ndarray]:
    """Forward ratio-margin mining: best target index and margin score per source row."""
    src = src / np.maximum(np.linalg.norm(src, axis=1, keepdims=True), 1e-12)
    tgt = tgt / np.maximum(np.linalg.norm(tgt, axis=1, keepdims=True), 1e-12)
    k_src, k_tgt = min(k, len(tgt)), min(k, len(src))
    src_knn = _knn_mean(src, tgt, k_src, chunk)
    tgt_knn = _knn_mean(tgt, src, k_tgt, chunk)
    best = np.zeros(len(src), np.int64)
    score = np.zeros(len(src), np.float32)
    for i in range(0, len(src), chunk):
        sim = src[i : i + chunk] @ tgt.T
        margin = sim / ((src_knn[i : i + chunk, None] + tgt_knn[None, :]) / 2)
        best[i : i + chunk] = margin.argmax(1)
        score[i : i + chunk] = margin.max(1)
    return best, score


@gin.configurable
def evaluate_retrieval(
    task: str = "tatoeba",
    initial_checkpoint_path: str = gin.REQUIRED,
    model_dir: str = gin.REQUIRED,
    data_dir: str | None = None,
    vocab_path: str | None = None,
    languages: list[str] | None = None,
    layer: int | None = None,
    max_seq_length: int = 128,
    batch_size: int = 64,
    max_sentences: int | None = None,
    dtype: str = "float32",
    seed: int = 0,
    allow_pickle: bool = False,
) -> dict[str, Any]:
    """Tatoeba accuracy (with a per-layer sweep) or BUCC F1 of a pretrained encoder.

    Args:
      task: "tatoeba" or "bucc".
      initial_checkpoint_path, vocab_path, allow_pickle: see
        :mod:`xlmeta_jax.evaluation.encoders` (``init:<size>`` embeds with random
        weights: the chance-level baseline).
      model_dir: output folder for results.json and config.gin.
      data_dir: folder laid out like ``../shared/data``.
      languages: Tatoeba languages (XTREME codes or ISO 639-3; default XTREME's 36).
      layer: hidden layer whose mean is the sentence embedding (0 = embeddings;
        None = last). XTREME uses layer 7 of XLM-R base.
      max_seq_length: sentences are truncated to this many tokens.
      batch_size: sentences per forward pass.
      max_sentences: Tatoeba: use the first N pairs per language; BUCC: keep the gold
        sentences plus the first N others per side (demo runs). None: all.
      dtype: compute dtype of the encoder.
      seed: seed of a fresh ``init:`` encoder.
    """
    if task not in ("tatoeba", "bucc"):
        raise ValueError(f"evaluate_retrieval: task must be 'tatoeba' or 'bucc', got {task!r}")
    if task == "tatoeba" and languages is not None:
        for lang in languages:
            if lang not in readers.TATOEBA_CODES and len(lang) != 3:
                raise ValueError(f"tatoeba: unknown language {lang!r}")
    langs = list(languages) if languages is not None else list(readers.get_task(task).languages)
    model_dir = pathlib.Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.gin").write_text(gin.operative_config_str())
    t0 = time.time()
    if task == "tatoeba":
        pairs = {lang: readers.read_tatoeba(lang, data_dir) for lang in langs}
    else:
        bucc = {lang: readers.read_bucc(f"{lang}-en", "dev", data_dir) for lang in langs}
    if initial_checkpoint_path.startswith("init:") and vocab_path is None:
        from xlmeta_jax.evaluation import demo_vocab

        vocab_path = demo_vocab.build_demo_vocab(model_dir / "demo_spm", data_dir)
    loaded = encoders.load_encoder(initial_checkpoint_path, vocab_path, allow_pickle=allow_pickle)
    cfg = loaded.config.replace(dtype=dtype, dropout_rate=0.0, attention_dropout_rate=0.0)
    layer = cfg.num_layers if layer is None else layer
    if not 0 <= layer <= cfg.num_layers:
        raise ValueError(f"layer={layer} is not in [0, {cfg.num_layers}] for this encoder")
    params = loaded.params if loaded.params is not None else _fresh_params(cfg, seed)
    embed = SentenceEmbedder(cfg, params, loaded.tokenizer,
                             max_seq_length=max_seq_length, batch_size=batch_size)

    per_lang: dict[str, dict] = {}
    extra: dict[str, Any] = {"layer": layer}
    if task == "tatoeba":
        sweep = {}
        for lang, (xx, en) in pairs.items():
            xx, en = xx[:max_sentences], en[:max_sentences]
            ex, ee = embed(xx), embed(en)
            by_layer = [scorers.retrieval_accuracy(ex[i], ee[i]) for i in range(len(ex))]
            sweep[lang] = {
                "xx2en": [r["src2tgt"] for r in by_layer],
                "en2xx": [r["tgt2src"] for r in by_layer],
            }
            chosen = by_layer[layer]
            per_lang[lang] = {
                "accuracy": chosen["src2tgt"],
                "accuracy_en2xx": chosen["tgt2src"],
                "num_examples": chosen["num_examples"],
            }
            log.info("tatoeba %s: %s", lang, per_lang[lang])
        extra["layer_sweep"] = {
            str(i): {
                "xx2en": float(np.mean([v["xx2en"][i] for v in sweep.values()])),
                "en2xx": float(np.mean([v["en2xx"][i] for v in sweep.values()])),
            }
            for i in range(cfg.num_layers + 1)
        }
        extra["per_layer"] = sweep
        metric = "accuracy"
    else:
        for lang, (src, tgt, gold) in bucc.items():
            src, tgt = _bucc_subset(src, tgt, gold, max_sentences)
            src_ids, tgt_ids = list(src), list(tgt)
            es = embed([src[i] for i in src_ids])[layer]
            et = embed([tgt[i] for i in tgt_ids])[layer]
            best, score = mine_bitext(es, et)
            cands = [(src_ids[i], tgt_ids[best[i]], float(score[i])) for i in range(len(src_ids))]
            per_lang[lang] = {
                **scorers.bitext_mining_f1(cands, gold),
                "num_examples": len(gold),
                "num_source": len(src_ids),
                "num_target": len(tgt_ids),
            }
            log.info("bucc %s-en: %s", lang, per_lang[lang])
        metric = "f1"
    results = {
        "task": task,
        "metric": metric,
        "languages": per_lang,
        **scorers.transfer_summary(per_lang, metric),
        **extra,
        "model": {
            "checkpoint": initial_checkpoint_path,
            "source": loaded.source,
            "vocab_path": loaded.tokenizer.model_path,
            "encoder": dataclasses.asdict(cfg),
        },
        "settings": {"max_seq_length": max_seq_length, "max_sentences": max_sentences,
                     "layer": layer, "dtype": dtype},
        "total_seconds": time.time() - t0,
    }
    write_results(model_dir, results)
    return results


def _bucc_subset(src: dict, tgt: dict, gold: set, limit: int | None):
    if limit is None:
        return src, tgt
    gold_src = {a for a, _ in gold}
    gold_tgt = {b for _, b in gold}
    keep_src = [i for i in src if i in gold_src] + [i for i in src if i not in gold_src][:limit]
    keep_tgt = [i for i in tgt if i in gold_tgt] + [i for i in tgt if i not in gold_tgt][:limit]
    return {i: src[i] for i in keep_src}, {i: tgt[i] for i in keep_tgt}
