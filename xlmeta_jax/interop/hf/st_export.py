"""A contrastive run's export as sentence-transformers lays a model out.

``python -m xlmeta_jax.hf to_hf`` on a checkpoint that records embedding settings (a
run of ``gin/finetune/embeddings.gin``) adds, beside the transformers files, what
``sentence_transformers.SentenceTransformer(path)`` reads: ``modules.json`` (the
Transformer, a Pooling of the run's kind, Normalize), ``sentence_bert_config.json`` (the
run's tokens per text), ``1_Pooling/config.json`` and ``config_sentence_transformers.json``
(cosine similarity). The module types are named as sentence-transformers has named them
since 2.x (``sentence_transformers.models.*``), so that every release since loads them.
Its ``encode`` then gives the run's embeddings (:mod:`xlmeta_jax.evaluation.embeddings`),
normalised, to float32 rounding.
"""

from __future__ import annotations

import json
import pathlib

from xlmeta_jax import files
from xlmeta_jax.evaluation import embeddings

_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": embeddings.POOLING_DIR,
     "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize",
     "type": "sentence_transformers.models.Normalize"},
]
_POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                  "weightedmean_tokens", "lasttoken")


def write(folder: str | pathlib.Path, settings: embeddings.EmbeddingSettings,
          hidden_size: int, max_tokens: int) -> list[str]:
    """Writes the sentence-transformers files into an export folder; returns their names.

    Args:
      folder: the transformers export (config.json, weights, tokenizer) to complete.
      settings: the run's pooling and tokens per text.
      hidden_size: the embeddings' width.
      max_tokens: the most tokens the exported model takes (its tokenizer's limit).
    """
    folder = pathlib.Path(folder)
    chosen = {"mean": "mean_tokens", "cls": "cls_token"}[settings.pooling]
    pooling = {"word_embedding_dimension": hidden_size,
               **{f"pooling_mode_{m}": m == chosen for m in _POOLING_MODES},
               "include_prompt": True}
    written = {
        embeddings.MODULES_NAME: _MODULES,
        embeddings.ST_CONFIG_NAME: {"max_seq_length": min(settings.max_seq_length, max_tokens),
                                    "do_lower_case": False},
        f"{embeddings.POOLING_DIR}/config.json": pooling,
        "config_sentence_transformers.json": {
            "model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None,
            "similarity_fn_name": "cosine"},
    }
    (folder / "2_Normalize").mkdir(exist_ok=True)
    for name, content in written.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(folder / name, json.dumps(content, indent=2) + "\n")
    return sorted(written)
