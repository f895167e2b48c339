"""A small multilingual SentencePiece vocabulary for demo-size runs and tests.

Trained on real text from the shared data folder: English public-domain text
(``english_pd/tinyshakespeare``) and the Leipzig sentences of 75 languages by the
pretraining vocabulary's trainer (:func:`xlmeta_jax.data.vocabulary.train_sentencepiece`),
so it has our special ids (pad 0, eos 1, unk 2, ``<s>`` 3, ``<mask>`` 4). Demo gin files point
``VOCAB_PATH`` at the model this writes::

    python -m xlmeta_jax.evaluation.demo_vocab --output=/tmp/xlmeta_demo/spm
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib

from xlmeta_jax.data import vocabulary
from xlmeta_jax.evaluation import readers, tokenization


def demo_sentences(data_dir=None, english_lines: int = 4000, per_language: int = 100):
    """English lines plus ``per_language`` Leipzig sentences of every language."""
    data_dir = readers.resolve_data_dir(data_dir)
    shakespeare = data_dir / "english_pd" / "tinyshakespeare" / "input.txt"
    lines = [line for line in readers.read_lines(shakespeare) if line.strip()][:english_lines]
    leipzig = sorted((data_dir / "leipzig_sentences" / "sentences").glob("*.txt"))
    if not leipzig:
        raise FileNotFoundError(f"no Leipzig sentences under {data_dir / 'leipzig_sentences'}")
    for path in leipzig:
        lines.extend(line for line in readers.read_lines(path)[:per_language] if line.strip())
    return lines


def build_demo_vocab(
    output_prefix: str | os.PathLike, data_dir=None, vocab_size: int = 4096
) -> str:
    """Trains the demo vocabulary; returns the ``.model`` path (reused if it exists)."""
    model = pathlib.Path(f"{os.fspath(output_prefix)}.model")
    if model.is_file():
        try:
            tokenization.Tokenizer(model)
            return os.fspath(model)
        except vocabulary.VocabularyError:
            # Written before <s> and <mask> became control symbols: retraining gives
            # the same pieces at the same ids, with the special ones fixed.
            logging.info("retraining the demo vocabulary %s (outdated special symbols)", model)
    model.parent.mkdir(parents=True, exist_ok=True)
    return vocabulary.train_sentencepiece(
        output_prefix, vocab_size, sentences=demo_sentences(data_dir), character_coverage=0.995
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="model prefix (writes PREFIX.model)")
    parser.add_argument("--data_dir", default=None, help="shared data folder")
    parser.add_argument("--vocab_size", type=int, default=4096)
    args = parser.parse_args(argv)
    print(build_demo_vocab(args.output, args.data_dir, args.vocab_size))


if __name__ == "__main__":
    main()
