"""Checks of a pretraining run's configuration, made before any data is read or code
compiled; each raises :class:`ConfigError` naming the setting (gin binding, file,
mesh shape) that is wrong."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Sequence

import jax
import sentencepiece as spm

from xlmeta_jax import errors, files
from xlmeta_jax.data import feeding, hf_tokenizer
from xlmeta_jax.model import layers, mlm, network, partitioning
from xlmeta_jax.pretrain import checkpoints, loading, run_dir, step
from xlmeta_jax.pretrain.phases import CONFIGURABLE, MERGE_CONFIGURABLE, Merge, Phase

log = logging.getLogger("xlmeta_jax.train")


class ConfigError(errors.UserError, ValueError):
    """The run's configuration is invalid (raised before anything compiles)."""


def check_model_dir(model_dir: str) -> None:
    """MODEL_DIR exists (created if needed) and this process can write into it."""
    problem = files.not_a_folder(model_dir, "MODEL_DIR")
    if problem:
        raise ConfigError(problem)
    try:
        os.makedirs(model_dir, exist_ok=True)
        # A probe name of its own: on a pod every host checks the same shared directory.
        fd, probe = tempfile.mkstemp(prefix=".write_test.", dir=model_dir)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"MODEL_DIR {model_dir!r} is not a writable directory: {e}") from e


