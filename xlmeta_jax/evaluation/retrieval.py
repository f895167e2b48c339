"""Sentence embeddings and bitext mining of XTREME's retrieval tasks (no fine-tuning).

As XTREME (``third_party/evaluate_retrieval.py``, ``utils_retrieve.py``): every
sentence (stripped, at most ``max_seq_length`` tokens with ``<s>`` and ``</s>``) is
embedded from the hidden states of every layer (:class:`SentenceEmbedder`: mean over all
tokens, or the ``<s>`` state); BUCC's ratio-margin mining is :func:`mine_bitext` /
:func:`mine_bucc`. Identical sentences are merged before mining, ties are broken by the
sentences' text so that the result does not depend on input order, and pairs map back
to ids (a sentence that occurs under several ids is dropped, as XTREME's
``read_sent2id``). Which layer and pooling each task uses, and how it is scored, is the
task's (:mod:`xlmeta_jax.evaluation.tasks.retrieval`).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from xlmeta_jax.evaluation.tokenization import Tokenizer
from xlmeta_jax.model import network
from xlmeta_jax.model.network import EncoderConfig

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
        encoder = network.encoder(cfg)
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
        out = np.zeros((self.cfg.num_layers + 1, len(ids), self.cfg.hidden_size), np.float32)
        for idx, batch in length_sorted_batches(ids, self.batch_size, self.max_seq_length,
                                                self.cfg.pad_token_id):
            out[:, idx] = np.asarray(self._embed(self.params, batch))[:, : len(idx)]
        return out


def length_sorted_batches(ids: Sequence[Sequence[int]], batch_size: int, max_length: int,
                          pad_id: int):
    """``(row indices, [batch_size, width] ids)`` of every batch of ``ids``, in length order.

    Sorting by length keeps padding small, and widths in multiples of 32 (at most
    ``max_length``) keep the number of compiled shapes small; the last batch is filled with
    padding rows.
    """
    order = np.argsort([len(x) for x in ids], kind="stable")
    for i in range(0, len(ids), batch_size):
        idx = order[i : i + batch_size]
        width = min(max_length, -(-max(len(ids[j]) for j in idx) // 32) * 32)
        batch = np.full((batch_size, width), pad_id, np.int32)
        for r, j in enumerate(idx):
            batch[r, : len(ids[j])] = ids[j]
        yield idx, batch


def fresh_params(cfg: EncoderConfig, seed: int):
    """Randomly initialised encoder params (an ``init:`` encoder: the chance baseline)."""
    dummy = jnp.full((1, 8), cfg.pad_token_id + 1, jnp.int32)
    params = network.encoder(cfg).init(jax.random.key(seed), dummy)["params"]
    return jax.device_get(nn.unbox(params))


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


def bucc_subset(src: dict, tgt: dict, gold: set, limit: int | None):
    """The gold sentences of each side plus its first ``limit`` others (None: all)."""
    if limit is None:
        return src, tgt
    gold_src = {a for a, _ in gold}
    gold_tgt = {b for _, b in gold}
    keep_src = [i for i in src if i in gold_src] + [i for i in src if i not in gold_src][:limit]
    keep_tgt = [i for i in tgt if i in gold_tgt] + [i for i in tgt if i not in gold_tgt][:limit]
    return {i: src[i] for i in keep_src}, {i: tgt[i] for i in keep_tgt}
