"""The ``README.md`` (model card) of a Hugging Face export: how to load it, and what to avoid.

Written by :func:`xlmeta_jax.interop.hf.weights.save_hf` next to the weights, so the
notes reach whoever downloads the directory: which tokenizer class gives the model's
ids, the id layout, and the position table's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xlmeta_jax.interop.hf import families

README_NAME = "README.md"

_LOAD = """```python
from transformers import AutoModelForMaskedLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{where}")
model = AutoModelForMaskedLM.from_pretrained("{where}")
```"""

# transformers 5's XLMRobertaTokenizer rebuilds the Unigram model without byte fallback. The
# counts: tests/test_hf_export.py's vocabulary and sentences, transformers 5.24.
_BYTE_FALLBACK = """\
The vocabulary falls back to UTF-8 byte pieces for characters it does not hold, so
`tokenizer_config.json` names the generic `PreTrainedTokenizerFast`, which `AutoTokenizer`
builds from `tokenizer.json` as written: it gives the ids the model was trained on.
**Do not name `XLMRobertaTokenizer` explicitly**: transformers rebuilds that class without
byte fallback and maps every such character to `<unk>`, so its ids differ on any text with
one: on the UDHR sample sentences of 21 languages, 12 of them seen by a 1200-piece test
vocabulary, `XLMRobertaTokenizer` gave the model's ids for 49 of 84 sentences, `AutoTokenizer`
for all 84."""

_NO_BYTE_FALLBACK = """\
The vocabulary has no byte pieces: `AutoTokenizer` builds `XLMRobertaTokenizer`
(as `tokenizer_config.json` names it), which gives the ids the model was trained on."""


def model_card(hf_config: Mapping[str, Any], tokenizer_class: str | None,
               seqio_pieces: int | None) -> str:
    """The model card of an export.

    Args:
      hf_config: the export's ``config.json`` dict.
      tokenizer_class: what ``tokenizer_config.json`` names; None when the export has
        no tokenizer files.
      seqio_pieces: the pieces of our SentencePiece model when the export renumbered our
        ids into XLM-R's (None: the model was in XLM-R's ids already).

    Returns:
      Markdown text; the same for the same arguments (re-exports are byte-identical).
    """
    family = families.of_hf_config(hf_config, "the export's config.json")
    title, inputs = family.card_description(hf_config)
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: fill-mask",
        "---",
        "",
        title,
        "",
        f"`{hf_config['architectures'][0]}`: {hf_config['num_hidden_layers']} layers, hidden "
        f"size {hf_config['hidden_size']}, {hf_config['num_attention_heads']} attention heads, "
        f"{hf_config['vocab_size']} ids. {inputs} Exported by `python -m xlmeta_jax.hf "
        "to_hf`.",
        "",
        _LOAD.format(where="path/to/this/directory"),
        "",
        "## Tokenizer",
        "",
    ]
    if tokenizer_class is None:
        lines.append("The export has no tokenizer files: the model uses XLM-R's ids, so XLM-R's "
                     "own `sentencepiece.bpe.model` tokenizer fits it.")
    elif tokenizer_class == "PreTrainedTokenizerFast":
        lines.append(_BYTE_FALLBACK)
    else:
        lines.append(_NO_BYTE_FALLBACK)
    if seqio_pieces is not None:
        lines += [
            "",
            "## Ids",
            "",
            f"The model was trained with seqio's ids of a {seqio_pieces}-piece SentencePiece "
            "vocabulary (`<pad>` 0, `</s>` 1, `<unk>` 2, `<s>` 3, `<mask>` 4). The export "
            "renumbers them, and permutes the embedding rows to match, into XLM-R's: `<s>` 0, "
            f"`<pad>` 1, `</s>` 2, `<unk>` 3, `<mask>` {seqio_pieces - 1}, so every XLM-R-aware "
            "tool reads them. " + family.CARD_IDS_NOTE +
            "`python -m xlmeta_jax.hf to_flax` converts the directory back to our ids "
            "(`config.json` records the renumbering).",
        ]
    return "\n".join(lines) + "\n"