def validate(model_dir, model: network.EncoderConfig, phases: Sequence[Phase], mesh_shape,
             num_devices: int, microbatches: int = 1, *,
             describe: Callable[[str], str] = str,
             masking: mlm.Masking = mlm.DEFAULT_MASKING,
             packed: bool = False, backend: str | None = None,
             merge: Merge | None = None) -> tuple[int, int, int]:
    """Checks a run's settings; returns the mesh shape.

    Args:
      model_dir, model, phases, mesh_shape, microbatches: as :func:`trainer.train`.
      num_devices: the devices the mesh spans.
      describe: names where a setting (a gin name) was given, for the messages.
      masking: the run's masking (``Corpora.masking``); a phase may set its own rate.
      packed: whether the run's rows are packed from whole documents (``Corpora.packed``).
      backend: the platform the run compiles for (default: JAX's; the TPU compile tool
        says ``'tpu'``).
      merge: the run's merge step, if any (``trainer.train``'s ``merge``).

    Raises:
      ConfigError: naming the first bad setting.
    """
    if not model_dir:
        raise ConfigError("MODEL_DIR is not set (bind --gin.MODEL_DIR=\"'/path'\")")
    if not isinstance(model, network.EncoderConfig):
        raise ConfigError(f"train.model must be an EncoderConfig, got {type(model).__name__}")
    if not phases:
        raise ConfigError("train.phases is empty")
    backend = backend or jax.default_backend()
    kernel = network.resolve_attention_impl(model.attention_impl, model.dtype, backend)
    if (kernel, backend) in (("cudnn", "cpu"), ("cudnn", "tpu"), ("splash", "cpu"),
                             ("splash", "gpu")):
        source = describe("xlmeta_jax.model.network.get_config.attention_impl")
        where = {"cudnn": "cuDNN's kernel, on NVIDIA GPUs only",
                 "splash": "Pallas' TPU kernel, on TPUs only"}[kernel]
        raise ConfigError(
            f"attention_impl={kernel!r} ({source}) is {where}; this run's backend is "
            f"{backend!r}: use 'auto' (cuDNN on a GPU, splash on a TPU, XLA elsewhere) or "
            "'xla'")
    if packed and not network.family(model).packed_rows:
        raise ConfigError(
            f"Corpora.packing='documents' ({describe('xlmeta_jax.data.corpora.Corpora.packing')})"
            f" packs documents that attend only to themselves, which the {model.family} family "
            "does not (it reads fairseq's blocks): use packing='blocks', or a ModernBERT size "
            "(gin/models/modernbert_tiny.gin, mmbert_small.gin, mmbert_base.gin)")
    try:
        shape = partitioning.mesh_shape_for(*mesh_shape, num_devices=num_devices)
    except partitioning.MeshShapeError as e:
        raise ConfigError(f"train.mesh_shape: {e}") from e
    data_parallel = shape[0] * shape[1]
    try:
        step.check_microbatches(microbatches)
    except ValueError as e:
        source = describe("xlmeta_jax.pretrain.trainer.train.microbatches")
        raise ConfigError(f"{e} ({source})") from None
    seen = set()
    schedule_offset = {}
    for p in phases:
        where = f"phase {p.name!r}"
        if p.name in seen:
            raise ConfigError(f"{where}: duplicate phase name")
        if p.init_from is not None and p.init_from not in seen:
            raise ConfigError(
                f"{where}: init_from={p.init_from!r} is not an earlier phase ({sorted(seen)})"
            )
        seen.add(p.name)
        if p.batch_size % data_parallel or p.batch_size % jax.process_count():
            raise ConfigError(
                f"{where}: batch_size={p.batch_size} is not divisible by the data-parallel "
                f"mesh size {data_parallel} (mesh {shape}) and {jax.process_count()} processes"
            )
        if p.batch_size % (microbatches * data_parallel):
            raise ConfigError(
                f"{where}: batch_size={p.batch_size} does not split into {microbatches} "
                f"microbatches (MICROBATCHES) of a multiple of the data-parallel mesh size "
                f"{data_parallel} (mesh {shape})"
            )
        family = network.family(model)
        if not family.rotary:
            for field in ("global_rope_theta", "local_rope_theta"):
                if getattr(p, field) is not None:
                    source = describe(f"{p.name}/{CONFIGURABLE}.{field}")
                    raise ConfigError(
                        f"{where}: {field}={getattr(p, field)} ({source}) sets rotary "
                        f"positions, which the {model.family!r} family has none of (a "
                        "ModernBERT size has: gin/models/mmbert_base.gin)")
        check_sequence_length(
            p.sequence_length, model, where=f"{where}: sequence_length",
            source=describe(f"{p.name}/xlmeta_jax.pretrain.trainer.Phase.sequence_length"))
        _check_predictions(p, masking, describe)
        if model.attention_impl == "splash" and p.sequence_length % layers.SPLASH_ALIGN:
            source = describe("xlmeta_jax.model.network.get_config.attention_impl")
            raise ConfigError(
                f"{where}: sequence_length={p.sequence_length} is not a multiple of "
                f"{layers.SPLASH_ALIGN}, which attention_impl='splash' ({source}) needs: "
                f"use a length of {layers.SPLASH_ALIGN}·k, or 'auto' (XLA for such rows)")
        problem = family.length_problem(model, p.sequence_length)
        if problem is not None:
            field, text = problem
            source = describe(f"xlmeta_jax.model.network.get_config.{field}")
            raise ConfigError(
                f"{where}: {field}={getattr(model, field)} ({source}) {text}")
        # With reset_schedule=False a phase continues its init_from phase's step count,
        # so its schedule must reach that offset plus its own steps.
        offset = 0
        if p.init_from is not None and not p.reset_schedule:
            prev = next(q for q in phases if q.name == p.init_from)
            offset = schedule_offset[prev.name] + prev.num_steps
        schedule_offset[p.name] = offset
        total = p.optimizer_config().total_steps
        if total < offset + p.num_steps:
            source = describe(
                f"{p.name}/xlmeta_jax.model.optimizer.OptimizerConfig.total_steps")
            raise ConfigError(
                f"{where}: optimizer total_steps={total} ({source}) < step_offset {offset} + "
                f"num_steps {p.num_steps}; the schedule would end early and the last "
                f"{offset + p.num_steps - total} steps would train at its end learning rate"
            )
    if merge is not None:
        _check_merge(phases, merge, model)
    return shape


