"""Released-format tokenizer folders, made here (no download), in the field's three layouts.

* ``gemma``: mmBERT's layout (``<pad>`` 0 ``<eos>`` 1 ``<bos>`` 2 ``<unk>`` 3 ``<mask>`` 4,
  ``<bos> a <eos> b <eos>``), by the library's own ``hf_tokenizer.train_tokenizer``;
* ``modernbert``: ModernBERT's (a byte-level BPE whose ``[UNK]``, ``[CLS]``, ``[SEP]``,
  ``[PAD]`` and ``[MASK]`` come after the pieces, ``[CLS] a [SEP] b [SEP]``);
* ``xlmr``: XLM-R's (fairseq's offset: ``<s>`` 0 ``<pad>`` 1 ``</s>`` 2 ``<unk>`` 3,
  ``<mask>`` last, ``<s> a </s></s> b </s>``), as ``hf to_hf`` writes it from a
  SentencePiece model of ours.

Each is the folder a user would download: ``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json``, loadable by ``transformers.AutoTokenizer``.
"""

from __future__ import annotations

import json
import pathlib

LAYOUTS = ("gemma", "modernbert", "xlmr")
MODERNBERT_SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")


def _modernbert(folder: pathlib.Path, lines, vocab_size: int) -> None:
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=vocab_size - len(MODERNBERT_SPECIALS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens(list(MODERNBERT_SPECIALS))  # after the pieces, as ModernBERT's
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.save(str(folder / "tokenizer.json"))
    named = {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
             "pad_token": "[PAD]", "mask_token": "[MASK]"}
    (folder / "special_tokens_map.json").write_text(json.dumps(named))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192, **named}))


def tokenizer_folder(folder: pathlib.Path, layout: str, lines, *, spm_path=None,
                     vocab_size: int = 500) -> pathlib.Path:
    """Writes a tokenizer folder of ``layout`` trained on ``lines`` (``xlmr``: converted
    from the SentencePiece model ``spm_path``)."""
    from xlmeta_jax.data import hf_tokenizer
    from xlmeta_jax.interop.hf import tokenizer as hf_layout

    folder.mkdir(parents=True, exist_ok=True)
    if layout == "gemma":
        hf_tokenizer.train_tokenizer(folder, lines, vocab_size)
    elif layout == "modernbert":
        _modernbert(folder, lines, vocab_size)
    else:
        files, _ = hf_layout.tokenizer_files(spm_path, vocab_size=10**6, model_max_length=512)
        for name, data in files.items():
            (folder / name).write_bytes(data)
    return folder
