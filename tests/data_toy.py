"""Toy corpora for the data tests: CC-100-layout files from real shared text.

Leipzig sentences (not an evaluation set) become a ~10-language CC-100 folder
with different sizes per language, so that alpha sampling has something to do.
"""

from __future__ import annotations

import os

# Languages of several scripts (ja and th are written without spaces).
TOY_LANGUAGES = ("en", "de", "ru", "ar", "hi", "sw", "vi", "th", "ja", "af")
# n_l in paragraphs: different per language (ja has 412 in the source).
TOY_LINES = dict(zip(TOY_LANGUAGES, (600, 400, 300, 220, 160, 120, 90, 70, 50, 40)))
# Paragraphs per document in the toy files.
LINES_PER_DOC = 4
VOCAB_SIZE = 2000


def write_cc100_dir(
    shared_data, out_dir, languages=TOY_LANGUAGES
) -> dict[str, list[list[str]]]:
    """Writes ``{lang}.txt`` per toy language; returns each language's documents."""
    os.makedirs(out_dir, exist_ok=True)
    source = os.path.join(shared_data, "leipzig_sentences", "sentences")
    docs_by_lang = {}
    for lang in languages:
        with open(os.path.join(source, f"{lang}.txt"), encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip()][: TOY_LINES[lang]]
        assert len(lines) == TOY_LINES[lang], lang
        docs = [lines[i : i + LINES_PER_DOC] for i in range(0, len(lines), LINES_PER_DOC)]
        with open(os.path.join(out_dir, f"{lang}.txt"), "w", encoding="utf-8") as f:
            for doc in docs:
                f.write("\n".join(doc) + "\n\n")
        docs_by_lang[lang] = docs
    return docs_by_lang


def train_toy_vocabulary(
    cc_dir, out_prefix, seed: int = 0, languages=TOY_LANGUAGES, vocab_size=VOCAB_SIZE
) -> str:
    from xlmeta_jax.data import vocabulary

    return vocabulary.train_vocabulary(
        {lang: [os.path.join(cc_dir, f"{lang}.txt")] for lang in languages},
        out_prefix,
        vocab_size,
        alpha=0.3,
        seed=seed,
        num_lines=3000,
        num_threads=2,
        print_report=False,
    )


def cached_documents(task_folder, eos_after: str, eos_id: int, split: str = "train"
                     ) -> list[int]:
    """Documents per record of a task's token cache, after checking that every record
    ends where a document ends (records never split one)."""
    import numpy as np
    import seqio
    import tensorflow as tf

    from xlmeta_jax.data import token_cache

    files = sorted(tf.io.gfile.glob(
        seqio.utils.get_cached_tfrecord_prefix(str(task_folder), split) + "-*"))
    counts = []
    for raw in tf.data.TFRecordDataset(files).as_numpy_iterator():
        tokens = np.array(tf.train.Example.FromString(raw).features.feature["tokens"]
                          .int64_list.value)
        ends = token_cache.document_ends(tokens, eos_after, False, eos_id)
        assert ends.size and ends[-1] == tokens.size - 1, "a record splits a document"
        counts.append(int(ends.size))
    return counts