def _check_merge(phases: Sequence[Phase], merge: Merge, model: network.EncoderConfig) -> None:
    """The merge step against the phases: names that exist, branches of one shape."""
    by_name = {p.name: p for p in phases}
    where = "merge"
    for field, names in (("branches", merge.branches), ("base", [merge.base])):
        for name in names:
            if name is not None and name not in by_name:
                raise ConfigError(f"{where}: {MERGE_CONFIGURABLE}.{field} names {name!r}, "
                                  f"which is not a phase of the run ({list(by_name)})")
    if merge.name in by_name:
        raise ConfigError(f"{where}: {MERGE_CONFIGURABLE}.name={merge.name!r} is a phase's name "
                          "(the merge is written to a folder of its own)")
    if merge.base in merge.branches:
        raise ConfigError(f"{where}: {MERGE_CONFIGURABLE}.base={merge.base!r} is one of the "
                          "branches; the base is what the branches started from")
    if len(set(merge.branches)) != len(merge.branches):
        raise ConfigError(f"{where}: {MERGE_CONFIGURABLE}.branches={list(merge.branches)} "
                          "names a phase twice")
    first = by_name[merge.branches[0]]
    for name in merge.branches[1:]:
        other = by_name[name]
        for what, a, b in (
                ("sequence_length", first.sequence_length, other.sequence_length),
                *((f, getattr(first.model(model), f), getattr(other.model(model), f))
                  for f in ("global_rope_theta", "local_rope_theta"))):
            if a != b:
                raise ConfigError(
                    f"{where}: branches {first.name!r} ({what}={a}) and {other.name!r} "
                    f"({what}={b}) are of different shapes; the merged model has one "
                    "(merge branches of one length and RoPE bases)")


def check_sequence_length(length, model: network.EncoderConfig | None, *, where: str,
                          source: str) -> None:
    """Raises ConfigError unless ``length`` fits the MLM tasks' blocks and the model.

    Both trainers check their block length here (ours per phase, t5x's SEQUENCE_LENGTH).

    Args:
      length: the block length (tokens per example).
      model: the encoder (None: its positions are not checked).
      where: what is checked, as the message starts (``phase 'phase1': sequence_length``).
      source: where the value was set (its gin macro or binding).
    """
    if not errors.is_count(length) or length < mlm.MIN_SEQUENCE_LENGTH:
        raise ConfigError(
            f"{where} ({source}) = {length!r} must be an integer of at least "
            f"{mlm.MIN_SEQUENCE_LENGTH} tokens (the shortest block the MLM tasks pack)")
    if model is not None and length > model.max_length:
        raise ConfigError(
            f"{where} ({source}) = {length} exceeds the model's {model.max_length} positions "
            f"(max_position_embeddings={model.max_position_embeddings}, "
            f"pad_token_id={model.pad_token_id})")


def _check_predictions(p: Phase, masking: mlm.Masking, describe: Callable[[str], str]) -> None:
    """Refuses a masking rate that leaves most of a phase's blocks without a prediction.

    A block of L tokens has L - 2 maskable ones (<s> and </s> are not), of which
    ``floor(rate * n + u)`` are selected: with ``e = rate * n < 1`` a share ``1 - e`` of
    the blocks predicts nothing, and far below the loss, accuracy and gradient are 0 on
    every step. Below half a prediction per block, most blocks train nothing.
    """
    rate = p.masking_rate(masking.rate)
    expected = rate * (p.sequence_length - 2)
    if expected < 0.5:
        source = (describe(f"{p.name}/xlmeta_jax.pretrain.trainer.Phase.mask_rate")
                  if p.mask_rate is not None else describe("xlmeta_jax.model.mlm.Masking.rate"))
        length = describe(f"{p.name}/xlmeta_jax.pretrain.trainer.Phase.sequence_length")
        raise ConfigError(
            f"phase {p.name!r}: masking rate {rate:g} ({source}) selects {expected:.2f} of "
            f"a block's {p.sequence_length - 2} maskable tokens (sequence_length "
            f"{p.sequence_length}, {length}): most blocks would predict nothing; raise it "
            f"to at least {0.5 / (p.sequence_length - 2):.3g}")


