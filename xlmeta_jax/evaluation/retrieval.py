"""Sentence retrieval without fine-tuning: how well aligned are the representations?

Both tasks follow XTREME (``third_party/evaluate_retrieval.py``, ``utils_retrieve.py``):
every sentence (stripped, at most ``max_seq_length`` = 512 tokens with ``<s>`` and
``</s>``) is embedded from one layer's hidden states. ``layer`` counts as XTREME's
``--specific_layer`` for a 12-layer encoder: the embedding output is dropped, so layer 7
is Hugging Face ``hidden_states[8]``.

* Tatoeba (``run_tatoeba.sh``): the mean over all tokens (``<s>`` and ``</s>``
  included), layer 7 of base, 13 (``hidden_states[14]``) of large.
* BUCC (``run_bucc2018.sh``): ``--pool_type cls``, the hidden state of ``<s>``, and
  ``--specific_layer 7`` for every size, without ``--num_layers``: evaluate_retrieval.py
  keeps the last 12 hidden states (its default ``--num_layers 12``) and takes the 8th
  of them — layer 7 of base, layer 19 (``hidden_states[20]``) of large
  (:func:`bucc_xtreme_layer`).

* Tatoeba (LASER v1, up to 1000 translation pairs per language): the headline
  ``accuracy`` is XTREME's direction, en -> xx (the xx sentences are indexed, every
  English sentence queries its cosine nearest neighbour); ``accuracy_xx2en`` is the
  reverse. Both are also reported for every ``hidden_states`` index as a sweep.
* BUCC 2018 (zh-en dev here): identical sentences are merged, then mined with the ratio
  margin of Artetxe & Schwenk in both directions (``retrieval='max'``: k = 4 nearest
  neighbours each way, each sentence's best candidate among its k neighbours, all
  candidates greedily taken one-to-one by score); ties are broken by the sentences'
  text, so the result does not depend on input order. Pairs map back to ids (a
  sentence that occurs under several ids is dropped, as XTREME's ``read_sent2id``
  does) and are scored by :func:`xlmeta_jax.evaluation.scorers.bitext_mining_f1`. The
  threshold is tuned on the same dev gold pairs that are scored (XTREME tunes on dev
  and reports test; only dev is at hand), so the F1 is an optimistic figure; the
  result says so (``"threshold_tuned_on": "dev (the scored set)"``).

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
from xlmeta_jax.model.network import Encoder, EncoderConfig

log = logging.getLogger(__name__)


POOLINGS = ("mean", "cls")


class SentenceEmbedder:
    """Pooled hidden states of every layer of an encoder, in batches.

    ``pooling``: "mean" over all tokens (XTREME's default ``--pool_type mean``) or "cls",
    the first token ``<s>`` (``--pool_type cls``).
    """

    def __init__(self, cfg: EncoderConfig, params, tokenizer: Tokenizer, *,
                 max_seq_length: int = 128, batch_size: int = 64, pooling: str = "mean"):
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")
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
            if pooling == "cls":
                return stacked[:, :, 0]
            return (stacked * mask).sum(2) / jnp.maximum(mask.sum(1), 1.0)

        self._embed = jax.jit(embed)

    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        """[num_layers + 1, len(sentences), hidden] float32 embeddings."""
        ids = [self.tokenizer.single(x, self.max_seq_length)
               for x in self.tokenizer.encode_batch([t.strip() for t in sentences])]
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


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _knn(x: np.ndarray, y: np.ndarray, k: int, chunk: int = 2048):
    """Cosine similarities and indices of each row of x's k nearest rows of y, best
    first (ties: lower index first)."""
    sims = np.zeros((len(x), k), np.float32)
    inds = np.zeros((len(x), k), np.int64)
    for i in range(0, len(x), chunk):
        sim = x[i : i + chunk] @ y.T
        order = np.argsort(-sim, axis=1, kind="stable")[:, :k]
        inds[i : i + chunk] = order
        sims[i : i + chunk] = np.take_along_axis(sim, order, axis=1)
    return sims, inds


def mine_bitext(
    src: np.ndarray, tgt: np.ndarray, k: int = 4, *, src_keys=None, tgt_keys=None,
    threshold: float = 0.0,
) -> list[tuple[int, int, float]]:
    """XTREME's ``mine_bitext(mode='mine', retrieval='max', margin='ratio')``.

    Args:
      src, tgt: [n, d] embeddings of distinct sentences.
      k: neighbourhood size of the margin (each way).
      src_keys, tgt_keys: per-row sort keys breaking score ties (default: row index).
      threshold: pairs scoring at most this are not returned (XTREME: 0).

    Returns:
      (source row, target row, margin score) pairs, one-to-one, best first.
    """
    x, y = _unit(src), _unit(tgt)
    fwd_sim, fwd_ind = _knn(x, y, min(k, len(y)))
    bwd_sim, bwd_ind = _knn(y, x, min(k, len(x)))
    fwd_mean, bwd_mean = fwd_sim.mean(1), bwd_sim.mean(1)
    # Ratio margin of each candidate: cos(x, y) / ((fwd_mean[x] + bwd_mean[y]) / 2).
    fwd_scores = fwd_sim / ((fwd_mean[:, None] + bwd_mean[fwd_ind]) / 2)
    bwd_scores = bwd_sim / ((bwd_mean[:, None] + fwd_mean[bwd_ind]) / 2)
    fwd_arg, bwd_arg = fwd_scores.argmax(1), bwd_scores.argmax(1)
    fwd_best = fwd_ind[np.arange(len(x)), fwd_arg]
    bwd_best = bwd_ind[np.arange(len(y)), bwd_arg]
    pairs = [(i, int(j), float(fwd_scores[i, fwd_arg[i]])) for i, j in enumerate(fwd_best)]
    pairs += [(int(i), j, float(bwd_scores[j, bwd_arg[j]])) for j, i in enumerate(bwd_best)]
    src_keys = list(range(len(x))) if src_keys is None else list(src_keys)
    tgt_keys = list(range(len(y))) if tgt_keys is None else list(tgt_keys)
    pairs.sort(key=lambda p: (-p[2], src_keys[p[0]], tgt_keys[p[1]]))
    seen_src, seen_tgt, out = set(), set(), []
    for i, j, score in pairs:
        if i in seen_src or j in seen_tgt:
            continue
        seen_src.add(i)
        seen_tgt.add(j)
        if score > threshold:
            out.append((i, j, score))
    return out


def mine_bucc(embed_src, embed_tgt, src: dict, tgt: dict, k: int = 4):
    """Mined (source id, target id, score) candidates of BUCC corpora, as XTREME.

    Args:
      embed_src, embed_tgt: callables from a list of sentences to [n, d] embeddings.
      src, tgt: {id: sentence} corpora.
    """
    src_text = list(dict.fromkeys(src.values()))
    tgt_text = list(dict.fromkeys(tgt.values()))
    mined = mine_bitext(embed_src(src_text), embed_tgt(tgt_text), k,
                        src_keys=src_text, tgt_keys=tgt_text)

    def sent2id(corpus):
        ids: dict[str, list[str]] = {}
        for sid, sentence in corpus.items():
            ids.setdefault(sentence.strip(), []).append(sid)
        return {s: v[0] for s, v in ids.items() if len(v) == 1}

    src_id, tgt_id = sent2id(src), sent2id(tgt)
    cands: dict[tuple[str, str], float] = {}
    for i, j, score in mined:
        a, b = src_text[i].strip(), tgt_text[j].strip()
        if a in src_id and b in tgt_id:
            key = (src_id[a], tgt_id[b])
            cands[key] = max(score, cands.get(key, score))
    return [(a, b, score) for (a, b), score in cands.items()]


def xtreme_layer(num_layers: int) -> int:
    """XTREME's Tatoeba layer for an encoder depth: 7 of 12, 13 of 24, else the last."""
    return {12: 7, 24: 13}.get(num_layers, num_layers - 1)


def bucc_xtreme_layer(num_layers: int) -> int:
    """XTREME's BUCC layer: the 8th of the last 12 layers (7 of 12, 19 of 24), else the last.

    run_bucc2018.sh passes ``--specific_layer 7`` but not ``--num_layers``, so
    evaluate_retrieval.py indexes ``hidden_states[-12:]`` with 7 whatever the depth.
    """
    return num_layers - 12 + 7 if num_layers >= 12 else num_layers - 1


# XTREME's --pool_type of each retrieval task (run_tatoeba.sh: the default, mean).
XTREME_POOLING = {"tatoeba": "mean", "bucc": "cls"}


@gin.configurable(allowlist=["layer", "neighbourhood", "pooling"])
def evaluate_retrieval(
    task: str,
    initial_checkpoint_path: str,
    model_dir: str,
    *,
    data_dir: str | None = None,
    vocab_path: str | None = None,
    languages: Sequence[str] | None = None,
    layer: int | None = None,
    neighbourhood: int = 4,
    pooling: str | None = None,
    max_seq_length: int = 512,
    batch_size: int = 100,
    max_sentences: int | None = None,
    dtype: str = "float32",
    seed: int = 0,
    allow_pickle: bool = False,
    provenance: dict | None = None,
) -> dict[str, Any]:
    """Tatoeba accuracy (with a per-layer sweep) or BUCC F1 of a pretrained encoder.

    Called by :func:`xlmeta_jax.evaluation.finetuning.finetune` for the retrieval tasks
    (``python -m xlmeta_jax.finetune --gin_file=gin/finetune/tatoeba.gin``); only
    ``layer``, ``neighbourhood`` and ``pooling`` are bound in gin
    (``evaluate_retrieval.layer``).

    Args:
      task: "tatoeba" or "bucc".
      initial_checkpoint_path, vocab_path, allow_pickle: see
        :mod:`xlmeta_jax.evaluation.encoders` (``init:<size>`` embeds with random
        weights: the chance-level baseline).
      model_dir: output folder for results.json.
      data_dir: folder laid out like ``../shared/data``.
      languages: Tatoeba languages (XTREME codes or ISO 639-3; default XTREME's 36).
      layer: XTREME's ``--specific_layer`` (0 = first Transformer layer's output, i.e.
        ``hidden_states[1]``); None: XTREME's for the task and depth (Tatoeba: 7 of
        12, 13 of 24; BUCC: 7 of 12, 19 of 24; else the last layer).
      neighbourhood: BUCC margin's k (XTREME: 4).
      pooling: "mean" or "cls" (see :class:`SentenceEmbedder`); None: XTREME's for the
        task (Tatoeba: mean; BUCC: cls).
      max_seq_length: sentences are truncated to this many tokens (XTREME: 512).
      batch_size: sentences per forward pass.
      max_sentences: Tatoeba: use the first N pairs per language; BUCC: keep the gold
        sentences plus the first N others per side (demo runs). None: all.
      dtype: compute dtype of the encoder.
      seed: seed of a fresh ``init:`` encoder.
      provenance: entries added to results.json (data source, comparability).
    """
    if task not in ("tatoeba", "bucc"):
        raise ValueError(f"evaluate_retrieval: task must be 'tatoeba' or 'bucc', got {task!r}")
    if pooling is not None and pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")
    if task == "tatoeba" and languages is not None:
        for lang in languages:
            if lang not in readers.TATOEBA_CODES and len(lang) != 3:
                raise ValueError(f"tatoeba: unknown language {lang!r}")
    langs = list(languages) if languages is not None else list(readers.get_task(task).languages)
    model_dir = pathlib.Path(model_dir)
    t0 = time.time()
    if task == "tatoeba":
        pairs = {lang: readers.read_tatoeba(lang, data_dir) for lang in langs}
    else:
        bucc = {lang: readers.read_bucc(f"{lang}-en", "dev", data_dir) for lang in langs}
    if initial_checkpoint_path.startswith("init:") and vocab_path is None:
        from xlmeta_jax.evaluation import demo_vocab

        model_dir.mkdir(parents=True, exist_ok=True)
        vocab_path = demo_vocab.build_demo_vocab(model_dir / "demo_spm", data_dir)
    loaded = encoders.load_encoder(initial_checkpoint_path, vocab_path, allow_pickle=allow_pickle)
    # Created only once the data and checkpoint are read: a bad input leaves no empty run.
    model_dir.mkdir(parents=True, exist_ok=True)
    cfg = loaded.config.replace(dtype=dtype, dropout_rate=0.0, attention_dropout_rate=0.0)
    if layer is None:
        layer = (bucc_xtreme_layer if task == "bucc" else xtreme_layer)(cfg.num_layers)
    pooling = XTREME_POOLING[task] if pooling is None else pooling
    if not 0 <= layer < cfg.num_layers:
        raise ValueError(
            f"layer={layer} is not in [0, {cfg.num_layers - 1}] for this encoder (XTREME's "
            "counting: 0 is the first Transformer layer; the embedding output is not a layer)"
        )
    # Index into [embedding output, layer 0, layer 1, ...] (Hugging Face hidden_states).
    hidden_index = layer + 1
    max_seq_length = min(max_seq_length, cfg.max_length)
    params = loaded.params if loaded.params is not None else _fresh_params(cfg, seed)
    embed = SentenceEmbedder(cfg, params, loaded.tokenizer, max_seq_length=max_seq_length,
                             batch_size=batch_size, pooling=pooling)

    per_lang: dict[str, dict] = {}
    extra: dict[str, Any] = {"layer": layer, "hidden_states_index": hidden_index,
                             "pooling": pooling}
    if task == "tatoeba":
        sweep = {}
        for lang, (xx, en) in pairs.items():
            xx, en = xx[:max_sentences], en[:max_sentences]
            ex, ee = embed(xx), embed(en)
            # retrieval_accuracy(source=xx, target=en): "tgt2src" queries with English.
            by_layer = [scorers.retrieval_accuracy(ex[i], ee[i]) for i in range(len(ex))]
            sweep[lang] = {
                "en2xx": [r["tgt2src"] for r in by_layer],
                "xx2en": [r["src2tgt"] for r in by_layer],
            }
            chosen = by_layer[hidden_index]
            per_lang[lang] = {
                "accuracy": chosen["tgt2src"],
                "accuracy_xx2en": chosen["src2tgt"],
                "num_examples": chosen["num_examples"],
            }
            log.info("tatoeba %s: %s", lang, per_lang[lang])
        extra["layer_sweep"] = {
            str(i): {
                "en2xx": float(np.mean([v["en2xx"][i] for v in sweep.values()])),
                "xx2en": float(np.mean([v["xx2en"][i] for v in sweep.values()])),
            }
            for i in range(cfg.num_layers + 1)
        }
        extra["layer_sweep_index"] = "hidden_states (0 = embedding output)"
        extra["per_layer"] = sweep
        metric = "accuracy"
    else:
        for lang, (src, tgt, gold) in bucc.items():
            src, tgt = _bucc_subset(src, tgt, gold, max_sentences)
            cands = mine_bucc(lambda xs: embed(xs)[hidden_index],
                              lambda xs: embed(xs)[hidden_index], src, tgt, neighbourhood)
            per_lang[lang] = {
                **scorers.bitext_mining_f1(cands, gold),
                "num_examples": len(gold),
                "num_source": len(src),
                "num_target": len(tgt),
            }
            log.info("bucc %s-en: %s", lang, per_lang[lang])
        extra["threshold_tuned_on"] = "dev (the scored set: optimistic; XTREME reports test)"
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
                     "layer": layer, "neighbourhood": neighbourhood, "pooling": pooling,
                     "dtype": dtype},
        **(provenance or {}),
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
