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
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence

import jax
import numpy as np

from xlmeta_jax import errors
from xlmeta_jax.data import hf_tokenizer
from xlmeta_jax.model.network import EncoderConfig
from xlmeta_jax.pretrain import checkpoints, loading, run_dir

log = logging.getLogger("xlmeta_jax.train")

METHODS = ("linear", "ties")
# How TIES trims its task vectors: 'model', the TIES authors' code (each model's whole task
# vector to its density share); 'tensor', mergekit's (each tensor to its density share).
TRIMS = ("model", "tensor")


class MergeError(errors.UserError, ValueError):
    """Checkpoints that cannot be merged, or a merge setting out of range."""

    def __init__(self, message: str, setting: str | None = None):
        super().__init__(message)
        # The setting the line is about (check_settings' names: 'method', 'base', ...).
        self.setting = setting


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


def ties_per_tensor(params: Sequence, base, *, density: float = 0.2, scaling: float = 1.0,
                    weights: Sequence[float] | None = None):
    """TIES merging as mergekit's ``ties`` method computes it, tensor by tensor.

    For each tensor: each model's task vector ``tau_t = theta_t - base`` keeps exactly its
    ``k = int(density * size)`` largest magnitudes (``sparsify``'s ``magnitude``); the
    vectors are weighted (``weights``, default 1 each); each entry elects the sign of the
    weighted sum, ``+1`` where that sum is 0 (``get_mask(method='sum')``); the weighted
    entries of that sign are summed and divided by the sum of their models' weights (the
    normalised disjoint mean), and ``base + scaling * mean`` is returned (mergekit: scaling
    1).

    Raises:
      MergeError: a tensor whose ``int(density * size)`` is 0 (mergekit refuses that too).
    """
    w = np.ones(len(params)) if weights is None else np.asarray(weights, np.float64)
    leaves, treedef = jax.tree.flatten(base)
    out = []
    for index, (b, *thetas) in enumerate(zip(leaves, *(jax.tree.leaves(p) for p in params))):
        b64 = np.asarray(b, np.float64)
        tau = np.stack([np.asarray(t, np.float64) - b64 for t in thetas]).reshape(
            len(thetas), -1)
        size = tau.shape[1]
        if density < 1:
            keep = int(density * size)
            if keep == 0:
                name = jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(base)[0][
                    index][0])
                raise MergeError(f"--density={density:g} keeps none of the {size} entries of "
                                 f"{name} (int(density x size) = 0): raise it, or trim per "
                                 "model (--trim=model)")
            # Exactly k per model: the first k of a stable sort by falling magnitude.
            order = np.argsort(-np.abs(tau), axis=1, kind="stable")[:, :keep]
            mask = np.zeros_like(tau, bool)
            np.put_along_axis(mask, order, True, axis=1)
            tau = np.where(mask, tau, 0.0)
        weighted = tau * w[:, None]
        majority = np.where(weighted.sum(axis=0) >= 0, 1.0, -1.0)
        agree = np.sign(weighted) == majority
        divisor = (w[:, None] * agree).sum(axis=0)
        divisor[divisor == 0] = 1.0
        mean = (weighted * agree).sum(axis=0) / divisor
        merged = b64 + scaling * mean.reshape(np.shape(b))
        out.append(merged.astype(np.asarray(b).dtype))
    return jax.tree.unflatten(treedef, out)


@dataclasses.dataclass(frozen=True)
class _Loaded:
    path: str
    step_dir: str
    config: EncoderConfig
    params: object
    vocab_path: str | None
    # The tokenizer's record (None: a checkpoint written before checkpoints kept it).
    tokenizer: dict | None


def _load(path: str) -> _Loaded:
    step_dir = os.fspath(loading.find_step_dir(path))
    cfg, params, vocab = loading.load_pretrained(step_dir)
    return _Loaded(path, step_dir, cfg, params, vocab, loading.recorded_tokenizer(step_dir))


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
        if first.tokenizer and m.tokenizer and not hf_tokenizer.same_tokenizer(
                first.tokenizer, m.tokenizer):
            raise MergeError(
                f"{m.path} was trained in another tokenizer than {first.path}: "
                f"{hf_tokenizer.describe(m.tokenizer, 'its')}, not "
                f"{hf_tokenizer.describe(first.tokenizer, 'the first')}")
        other = _vocab_digest(m.vocab_path)
        if digest and other and digest != other:
            raise MergeError(f"{m.path} was trained with the vocabulary {m.vocab_path}, "
                             f"{first.path} with another ({first.vocab_path})")