def check_vocabulary(vocab_path: str | None, model: network.EncoderConfig) -> dict | None:
    """VOCAB_PATH is a vocabulary the encoder's embedding covers, with its pad id.

    A SentencePiece model of ours or a Hugging Face tokenizer (a folder or its
    ``tokenizer.json``). A tokenizer smaller than the embedding is allowed: the rows past
    it are padding that no text reaches (released models round their tables up).

    Returns:
      The vocabulary's record (``hf_tokenizer.make_record``), which every checkpoint of
      the run keeps; None for a path on a remote file system (read by the pipeline).

    Raises:
      ConfigError: naming VOCAB_PATH or the EncoderConfig field.
    """
    if not vocab_path or "://" in vocab_path:
        return None
    if hf_tokenizer.is_tokenizer_path(vocab_path) and os.path.exists(vocab_path):
        try:
            tok = hf_tokenizer.read(vocab_path)
        except hf_tokenizer.TokenizerError as e:
            raise ConfigError(f"VOCAB_PATH {vocab_path}: {e}") from None
        size, pad, record, what = tok.specials.size, tok.specials.pad, tok.record(), "ids"
    else:
        if not os.path.isfile(vocab_path):
            raise ConfigError(f"VOCAB_PATH {vocab_path} does not exist")
        sp = spm.SentencePieceProcessor()
        try:
            sp.Load(vocab_path)
        except (OSError, RuntimeError) as e:
            raise ConfigError(
                f"VOCAB_PATH {vocab_path} is not a SentencePiece model ({errors.first_line(e)})"
            ) from None
        size, what = sp.get_piece_size(), "pieces"
        # seqio pads with id 0; a vocabulary that defines its own pad piece must agree.
        pad = sp.pad_id() if sp.pad_id() >= 0 else 0
        record = hf_tokenizer.record_of(vocab_path)
    if size > model.vocab_size:
        raise ConfigError(
            f"EncoderConfig.vocab_size={model.vocab_size} does not cover the "
            f"{size} {what} of VOCAB_PATH {vocab_path}"
        )
    if size < model.vocab_size:
        log.info("VOCAB_PATH %s has %d %s, the embedding %d rows: rows %d to %d are padding "
                 "that no text reaches", vocab_path, size, what, model.vocab_size, size,
                 model.vocab_size - 1)
    if model.pad_token_id != pad:
        raise ConfigError(
            f"EncoderConfig.pad_token_id={model.pad_token_id} differs from the pad id "
            f"{pad} of VOCAB_PATH {vocab_path}"
        )
    return record


def initial_tokenizer(path: str | None) -> tuple[str | None, dict | None]:
    """The tokenizer INITIAL_CHECKPOINT_PATH was trained in: (its path, its record).

    A Hugging Face folder with a ``tokenizer.json`` brings its own: its weights are read
    in its own ids (``initial_params``), a released model's as our own export's. A
    checkpoint of ours names the vocabulary it recorded. (None, None) where nothing is
    known: no path, a remote one, a folder without a tokenizer, or a checkpoint written
    before checkpoints recorded their tokenizer.

    Raises:
      CheckpointError: the folder's tokenizer cannot serve (naming the path).
    """
    if not path or "://" in path or not os.path.isdir(path):
        return None, None
    if os.path.isfile(os.path.join(path, hf_tokenizer.MODEL_CONFIG)):
        if not hf_tokenizer.holds_tokenizer(path):
            return None, None
        try:
            return path, hf_tokenizer.read(path).record()
        except hf_tokenizer.TokenizerError as e:
            raise checkpoints.CheckpointError(f"INITIAL_CHECKPOINT_PATH {path}: {e}") from None
    return loading.recorded_vocabulary(path)


def check_same_tokenizer(record: dict | None, stored: dict | None, vocab_path: str | None,
                         where: str, hint: str) -> None:
    """Refuses a tokenizer other than the one ``where`` was trained in, naming both.

    Raises:
      run_dir.RunConfigMismatch: the records differ (nothing is refused where either
        is unknown).
    """
    if record and stored and not hf_tokenizer.same_tokenizer(record, stored):
        raise run_dir.RunConfigMismatch(
            f"{where} was trained in another tokenizer: "
            f"{hf_tokenizer.describe(stored, 'its')}, not "
            f"{hf_tokenizer.describe(record, f'VOCAB_PATH {vocab_path}')}; {hint}")


