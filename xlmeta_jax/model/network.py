"""The encoder families behind one interface: :func:`masked_lm` builds the network a
config names (``EncoderConfig.family``), so the step, the trainers and the exports never
branch on the family.

* ``xlmr``       — XLM-R / RoBERTa (:mod:`xlmeta_jax.model.xlmr`), HF ``XLMRobertaForMaskedLM``;
* ``modernbert`` — ModernBERT / mmBERT (:mod:`xlmeta_jax.model.modernbert`), HF
  ``ModernBertForMaskedLM``.

Both are called the same way::

    module = network.masked_lm(config)
    logits = module.apply({"params": params}, input_ids, attention_mask)  # [b, l, vocab]
    logits = module.apply({"params": params}, input_ids, mlm_positions=slots)  # [b, s, vocab]

and ``module.encode(...)`` runs the encoder alone (fine-tuning heads, retrieval). The
modernbert family also takes ``segment_ids=`` for packed rows. What else the house asks of
a family (its FLOPs, its rules for a run, its fine-tuning heads) is :func:`family`'s
record. The config, the named sizes
(:func:`get_config`) and the XLM-R modules are importable from here too.
"""

from __future__ import annotations

import flax.linen as nn

from xlmeta_jax.model import modernbert, xlmr
from xlmeta_jax.model.config import (  # noqa: F401 - the encoder's config, named here too
    DROPOUT_MASK_BITS,
    FAMILIES,
    REMAT_POLICIES,
    SIZES,
    EncoderConfig,
    ModelConfigError,
    get_config,
)
from xlmeta_jax.model.family import Family
from xlmeta_jax.model.layers import Dropout, resolve_attention_impl  # noqa: F401
from xlmeta_jax.model.modernbert import ModernBertForMaskedLM  # noqa: F401
from xlmeta_jax.model.xlmr import (  # noqa: F401 - XLM-R's modules, as before the families
    Embeddings,
    Encoder,
    EncoderLayer,
    MLMHead,
    SelfAttention,
    XLMRForMaskedLM,
    position_ids_from_input_ids,
)

# Every family, by name (EncoderConfig.family: FAMILIES lists the same names).
_FAMILIES = {f.name: f for f in (xlmr.FAMILY, modernbert.FAMILY)}
assert tuple(_FAMILIES) == tuple(FAMILIES), "model/config.py's FAMILIES and the modules differ"


def family(config: EncoderConfig) -> Family:
    """What the rest of the house asks of ``config.family`` (:class:`~.family.Family`)."""
    return _FAMILIES[config.family]


def masked_lm(config: EncoderConfig) -> nn.Module:
    """The masked-LM network of ``config.family`` (parameters ``{'encoder', 'lm_head'}``)."""
    return family(config).masked_lm(config)


def encoder(config: EncoderConfig, **kwargs) -> nn.Module:
    """The encoder alone of ``config.family`` (the ``encoder`` subtree of
    :func:`masked_lm`'s parameters); ``kwargs`` are module arguments such as ``name``."""
    return family(config).encoder(config, **kwargs)