def check_settings(checkpoints_: Sequence[str], method: str, base: str | None,
                   density: float | None, output: str, *, scaling: float | None = None,
                   weights: Sequence[float] | None = None, trim: str | None = None,
                   flag: Callable[[str], str] = "--{}".format) -> None:
    """The settings' own checks, before any checkpoint is read.

    ``density``, ``scaling`` and ``trim`` are None where not given (their defaults then
    apply to 'ties'); given to 'linear', which has no use for them, they are refused, as
    is ``base``. Weights apply to 'linear' and to mergekit's TIES (``trim='tensor'``).
    ``flag`` names a setting in the messages (the command's ``--method``; a run's merge step
    names its gin fields); ``output`` None is not checked.
    """
    if method not in METHODS:
        raise MergeError(f"{flag('method')}={method!r} is not one of {METHODS}", "method")
    if len(checkpoints_) < 2:
        raise MergeError(f"{flag('checkpoints')} names {len(checkpoints_)} checkpoint; merging "
                         "needs 2 or more", "checkpoints")
    if method == "linear":
        given = [f for f, v in (("base", base), ("density", density),
                                ("scaling", scaling), ("trim", trim)) if v is not None]
        if given:
            raise MergeError(f"{', '.join(map(flag, given))} "
                             f"{'is' if len(given) == 1 else 'are'} for "
                             f"{flag('method')}=ties; {flag('method')}=linear averages with "
                             f"{flag('weights')} only", given[0])
    if method == "ties" and not base:
        raise MergeError(f"{flag('method')}=ties needs {flag('base')} (the checkpoint the task "
                         "vectors are taken against, e.g. the run's stage before the decay "
                         "variants)", "base")
    if trim is not None and trim not in TRIMS:
        raise MergeError(f"{flag('trim')}={trim!r} is not one of {TRIMS}", "trim")
    if density is not None and not 0.0 < density <= 1.0:
        raise MergeError(f"{flag('density')}={density} must be in (0, 1] (the share of each "
                         "task vector kept)", "density")
    if scaling is not None and not np.isfinite(scaling):
        raise MergeError(f"{flag('scaling')}={scaling} must be a finite number", "scaling")
    if weights is not None:
        if (len(weights) != len(checkpoints_) or not all(np.isfinite(weights))
                or min(weights) < 0 or not sum(weights) > 0):
            raise MergeError(f"{flag('weights')}={','.join(map(str, weights))}: one finite "
                             f"weight >= 0 per checkpoint ({len(checkpoints_)}), not all 0",
                             "weights")
        if method == "ties" and (trim or "model") == "model":
            raise MergeError(f"{flag('weights')} with {flag('method')}=ties: the TIES authors' "
                             f"merge ({flag('trim')}=model) has no weights; mergekit's "
                             f"({flag('trim')}=tensor) weights each task vector", "weights")
    if output is not None and os.path.exists(output) and (
            not os.path.isdir(output) or os.listdir(output)):
        raise MergeError(f"{flag('output')}={output} exists and is not an empty folder; merge "
                         "into a new one", "output")


def merge(checkpoints_: Sequence[str], output: str, *, method: str = "linear",
          base: str | None = None, density: float | None = None,
          scaling: float | None = None, weights: Sequence[float] | None = None,
          trim: str | None = None, extra_meta: dict | None = None) -> str:
    """Merges checkpoints of one model into a new parameters checkpoint; returns its step dir.

    Args:
      checkpoints_: MODEL_DIRs, phase directories or step directories (as fine-tuning
        takes them), two or more.
      output: a new (or empty) folder; written as a phase directory with step 0.
      method: 'linear' (weighted mean) or 'ties' (against ``base``).
      base: the checkpoint task vectors are taken against ('ties').
      density: 'ties': the share of each task vector's largest magnitudes kept (0.2).
      scaling: 'ties': the merged task vector's factor (lambda; 1).
      weights: 'linear', and 'ties' with ``trim='tensor'``: one weight per checkpoint
        (default: equal).
      trim: 'ties': 'model' (default: the TIES authors' code, bit for bit, each model's
        whole task vector trimmed) or 'tensor' (mergekit's: each tensor trimmed).
      extra_meta: recorded in the merged checkpoint's metadata beside the provenance
        (a run's merge step: the run's phases and the merge's settings).

    Raises:
      MergeError: bad settings, or checkpoints of different models or vocabularies.
      CheckpointError: a checkpoint is missing or damaged.
    """
    output = checkpoints.absolute(output)
    check_settings(checkpoints_, method, base, density, output, scaling=scaling,
                   weights=weights, trim=trim)
    density = 0.2 if density is None else density
    scaling = 1.0 if scaling is None else scaling
    trim = trim or "model"
    models = [_load(p) for p in checkpoints_]
    base_model = _load(base) if base else None
    _check_compatible(models + ([base_model] if base_model else []))
    params = [m.params for m in models]
    if method == "linear":
        merged = linear(params, weights)
        how = "linear"
    elif trim == "model":
        merged = ties(params, base_model.params, density=density, scaling=scaling)
        how = f"ties(density={density:g}, scaling={scaling:g}, base={base_model.step_dir})"
    else:
        merged = ties_per_tensor(params, base_model.params, density=density, scaling=scaling,
                                 weights=weights)
        how = (f"ties(trim=tensor, density={density:g}, scaling={scaling:g}"
               + (f", weights={','.join(f'{x:g}' for x in weights)}" if weights else "")
               + f", base={base_model.step_dir})")
    provenance = f"{how} of " + ", ".join(m.step_dir for m in models)
    step_dir = checkpoints.save_params(
        output, models[0].config, merged, vocab_path=models[0].vocab_path,
        initialized_from=provenance,
        extra_meta={"tokenizer": models[0].tokenizer, **(extra_meta or {})})
    return os.fspath(step_dir)


