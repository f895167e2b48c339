"""Merging checkpoints of one model: linear averaging and TIES merging.

mmBERT ends by merging decay variants of one run with TIES (Yadav et al., 2023,
"TIES-Merging: Resolving Interference When Merging Models"); model soups average.
Both work on the parameters alone, on the host, in float64 (so a checkpoint merged with
itself comes back bit for bit), and the result is written as a parameters checkpoint
(:func:`checkpoints.save_params`) that fine-tuning, ``hf to_hf`` and the trainer
(``INITIAL_CHECKPOINT_PATH``) read. The command: ``python -m xlmeta_jax.tools.merge``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence

import jax
import numpy as np

from xlmeta_jax import errors
from xlmeta_jax.model.network import EncoderConfig
from xlmeta_jax.pretrain import checkpoints, loading

METHODS = ("linear", "ties")


class MergeError(errors.UserError, ValueError):
    """Checkpoints that cannot be merged, or a merge setting out of range."""


def linear(params: Sequence, weights: Sequence[float] | None = None):
    """The weighted mean of parameter trees (uniform without ``weights``)."""
    weights = np.full(len(params), 1.0 / len(params)) if weights is None else (
        np.asarray(weights, np.float64) / np.sum(weights))

    def mean(*leaves):
        out = sum(w * np.asarray(x, np.float64) for w, x in zip(weights, leaves))
        return out.astype(np.asarray(leaves[0]).dtype)

    return jax.tree.map(mean, *params)


def ties(params: Sequence, base, *, density: float = 0.2, scaling: float = 1.0):
    """TIES merging of parameter trees against ``base`` (Yadav et al., 2023, Algorithm 1).

    Each model's task vector ``tau_t = theta_t - base`` over all its parameters together
    is trimmed to its ``density`` share of largest magnitudes (the rest set to 0); each
    parameter elects the sign of the trimmed vectors' sum (where that sum is 0: the sign
    of the whole sum, the reference code's 'majority'); the entries that agree with it
    are averaged (disjoint mean), and ``base + scaling * mean`` is returned.
    """
    leaves, treedef = jax.tree.flatten(base)
    shapes = [np.shape(x) for x in leaves]
    base_flat = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in leaves])
    tau = np.stack([
        np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(p)])
        - base_flat for p in params])
    # Trim as the reference code does: keep |tau| >= the (d - k)-th smallest magnitude of
    # each model (torch.kthvalue), k = int(density * d); density 1 keeps everything.
    d = tau.shape[1]
    keep = int(d * density)
    if keep < d:
        kth = np.partition(np.abs(tau), d - keep - 1, axis=1)[:, d - keep - 1][:, None]
        tau = np.where(np.abs(tau) >= kth, tau, 0.0)
    # Elect a sign per parameter; a zero sum takes the sign of the total.
    sign = np.sign(tau.sum(axis=0))
    sign[sign == 0] = np.sign(sign.sum())
    agree = np.where(sign > 0, tau > 0, tau < 0)
    selected = tau * agree
    merged = selected.sum(axis=0) / np.maximum((selected != 0).sum(axis=0), 1)
    out_flat = base_flat + scaling * merged
    out, offset = [], 0
    for x, shape in zip(leaves, shapes):
        n = int(np.prod(shape))
        out.append(out_flat[offset:offset + n].reshape(shape).astype(np.asarray(x).dtype))
        offset += n
    return jax.tree.unflatten(treedef, out)


@dataclasses.dataclass(frozen=True)
class _Loaded:
    path: str
    step_dir: str
    config: EncoderConfig
    params: object
    vocab_path: str | None


def _load(path: str) -> _Loaded:
    step_dir = os.fspath(loading.find_step_dir(path))
    cfg, params, vocab = loading.load_pretrained(step_dir)
    return _Loaded(path, step_dir, cfg, params, vocab)


def _vocab_digest(path: str | None) -> str | None:
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _check_compatible(models: Sequence[_Loaded]) -> None:
    first = models[0]
    shape = ("vocab_size", "hidden_size", "num_layers", "num_heads", "mlp_dim",
             "max_position_embeddings", "scan_layers")
    digest = _vocab_digest(first.vocab_path)
    for m in models[1:]:
        for field in shape:
            a, b = getattr(first.config, field), getattr(m.config, field)
            if a != b:
                raise MergeError(f"{m.path} has {field}={b}, {first.path} {field}={a}: only "
                                 "checkpoints of one model merge")
        if jax.tree.structure(m.params) != jax.tree.structure(first.params) or any(
                np.shape(x) != np.shape(y) for x, y in zip(jax.tree.leaves(m.params),
                                                          jax.tree.leaves(first.params))):
            raise MergeError(f"{m.path} and {first.path} have different parameter trees: "
                             "only checkpoints of one model merge")
        other = _vocab_digest(m.vocab_path)
        if digest and other and digest != other:
            raise MergeError(f"{m.path} was trained with the vocabulary {m.vocab_path}, "
                             f"{first.path} with another ({first.vocab_path})")


def check_settings(checkpoints_: Sequence[str], method: str, base: str | None,
                   density: float, output: str) -> None:
    """The settings' own checks, before any checkpoint is read."""
    if method not in METHODS:
        raise MergeError(f"--method={method!r} is not one of {METHODS}")
    if len(checkpoints_) < 2:
        raise MergeError(f"--checkpoints names {len(checkpoints_)} checkpoint; merging needs 2 "
                         "or more, separated by commas")
    if method == "ties" and not base:
        raise MergeError("--method=ties needs --base (the checkpoint the task vectors are "
                         "taken against, e.g. the run's stage before the decay variants)")
    if not 0.0 < density <= 1.0:
        raise MergeError(f"--density={density} must be in (0, 1] (the share of each task "
                         "vector kept)")
    if os.path.exists(output) and (not os.path.isdir(output) or os.listdir(output)):
        raise MergeError(f"--output={output} exists and is not an empty folder; merge into a "
                         "new one")


