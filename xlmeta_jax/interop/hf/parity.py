"""Checked at conversion: our network and transformers' on the converted weights.

Each ``hf to_flax`` / ``hf to_hf`` runs both models (fp32, eager attention) on the same
small batch of random ids, one row padded, and compares the MLM logits at every
non-padding position before anything is written. Above :data:`TOLERANCE` (a wrong layout,
NaN weights: ModernBERT#209's NaN logits after conversion) the conversion is refused in
one line. Without transformers installed the check is skipped and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xlmeta_jax.interop.hf.hf_config import ConversionError
from xlmeta_jax.model import network
from xlmeta_jax.model.config import EncoderConfig

# Largest |our logits - HF logits| accepted, fp32. Equal networks differ by summation order
# only (measured 1e-7 to 1e-6 on the tests' models); a layout error differs by O(1).
TOLERANCE = 1e-3
# The batch: two rows, the second padded from the middle.
ROWS, MAX_TOKENS = 2, 32


def batch(cfg: EncoderConfig, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, attention_mask)``: random non-pad ids, the second row half padding."""
    length = min(MAX_TOKENS, cfg.max_length)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size - 1, size=(ROWS, length))
    ids = np.where(ids >= cfg.pad_token_id, ids + 1, ids).astype(np.int32)  # never the pad
    mask = np.ones_like(ids)
    mask[1, length // 2:] = 0
    ids[1, length // 2:] = cfg.pad_token_id
    return ids, mask


def max_difference(hf_config: Mapping[str, Any], state: Mapping[str, np.ndarray],
                   cfg: EncoderConfig, params: Mapping[str, Any]) -> float | None:
    """Max |logits| difference of our ``params`` and HF's ``state`` (the same weights, in
    the ids of ``hf_config``) over the non-padding positions; None without transformers.

    Args:
      hf_config: the ``config.json`` dict of the HF model.
      state: its state dict (numpy arrays; tied weights may be absent).
      cfg: our config of the same model in the same ids (``pad_token_id`` as HF's).
      params: our parameters in ``cfg``'s layout.
    """
    try:
        import torch  # noqa: PLC0415 - optional: the check runs where transformers is
        import transformers  # noqa: PLC0415
    except ImportError:
        return None
    hf = dict(hf_config)
    model_type = hf.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **hf)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForMaskedLM.from_config(config, dtype=torch.float32)
    tensors = {k: torch.tensor(np.asarray(v, np.float32)) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # Tied weights (the decoder, and XLM-R's decoder bias) come from what they are tied to.
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    if unexpected or set(missing) - tied:
        raise ConversionError(f"transformers' {type(model).__name__} does not take the converted "
                              f"weights: missing {sorted(missing)}, unexpected {unexpected}")
    model.tie_weights()
    ids, mask = batch(cfg)
    with torch.no_grad():
        theirs = model.eval()(input_ids=torch.from_numpy(ids.astype(np.int64)),
                              attention_mask=torch.from_numpy(mask)).logits.numpy()
    fp32 = cfg.replace(dtype="float32", param_dtype="float32", attention_impl="xla",
                       remat_policy="none")
    params32 = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
    ours = np.asarray(network.masked_lm(fp32).apply({"params": params32}, jnp.asarray(ids),
                                                    jnp.asarray(mask)))
    diff = np.abs(ours - theirs)[mask.astype(bool)]
    return float(np.nan_to_num(diff.max(), nan=np.inf))


def check(hf_config, state, cfg, params, *, report=print) -> None:
    """Runs :func:`max_difference` and reports it in one line.

    Raises:
      ConversionError: the difference is above :data:`TOLERANCE` (or not a number).
    """
    diff = max_difference(hf_config, state, cfg, params)
    rows, length = batch(cfg)[0].shape
    if diff is None:
        report("parity: not checked (transformers is not installed)")
        return
    line = (f"parity: max |logits - transformers' logits| = {diff:.1e} on {rows} x {length} "
            f"tokens with padding (fp32; refused above {TOLERANCE:.0e})")
    if not diff <= TOLERANCE:
        raise ConversionError(line.replace("parity:", "refused, the converted model's logits "
                                           "differ:"))
    report(line)