def run_step(model_dir: str, m, phases: Sequence, run_phases: list[str]) -> dict:
    """A run's merge step (``trainer.Merge``): its branches' final checkpoints merged.

    Writes ``MODEL_DIR/<name>/0`` once; a rerun finds it complete (and refuses other merge
    settings than the stored ones). A damaged one (unreadable metadata, an array that fails
    its checksum) is derived again from the branches, which are the run's own checkpoints.
    Returns the step's entry of the run's summary.

    Args:
      model_dir: the run's MODEL_DIR (absolute).
      m: the run's ``Merge`` (checked against the phases by ``checks.validate``).
      phases: the run's phases, every branch and the base complete.
      run_phases: what the merged checkpoint records as the run's phases.
    """
    out = os.path.join(model_dir, m.name)
    settings = dataclasses.asdict(m)
    if os.path.isdir(out):
        ckpt = checkpoints.PhaseCheckpoints(out, save_interval_steps=1, max_to_keep=None,
                                            read_only=True)
        done, meta = ckpt.latest_step(), None
        if done is not None:
            try:
                meta = ckpt.read_meta(done)
                checkpoints.verify_readable(ckpt.step_dir(done), all_arrays=True)
            except checkpoints.CheckpointError as e:
                log.info("[%s] %s is damaged (%s): merging its branches again", m.name,
                         ckpt.step_dir(done), errors.first_line(e))
                meta = None
        ckpt.close()
        if meta is not None:
            stored = meta.get("merge")
            if stored is not None and stored != json.loads(json.dumps(settings)):
                raise run_dir.RunConfigMismatch(
                    f"{ckpt.step_dir(done)} was merged with {stored}, the config asks for "
                    f"{settings}; use another MODEL_DIR or Merge.name")
            log.info("[%s] already complete at %s", m.name, ckpt.step_dir(done))
            return _merge_summary(m, os.fspath(ckpt.step_dir(done)), now=False)
        # A merge cut short finalised nothing: what it left is not a checkpoint.
        if jax.process_index() == 0:
            shutil.rmtree(out)
    by_name = {p.name: p for p in phases}

    def final(name):
        return os.path.join(model_dir, name, str(by_name[name].num_steps))

    log.info("[%s] merging %s (%s%s)", m.name, ", ".join(m.branches), m.method,
             f" against {m.base}" if m.base else "")
    # Every process merges the same host arrays; Orbax's primary host writes them.
    step_dir = merge(
        [final(b) for b in m.branches], out, method=m.method,
        base=final(m.base) if m.base else None, density=m.density, scaling=m.scaling,
        weights=m.weights, trim=m.trim,
        extra_meta={"run_phases": run_phases, "merge": settings})
    log.info("[%s] wrote %s", m.name, step_dir)
    return _merge_summary(m, step_dir, now=True)


def _merge_summary(m, step_dir: str, *, now: bool) -> dict:
    return {"phase": m.name, "task": f"{m.method} merge of {', '.join(m.branches)}",
            "steps": 0, "steps_run_now": 0, "merged_now": now, "final_loss": None,
            "final_accuracy": None, "tokens": 0, "wall_seconds_now": 0.0,
            "checkpoint": step_dir, "initialized_from": None}
