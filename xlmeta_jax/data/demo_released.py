"""The continued-pretraining demo's inputs: a "released" model and new text for it.

gin/demo_continue.gin continues a model as a user continues mmBERT: from a Hugging Face
folder in its own tokenizer. Nothing can be downloaded here, so :func:`released_model`
makes that folder the first time, the way a release is made: a tokenizer in Gemma's id
layout (``hf_tokenizer.train_tokenizer``: ``<pad>`` 0 ``<eos>`` 1 ``<bos>`` 2 ``<unk>`` 3
``<mask>`` 4, not seqio's) trained on English (Python's documentation topics), and a tiny
``ModernBertForMaskedLM`` saved by transformers itself. :func:`new_text` writes what the
model then learns: the UDHR sample texts of languages it has not seen (``gflanguages``).
Both live under ``MODEL_DIR/demo_data/`` and are written whole, once; a rerun reuses them.
"""

from __future__ import annotations

import logging
import os
import pathlib
import tempfile
from collections.abc import Sequence

from xlmeta_jax import files
from xlmeta_jax.data import demo_corpus, english_pd, hf_tokenizer

log = logging.getLogger("xlmeta_jax.train")

RELEASED_DIR, NEW_TEXT_DIR = "released", "new_languages"
NEW_LANGUAGES = ("sw", "hi", "ur", "vi", "th")


def released_model(model_dir: str, vocab_size: int = 1000, rows: int = 1024,
                   seed: int = 0) -> str:
    """Builds ``MODEL_DIR/demo_data/released`` once (tokenizer, ``config.json``, weights);
    returns the folder.

    Args:
      model_dir: the run's MODEL_DIR.
      vocab_size: the tokenizer's ids.
      rows: the embedding's rows (released models round their tables up: the rows past
        the tokenizer are padding).
      seed: torch's seed of the random initialisation.

    Raises:
      DemoCorpusError: transformers or torch is not installed (README's test command
        installs both).
    """
    folder = demo_corpus.demo_path(model_dir, RELEASED_DIR)
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    try:
        import torch  # noqa: PLC0415 - the demo's release is made with transformers
        import transformers  # noqa: PLC0415
    except ImportError as e:
        raise demo_corpus.DemoCorpusError(
            f"gin/demo_continue.gin makes its released model with transformers and torch "
            f"({e.name} is not installed): pip install -c constraints.txt -e '.[test]'") from None
    log.info("making the demo's released model in %s: a tiny ModernBERT saved by "
             "transformers, its tokenizer in Gemma's id layout (once per MODEL_DIR)", folder)
    with files.built_whole(folder) as tmp, tempfile.TemporaryDirectory() as text_dir:
        lines = [line for path in english_pd.english_text_files(text_dir)
                 for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines()
                 if line.strip()]
        hf_tokenizer.train_tokenizer(tmp, lines, vocab_size)
        specials = hf_tokenizer.read(tmp).specials
        torch.manual_seed(seed)
        config = transformers.ModernBertConfig(
            vocab_size=rows, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, global_attn_every_n_layers=3, local_attention=32,
            max_position_embeddings=512, pad_token_id=specials.pad, bos_token_id=specials.cls,
            eos_token_id=specials.sep, cls_token_id=specials.cls, sep_token_id=specials.sep)
        # transformers' own switch for its progress bars (save_pretrained draws one).
        transformers.utils.logging.disable_progress_bar()
        transformers.ModernBertForMaskedLM(config).save_pretrained(tmp)
    return folder


def new_text(model_dir: str, languages: Sequence[str] = NEW_LANGUAGES) -> str:
    """Writes the UDHR sample texts of ``languages`` once under
    ``MODEL_DIR/demo_data/new_languages`` (a document of eight paragraphs at a time, the
    corpora's layout); returns a glob of the files."""
    folder = demo_corpus.demo_path(model_dir, NEW_TEXT_DIR)
    if not os.path.isdir(folder):
        with files.built_whole(folder) as tmp:
            for lang in languages:
                try:
                    paragraphs = demo_corpus.udhr_paragraphs(lang)
                except ValueError as e:
                    raise demo_corpus.DemoCorpusError(f"new_text.languages: {e}") from None
                with open(os.path.join(tmp, f"{lang}.txt"), "w", encoding="utf-8") as f:
                    f.write("".join(f"{p}\n" + ("\n" if i % 8 == 7 else "")
                                    for i, p in enumerate(paragraphs)))
    return os.path.join(folder, "*.txt")