def merge(checkpoints_: Sequence[str], output: str, *, method: str = "linear",
          base: str | None = None, density: float = 0.2, scaling: float = 1.0,
          weights: Sequence[float] | None = None) -> str:
    """Merges checkpoints of one model into a new parameters checkpoint; returns its step dir.

    Args:
      checkpoints_: MODEL_DIRs, phase directories or step directories (as fine-tuning
        takes them), two or more.
      output: a new (or empty) folder; written as a phase directory with step 0.
      method: 'linear' (weighted mean) or 'ties' (against ``base``).
      base: the checkpoint task vectors are taken against ('ties').
      density: 'ties': the share of each task vector's largest magnitudes kept.
      scaling: 'ties': the merged task vector's factor (lambda).
      weights: 'linear': one weight per checkpoint (default: equal).

    Raises:
      MergeError: bad settings, or checkpoints of different models or vocabularies.
      CheckpointError: a checkpoint is missing or damaged.
    """
    output = checkpoints.absolute(output)
    check_settings(checkpoints_, method, base, density, output)
    if weights is not None and (len(weights) != len(checkpoints_) or min(weights) < 0
                                or not sum(weights) > 0):
        raise MergeError(f"--weights={','.join(map(str, weights))}: one weight >= 0 per "
                         f"checkpoint ({len(checkpoints_)}), not all 0")
    models = [_load(p) for p in checkpoints_]
    base_model = _load(base) if base else None
    _check_compatible(models + ([base_model] if base_model else []))
    params = [m.params for m in models]
    if method == "linear":
        merged = linear(params, weights)
        how = "linear"
    else:
        merged = ties(params, base_model.params, density=density, scaling=scaling)
        how = f"ties(density={density:g}, scaling={scaling:g}, base={base_model.step_dir})"
    provenance = f"{how} of " + ", ".join(m.step_dir for m in models)
    step_dir = checkpoints.save_params(output, models[0].config, merged,
                                       vocab_path=models[0].vocab_path,
                                       initialized_from=provenance)
    return os.fspath(step_dir)
