"""Our contrastive step against sentence-transformers', on this machine's CPU, in one process.

    python -m benchmarks.embedding_step [--layers=4] [--hidden=256] [--batch=64]
        [--length=64] [--mini_batch=16] [--steps=5]

One XLM-R encoder (random weights, ``--layers`` x ``--hidden``, an 8000-row vocabulary),
exported with ``save_hf`` and loaded by ``SentenceTransformer`` (Transformer + mean Pooling),
trains on the same ``--batch`` pairs of ``--length`` tokens (full rows, no padding, so both
sides see the same shapes) with AdamW:

1. ours, ``MultipleNegativesRankingLoss``'s loss in one pass (the jitted step of
   ``evaluation/embedding_step.py``);
2. ours with GradCache (``--mini_batch`` rows per pass);
3. sentence-transformers' ``MultipleNegativesRankingLoss`` (forward, backward, AdamW);
4. its ``CachedMultipleNegativesRankingLoss`` at the same mini-batch.

Each figure is the median step time of ``--steps`` steps after one warm-up step (ours:
compiled in the warm-up), and pairs per second; the ratios compare ours with theirs at the
same loss, and each cache with its plain loss (GradCache's overhead: the extra forward).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def _median_seconds(step, steps: int) -> float:
    step()  # warm-up: compiles ours
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _tokenizer_files(folder: str) -> None:
    """A word-level tokenizer of XLM-R's special tokens: the batches are given as ids, but
    sentence-transformers' Transformer loads a tokenizer."""
    import json
    import os

    import tokenizers
    from tokenizers import models

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(
        os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                   "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}, f)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--mini_batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)

    import flax.linen as nn
    import jax
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import losses as st_losses
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from xlmeta_jax.evaluation import embedding_step, training
    from xlmeta_jax.interop.hf import weights as hf
    from xlmeta_jax.model import network, partitioning
    from xlmeta_jax.model.network import EncoderConfig

    cfg = EncoderConfig(vocab_size=8000, hidden_size=args.hidden, num_layers=args.layers,
                        num_heads=max(1, args.hidden // 64), mlp_dim=4 * args.hidden,
                        max_position_embeddings=args.length + 2, dropout_rate=0.0,
                        attention_dropout_rate=0.0)
    params = jax.device_get(nn.unbox(network.masked_lm(cfg).init(
        jax.random.key(0), np.ones((1, 4), np.int32), deterministic=True)["params"]))
    rng = np.random.default_rng(0)
    # XLM-R's ids: 0 <s>, 1 pad, 2 </s>; every row full.
    ids = rng.integers(5, cfg.vocab_size, (2, args.batch, args.length)).astype(np.int32)
    ids[:, :, 0], ids[:, :, -1] = 0, 2
    batch = {"query": ids[0], "positive": ids[1]}

    def optimizer():
        return training.make_finetune_optimizer(
            learning_rate=1e-5, warmup_steps=0, total_steps=1000, weight_decay=0.01,
            b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=1.0)

    mesh = partitioning.create_mesh(data=1, devices=jax.devices()[:1])
    ours = {}
    for name, mini in (("plain", None), ("cached", args.mini_batch)):
        fns = embedding_step.make_embedding_step(
            cfg, optimizer(), mesh, embedding_step.LossSettings(mini_batch_size=mini))
        state = [fns.from_params(jax.device_put(params, fns.state_sharding.params))]

        def step(fns=fns, state=state):
            state[0], metrics = fns.train_step(state[0], batch)
            jax.block_until_ready(metrics["loss"])

        ours[name] = _median_seconds(step, args.steps)

    theirs = {}
    with tempfile.TemporaryDirectory() as folder:
        hf.save_hf(folder, cfg, params)
        _tokenizer_files(folder)
        model = SentenceTransformer(modules=[Transformer(folder, max_seq_length=args.length),
                                             Pooling(args.hidden, "mean")], device="cpu")
        model.train()
        features = [{"input_ids": torch.from_numpy(ids[i]).long(),
                     "attention_mask": torch.ones(args.batch, args.length, dtype=torch.long)}
                    for i in range(2)]
        for name in ("plain", "cached"):
            loss_fn = (st_losses.CachedMultipleNegativesRankingLoss(
                model, mini_batch_size=args.mini_batch) if name == "cached"
                else st_losses.MultipleNegativesRankingLoss(model))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

            def step(loss_fn=loss_fn, opt=opt):
                loss = loss_fn([dict(f) for f in features], None)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad()

            theirs[name] = _median_seconds(step, args.steps)

    print(f"encoder {args.layers} x {args.hidden}, batch {args.batch} pairs of {args.length} "
          f"tokens, GradCache mini-batch {args.mini_batch}, median of {args.steps} steps, "
          f"CPU ({jax.devices()[0].device_kind}; torch {torch.get_num_threads()} threads)")
    print(f"{'':34s} {'s/step':>8s} {'pairs/s':>8s}")
    rows = (("ours, plain loss", ours["plain"]), ("ours, GradCache", ours["cached"]),
            ("sentence-transformers MNRL", theirs["plain"]),
            ("sentence-transformers CMNRL", theirs["cached"]))
    for label, seconds in rows:
        print(f"{label:34s} {seconds:8.3f} {args.batch / seconds:8.1f}")
    ratios = {
        "ours / theirs, plain (time)": ours["plain"] / theirs["plain"],
        "ours / theirs, cached (time)": ours["cached"] / theirs["cached"],
        "GradCache overhead, ours": ours["cached"] / ours["plain"],
        "GradCache overhead, theirs": theirs["cached"] / theirs["plain"],
    }
    for label, ratio in ratios.items():
        print(f"{label:34s} {ratio:8.2f}")
    return {"ours": ours, "theirs": theirs, "ratios": ratios}


if __name__ == "__main__":
    main()