def latest_checkpoint(model_dir: str, phase: Phase, model: network.EncoderConfig,
                      data_seed: int | None = None, tokenizer: dict | None = None,
                      vocab_path: str | None = None) -> int | None:
    """The phase's latest checkpoint (finalised by Orbax), None without one.

    Raises:
      run_dir.RunConfigMismatch: the phase's stored checkpoints were written for
        another model or phase setting (or ``data_seed``, or in another ``tokenizer``,
        the record of ``vocab_path``) than the requested one.
    """
    path = os.path.join(model_dir, phase.name)
    if not os.path.isdir(path):
        return None
    ckpt = checkpoints.PhaseCheckpoints(path, save_interval_steps=1, max_to_keep=None,
                                        read_only=True)
    try:
        latest = ckpt.latest_step()
        if latest is not None:
            meta = ckpt.read_meta(latest)
            where = os.fspath(ckpt.step_dir(latest))
            run_dir.check_stored_config(where, meta, model, phase, data_seed)
            check_same_tokenizer(tokenizer, meta.get("tokenizer"), vocab_path, where,
                                 "resume with the run's own VOCAB_PATH, or use another "
                                 "MODEL_DIR")
        return latest
    finally:
        ckpt.close()


# The train() setting that lets an unfinished phase resume on another process count.
NEW_PROCESS_COUNT = ("reseed",)


def check_stored_run(model_dir: str, phases: Sequence[Phase],
                     model: network.EncoderConfig, data_seeds: Sequence[int],
                     new_process_count: str | None = None, tokenizer: dict | None = None,
                     vocab_path: str | None = None) -> set[str]:
    """Checks what a rerun reads of MODEL_DIR; returns the names of the complete phases.

    Needs no data, so it runs before any corpus is prepared or pipeline built: a damaged
    checkpoint is reported in seconds. The checkpoint each phase would use (a complete
    phase's final one, which a later phase, fine-tuning and export read; an unfinished
    phase's latest, which the run resumes from) must match the requested run and have
    readable metadata and parameters that match their checksums. A complete phase's
    final checkpoint, the run's product, has its optimizer state checked too; an
    unfinished phase's is checked when the resume reads it.

    An unfinished phase whose checkpoint another process count wrote resumes only with
    ``new_process_count='reseed'``: its hosts' input streams cannot continue. A
    checkpoint of another tokenizer than ``tokenizer`` (VOCAB_PATH's record) is refused.

    Raises:
      run_dir.RunConfigMismatch: a stored checkpoint was written for another run, or
        by another process count without ``new_process_count``.
      checkpoints.CheckpointError: a checkpoint is damaged, naming it.
    """
    complete = set()
    for phase, data_seed in zip(phases, data_seeds):
        latest = latest_checkpoint(model_dir, phase, model, data_seed, tokenizer, vocab_path)
        if latest is None:
            continue
        step_dir = os.path.join(model_dir, phase.name, str(latest))
        if jax.process_count() == 1:
            checkpoints.verify_readable(step_dir, all_arrays=latest == phase.num_steps)
        else:
            # On a pod no process holds a whole array on one device: the parameters are
            # checked against their checksums where they are read onto the run's mesh
            # (the resume, the next phase's hand-off).
            checkpoints.read_meta(step_dir)
        if latest == phase.num_steps:
            complete.add(phase.name)
            continue
        stored = feeding.stored_process_count(step_dir)
        if stored not in (None, jax.process_count()) and new_process_count is None:
            raise run_dir.RunConfigMismatch(
                f"[{phase.name}] {step_dir} was written by {stored} "
                f"process{'es' if stored > 1 else ''}, this run has "
                f"{jax.process_count()}: its hosts' input streams continue on {stored} only; "
                "pass --gin.train.new_process_count=\"'reseed'\" to restore the parameters "
                "and optimizer state onto this mesh and restart every host's stream from a "
                "new seed")
    return complete
