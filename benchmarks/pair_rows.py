"""The contrastive rows' ids: through their seqio task, its token cache, and the tokenizer alone.

    python -m benchmarks.pair_rows [--languages=40] [--repeat=2] [--vocab_size=65536]

Rows are FLORES-200 devtest translation pairs (``--languages`` languages with English, as
``embeddings.bitext_dir`` reads them, ``--repeat`` times over, as JSONL) in a BPE of
``--vocab_size`` ids in Gemma's layout trained on that text. In one process, each the better
of two runs, in rows per second of wall time and per CPU-second of the process:

1. **the tokenizer alone**: ``encode_batch`` of each column, ``cls``/``sep`` and padding into
   the ``[rows, length]`` arrays (what the run did before the task);
2. **on the fly**: ``pair_task.token_arrays`` (the task's source, its tokenize step in
   tf.data, the arrays);
3. **the cache job**: ``pair_task.cache`` (Beam's DirectRunner, one worker);
4. **from the cache**: ``pair_task.token_arrays`` with ``cache_dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from benchmarks.tokenize_speed import _SHARED, _measure


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--languages", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--vocab_size", type=int, default=65536)
    args = parser.parse_args(argv)

    import numpy as np

    from xlmeta_jax.data import hf_tokenizer
    from xlmeta_jax.evaluation import pair_task, pairs, tokenization

    folder = os.path.join(_SHARED, "flores200", "devtest")
    languages = sorted(n.split(".")[0] for n in os.listdir(folder)
                       if n.endswith(".devtest") and not n.startswith("eng_Latn"))
    rows = pairs.bitext_pairs(folder, languages[:args.languages]) * args.repeat
    work = tempfile.mkdtemp(prefix="pair_rows.")
    rows_path = os.path.join(work, "rows.jsonl")
    with open(rows_path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"query": r.query, "positive": r.positive},
                               ensure_ascii=False) + "\n")
    tok_dir = os.path.join(work, "bpe")
    hf_tokenizer.train_tokenizer(tok_dir, [t for r in rows[:len(rows) // args.repeat]
                                           for t in r.texts()], args.vocab_size)
    tokenizer = tokenization.load_tokenizer(tok_dir)
    source = pair_task.RowSource(train_files=(rows_path,), tokenizer_path=tok_dir)
    lengths = {"query": 128, "document": 128}
    print(f"FLORES-200 devtest pairs, {args.languages} languages x {args.repeat}: {len(rows)} "
          f"rows; BPE of {args.vocab_size} ids")

    def alone():
        out = {}
        for name in ("query", "positive"):
            texts = [getattr(r, name) for r in rows]
            ids = np.full((len(rows), 128), tokenizer.pad_id, np.int32)
            for i, row in enumerate(tokenizer.encode_batch(texts)):
                row = tokenizer.single(row, 128)
                ids[i, :len(row)] = row
            out[name] = ids
        return len(rows)

    def on_the_fly():
        pair_task.token_arrays(source, rows, lengths, tokenizer.pad_id)
        return len(rows)

    cache_dir = os.path.join(work, "cache")

    def cache_job():
        pair_task.cache(source, cache_dir, overwrite=True,
                        beam_args=["--direct_num_workers=1", "--direct_running_mode=in_memory"])
        return len(rows)

    def cached():
        pair_task.token_arrays(source, rows, lengths, tokenizer.pad_id, cache_dir=cache_dir)
        return len(rows)

    print(f"{'path':40s} {'rows/s':>10s} {'rows/CPU-s':>11s} {'x alone (CPU)':>13s}")
    reference = None
    for name, fn in (("the tokenizer alone (before the task)", alone),
                     ("on the fly, through the task", on_the_fly),
                     ("the cache job, 1 worker", cache_job),
                     ("from the cache, through the task", cached)):
        fn()  # warm-up: TensorFlow's graphs, Beam's first job
        n, cpu, wall = min((_measure(fn) for _ in range(2)), key=lambda m: m[1])
        reference = reference or n / cpu
        print(f"{name:40s} {n / wall:10,.0f} {n / cpu:11,.0f} {n / cpu / reference:13.2f}")


if __name__ == "__main__":
    main()
