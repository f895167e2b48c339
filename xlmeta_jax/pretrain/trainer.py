"""The trainer: one linear loop that runs every pretraining phase of a run.

Meta-pretraining is two phases of the same loop — phase 1 on English, phase 2 on
the 100-language mixture starting from phase 1's final parameters — and the
single-phase XLM-R baseline is one phase. Which phases run is gin config
(gin/native/meta.gin, gin/native/xlmr.gin, gin/demo.gin); the command line is
:mod:`xlmeta_jax.train`. A run resumes where it stopped.

Read top to bottom: :func:`train` checks the settings and fixes them in a frozen
:class:`_RunConfig`; :func:`_train_all` builds every phase's input pipeline and runs the
phases in order; :func:`_train_phase` is one phase: its initial state
(:func:`_initial_state`, the init/resume precedence), the step loop, the phase's end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from xlmeta_jax import errors, files
from xlmeta_jax.data import feeding, seeds
from xlmeta_jax.data.corpora import Corpora
from xlmeta_jax.model import network, partitioning
from xlmeta_jax.pretrain import (
    checkpoints,
    hardware,
    loading,
    merging,
    progress,
    run_dir,
    signals,
    step,
)
from xlmeta_jax.pretrain.checks import (
    NEW_PROCESS_COUNT,
    ConfigError,
    check_model_dir,
    check_same_tokenizer,
    check_stored_run,
    check_vocabulary,
    initial_tokenizer,
    validate,
)
from xlmeta_jax.pretrain.phases import SYNTHETIC, Merge, Phase, fmt_tokens, tokens_before

__all__ = ["SYNTHETIC", "Merge", "Phase", "train"]

log = logging.getLogger("xlmeta_jax.train")


@dataclasses.dataclass(frozen=True)
class _RunConfig:
    """One run's settings, as :func:`train` checked them; the same for every phase."""

    model_dir: str  # absolute
    model: network.EncoderConfig
    phases: tuple[Phase, ...]
    # Each phase's data and dropout seed (seeds.phase_seed: run seed, task, occurrence).
    phase_seeds: tuple[int, ...]
    seed: int
    checkpoint_every: int
    checkpoint_every_tokens: int | None
    keep_checkpoints: int | None
    async_checkpointing: bool
    log_every: int
    initial_checkpoint_path: str | None
    vocab_path: str | None
    # The vocabulary's record (hf_tokenizer.make_record), kept by every checkpoint.
    tokenizer: dict | None
    peak_flops: float | None
    rng_impl: str
    microbatches: int
    corpora: Corpora
    feeder: Callable[..., Any]
    config_text: str | None  # MODEL_DIR/config.gin's text (None: not written)
    merge: Merge | None

    def checkpoint_interval(self, phase: Phase) -> int:
        """The phase's steps between checkpoints (checkpoint_every_tokens in its steps)."""
        if self.checkpoint_every_tokens is None:
            return self.checkpoint_every
        return max(1, round(self.checkpoint_every_tokens / phase.tokens_per_step()))

    def run_phases(self) -> list[str]:
        """What the run's checkpoints record as its phases: the last is its product."""
        return [p.name for p in self.phases] + ([self.merge.name] if self.merge else [])


# ============================================================================
# The trainer.
# ============================================================================


def train(
    *,
    model_dir: str,
    model: network.EncoderConfig,
    phases: Sequence[Phase],
    mesh_shape: Sequence[int] = (-1, 1, 1),
    seed: int = 0,
    checkpoint_every: int = 1000,
    checkpoint_every_tokens: int | float | None = None,
    keep_checkpoints: int | None = 3,
    async_checkpointing: bool = True,
    log_every: int = 100,
    initial_checkpoint_path: str | None = None,
    vocab_path: str | None = None,
    rng_impl: str = "threefry2x32",
    microbatches: int = 1,
    corpora: Corpora | None = None,
    feeder: Callable[..., Any] = feeding.make_mlm_iterator,
    config_text: str | None = None,
    describe: Callable[[str], str] = str,
    prepare: Callable[[], Any] | None = None,
    new_process_count: str | None = None,
    compilation_cache_dir: str | None = None,
    merge: Merge | None = None,
) -> dict:
    """Runs (or resumes) every phase of a pretraining run; returns its summary.

    Args:
      model_dir: run directory (checkpoints per phase, TensorBoard, config.gin).
      model: encoder configuration (gin: ``network.get_config()`` as gin/models/*.gin
        bind it).
      phases: phases in order (``@phase1/Phase()``, ...).
      mesh_shape: (data, fsdp, tensor); one entry may be -1.
      seed: the run seed: parameter init, and through ``seeds.phase_seed`` each phase's
        data and dropout seeds (the same for every arm that reads the same source).
      checkpoint_every: save a checkpoint every this many steps (and at each phase end).
      checkpoint_every_tokens: instead, every this many tokens (each phase's steps of
        batch x length, rounded: mmBERT's every 10B tokens).
      keep_checkpoints: checkpoints kept per phase (None: all).
      async_checkpointing: write checkpoints in the background.
      log_every: steps between progress lines and TensorBoard points.
      initial_checkpoint_path: params for the first phase (ours or Hugging Face).
      vocab_path: SentencePiece model used by the tasks (recorded in checkpoints).
      rng_impl: PRNG of the dropout masks: ``threefry2x32`` (JAX's default; identical
        on every backend and mesh), ``rbg`` or ``unsafe_rbg`` (XLA's RngBitGenerator,
        cheaper on accelerators, stream may differ between backends). Every choice is
        deterministic, so resume is exact; see docs/performance.md.
      microbatches: gradient accumulation (gin: MICROBATCHES): each step runs its batch
        as this many microbatches inside one jitted step, so a batch larger than the
        devices' memory holds trains with the same update (``step.accumulated_grads``).
      corpora: the corpus settings the phases' tasks are registered from, with the
        masking of every phase (the synthetic stream's too); default: ``Corpora()``.
      feeder: builds a phase's iterator of global batches from its task
        (``feeding.make_mlm_iterator``, whose options the command line binds).
      config_text: the run's configuration, written to ``MODEL_DIR/config.gin`` by a
        run that trains (the command line passes its gin config).
      describe: names where a setting was given, for error messages (the command line
        passes its gin lookup, e.g. ``'META_STEPS'`` for a phase's step count).
      prepare: writes data the run reads (the demo's corpus into MODEL_DIR), called once
        MODEL_DIR is locked and the checks that need no data have passed.
      new_process_count: ``'reseed'`` lets an unfinished phase resume on another process
        count than the one that wrote its checkpoint: parameters and optimizer state are
        restored onto the new mesh and every host's input stream restarts from
        ``seeds.reseeded(phase seed, step, process count)``; None refuses such a resume.
      compilation_cache_dir: JAX's persistent compilation cache, so that a resume (or a
        later phase of the same shapes) loads its compiled steps: a folder (``gs://``
        too), ``''`` for none; None: ``JAX_COMPILATION_CACHE_DIR`` when set, else
        ``MODEL_DIR/compilation_cache``.
      merge: the run's last step, a merge of branches' final checkpoints (mmBERT's decay
        variants, merged with TIES): its result is the run's product (``MODEL_DIR``
        resolves to it for fine-tuning and export).
    """
    # ---------------------------------------------------------------- validate
    # Checked before any data is prepared or read or code compiled: the settings, then
    # (MODEL_DIR locked) the stored run, then the vocabulary once prepared.
    if rng_impl not in step.RNG_IMPLS:
        raise ConfigError(f"gin binding train.rng_impl={rng_impl!r} is not one of {step.RNG_IMPLS}")
    if isinstance(checkpoint_every_tokens, float) and checkpoint_every_tokens.is_integer():
        checkpoint_every_tokens = int(checkpoint_every_tokens)  # gin's 10e9
    for name, value in (("checkpoint_every", checkpoint_every), ("log_every", log_every),
                        ("checkpoint_every_tokens",
                         1 if checkpoint_every_tokens is None else checkpoint_every_tokens)):
        if not errors.is_count(value):
            raise ConfigError(f"{describe(f'xlmeta_jax.pretrain.trainer.train.{name}')} = "
                              f"{value!r}: must be an integer > 0")
    if new_process_count not in (None, *NEW_PROCESS_COUNT):
        raise ConfigError(f"gin binding train.new_process_count={new_process_count!r} is not "
                          f"None or one of {NEW_PROCESS_COUNT}")
    model_dir = files.user_path(model_dir, "MODEL_DIR")
    vocab_path = files.user_path(vocab_path, "VOCAB_PATH")
    initial_checkpoint_path = files.user_path(initial_checkpoint_path,
                                              "INITIAL_CHECKPOINT_PATH")
    corpora = Corpora() if corpora is None else corpora
    # A model's ids are its tokenizer's: a released model's folder (or a checkpoint of
    # ours) names the one it was trained in; without VOCAB_PATH the run takes the folder's.
    init_vocab, init_tokenizer = initial_tokenizer(initial_checkpoint_path)
    if vocab_path is None and init_tokenizer and init_tokenizer["kind"] == "tokenizers":
        vocab_path = init_vocab
        log.info("VOCAB_PATH: the tokenizer of INITIAL_CHECKPOINT_PATH %s", vocab_path)
        if corpora.vocab_path is None:
            corpora = dataclasses.replace(corpora, vocab_path=vocab_path)
    mesh_shape = validate(model_dir, model, phases, mesh_shape, jax.device_count(),
                          microbatches, describe=describe, masking=corpora.masking,
                          packed=corpora.packed, merge=merge)
    # Absolute, so checkpoints (Orbax needs it) and the recorded provenance and
    # vocabulary stay valid from any working directory.
    model_dir = checkpoints.absolute(model_dir)
    cfg = _RunConfig(
        model_dir=model_dir, model=model, phases=tuple(phases),
        phase_seeds=tuple(seeds.phase_seeds([p.source() for p in phases], seed)), seed=seed,
        checkpoint_every=checkpoint_every, checkpoint_every_tokens=checkpoint_every_tokens,
        keep_checkpoints=keep_checkpoints,
        async_checkpointing=async_checkpointing, log_every=log_every,
        initial_checkpoint_path=initial_checkpoint_path,
        vocab_path=checkpoints.absolute(vocab_path) if vocab_path else None, tokenizer=None,
        peak_flops=hardware.peak_flops_per_device(), rng_impl=rng_impl,
        microbatches=microbatches, corpora=corpora, feeder=feeder, config_text=config_text,
        merge=merge)
    # A MODEL_DIR this run creates is removed again if the start fails (below); not on
    # several processes, whose others may be probing the same folder at that moment.
    created = not os.path.exists(model_dir) and jax.process_count() == 1
    check_model_dir(model_dir)
    # One writer per run directory (on a pod: the primary host speaks for all).
    lock = run_dir.RunLock(model_dir).acquire() if (
        jax.process_index() == 0 and run_dir.RunLock.supported(model_dir)) else None
    try:
        # The vocabulary where it exists already (the demo's is made by prepare()).
        tokenizer = (check_vocabulary(cfg.vocab_path, model)
                     if cfg.vocab_path and os.path.exists(cfg.vocab_path) else None)
        complete = check_stored_run(model_dir, phases, model, cfg.phase_seeds,
                                    new_process_count, tokenizer, cfg.vocab_path)
        run_dir.use_compilation_cache(model_dir, compilation_cache_dir)
        if prepare is not None:
            prepare()
        tokenizer = tokenizer or check_vocabulary(cfg.vocab_path, model)
        check_same_tokenizer(
            tokenizer, init_tokenizer, cfg.vocab_path,
            f"INITIAL_CHECKPOINT_PATH {initial_checkpoint_path}",
            "leave VOCAB_PATH out to train in the checkpoint's own"
            if init_tokenizer and init_tokenizer["kind"] == "tokenizers" else
            f"set VOCAB_PATH to the vocabulary it records ({init_vocab})")
        cfg = dataclasses.replace(cfg, tokenizer=tokenizer)
        mesh = partitioning.create_mesh(*mesh_shape)
        log.info("devices: %s; mesh (data, fsdp, tensor) = %s%s",
                 hardware.device_description(), mesh_shape,
                 f"; {microbatches} microbatches per step" if microbatches > 1 else "")
        with signals.StopSignals() as stop:
            summary = _train_all(cfg, mesh, stop, complete)
    finally:
        if lock is not None:
            lock.release()
            # A MODEL_DIR this run created and left with nothing but its lock (it failed on
            # its inputs) is removed: a failed start leaves nothing behind.
            if created and os.listdir(model_dir) == [run_dir.LOCK_NAME]:
                os.remove(os.path.join(model_dir, run_dir.LOCK_NAME))
                with contextlib.suppress(OSError):
                    os.rmdir(model_dir)
    return summary


def _train_all(cfg: _RunConfig, mesh, stop: signals.StopSignals, complete: set[str]) -> dict:
    """Builds every unfinished phase's input pipeline, then runs the phases in order."""
    # All pipelines are built now so a missing file or unknown task fails early
    # (a complete phase reads none: its final checkpoint was read back by train()).
    streams, iterators = {}, {}
    for index, phase in enumerate(cfg.phases):
        if note := phase.steps_note():
            log.info("%s", note)
        if phase.name in complete:
            continue
        streams[phase.name] = _stream_seed(cfg, index, phase)
        log.info("[%s] building the input pipeline of %s", phase.name,
                 phase.describe_data(cfg.corpora))
        iterators[phase.name] = _make_iterator(cfg, phase, streams[phase.name][0], mesh)
    # A run that trains records its config: a new run at once, and every run with each
    # checkpoint it writes (so a rerun failing before its first one, on a NaN or a bad
    # binding found late, leaves the stored config alone); a rerun of a complete run
    # leaves it alone.
    if iterators and not os.path.exists(os.path.join(cfg.model_dir, "config.gin")):
        _write_config(cfg)

    stop.defer()  # the pipelines are built: from here a signal stops with a checkpoint
    summary = {"model_dir": cfg.model_dir, "phases": []}
    for index, phase in enumerate(cfg.phases):
        if index and stop.requested(sync_point=True):
            raise errors.Interrupted(
                f"stopped after phase {cfg.phases[index - 1].name!r}; rerunning the same "
                f"command starts phase {phase.name!r}"
            )
        if phase.name in complete:
            summary["phases"].append(progress.complete_summary(cfg.model_dir, phase))
            continue
        stream_seed, reseeded = streams[phase.name]
        # Popped: a phase's pipeline is released when the phase ends. Held to the end of
        # the run, the pipelines were torn down together there, which took 13 s of the
        # demo's 64 on 2 cores (37 s of 116 for the mmBERT recipe's 8 stages).
        summary["phases"].append(_train_phase(cfg, mesh, stop, index, phase,
                                              iterators.pop(phase.name),
                                              stream_seed=stream_seed, reseeded=reseeded))
    if cfg.merge is not None:
        if stop.requested(sync_point=True):
            raise errors.Interrupted(f"stopped before the merge {cfg.merge.name!r}; rerunning "
                                     "the same command merges")
        summary["phases"].append(merging.run_step(cfg.model_dir, cfg.merge, cfg.phases,
                                                  cfg.run_phases()))

    # ------------------------------------------------------------- final summary
    # Like config.gin, written by a run that trained (a rerun of a complete run reads only).
    if jax.process_index() == 0 and any(p["steps_run_now"] or p.get("merged_now")
                                        for p in summary["phases"]):
        # The record that the run finished: written whole.
        files.write_atomic(os.path.join(cfg.model_dir, "summary.json"),
                           json.dumps(summary, indent=2))
    progress.log_summary(summary)
    return summary


def _make_iterator(cfg: _RunConfig, phase: Phase, seed: int, mesh):
    """A phase's iterator of global batches, from its seqio task (or synthetic data)."""
    source = SYNTHETIC if phase.task == SYNTHETIC else phase.registered_source(
        cfg.phases, cfg.corpora)
    # The masking setting (gin: MASK_RATE, or the phase's) shapes synthetic batches too.
    return feeding.phase_batches(
        source, sequence_length=phase.sequence_length, global_batch_size=phase.batch_size,
        mesh=mesh, seed=seed, masking=phase.corpora(cfg.corpora).masking,
        packed=cfg.corpora.packed, vocab_size=cfg.model.vocab_size,
        use_cached=phase.use_cached, feeder=cfg.feeder)


def _stream_seed(cfg: _RunConfig, index: int, phase: Phase) -> tuple[int, bool]:
    """(seed of the phase's input stream, whether it restarts on another process count).

    The seed is the phase's own, or its checkpoint's when it resumes: after a resume on
    another process count that is ``seeds.reseeded`` (recorded as ``stream_seed``).
    """
    phase_seed = cfg.phase_seeds[index]
    ckpt = checkpoints.PhaseCheckpoints(os.path.join(cfg.model_dir, phase.name),
                                        save_interval_steps=1, max_to_keep=None, read_only=True)
    latest = ckpt.latest_step()
    ckpt.close()
    if latest is None:
        return phase_seed, False
    step_dir = ckpt.step_dir(latest)
    meta = checkpoints.read_meta(step_dir)
    stored = feeding.stored_process_count(step_dir)
    if stored in (None, jax.process_count()):
        return int(meta.get("stream_seed", phase_seed)), False
    # (Allowed by train.new_process_count='reseed': checked by checks.check_stored_run.)
    new = seeds.reseeded(phase_seed, int(meta["phase_step"]), jax.process_count())
    log.info("[%s] %s was written by %d process%s, this run has %d: parameters and "
             "optimizer state are restored onto this mesh, every host's input stream restarts "
             "from seed %d (train.new_process_count='reseed')", phase.name, step_dir, stored,
             "es" if stored > 1 else "", jax.process_count(), new)
    return new, True


def _write_config(cfg: _RunConfig) -> None:
    if cfg.config_text is not None and jax.process_index() == 0:
        files.write_atomic(os.path.join(cfg.model_dir, "config.gin"), cfg.config_text)


# ============================================================================
# One phase.
# ============================================================================


@dataclasses.dataclass(frozen=True)
class _Start:
    """Where a phase starts training."""

    state: step.TrainState
    phase_step: int  # steps of this phase already trained (a resume's)
    step_offset: int  # global steps before the phase (a schedule carried over from init_from)
    provenance: str | None  # where the state came from (recorded as initialized_from)
    metrics: dict  # the last metrics logged (a resume's)


def _initial_state(cfg: _RunConfig, index: int, phase: Phase, fns: step.StepFunctions,
                   ckpt: checkpoints.PhaseCheckpoints, iterator, *, reseeded: bool) -> _Start:
    """The phase's initial state, by the init/resume precedence below."""
    # Precedence: (1) this phase's own latest checkpoint (state + data iterator: a resume;
    # a phase 2 with checkpoints is never re-initialised; on another process count the
    # iterator starts anew, not restored); (2) init_from: params of that earlier phase's
    # *final* checkpoint, with fresh or carried-over optimizer moments / schedule per the
    # flags; (3) INITIAL_CHECKPOINT_PATH params for the first phase without init_from;
    # (4) random init from the run seed.
    # (The stored config matches the requested one: checked by checks.check_stored_run.)
    latest = ckpt.latest_step()
    if latest is not None:
        if not reseeded:
            run_dir.check_same_source(phase, ckpt.step_dir(latest), ckpt.read_meta(latest),
                                      _reads_cache(iterator))
        state, meta = ckpt.restore(latest, fns.abstract_state, None if reseeded else iterator)
        log.info("[%s] resuming from %s (step %d/%d)", phase.name, ckpt.step_dir(latest),
                 int(meta["phase_step"]), phase.num_steps)
        return _Start(state, int(meta["phase_step"]), int(meta["step_offset"]),
                      meta.get("initialized_from"), dict(meta.get("metrics") or {}))
    if phase.init_from is not None:
        provenance = _final_checkpoint(cfg, phase)
        state = loading.handoff_state(fns, provenance, reset_optimizer=phase.reset_optimizer,
                                      reset_schedule=phase.reset_schedule)
        log.info("[%s] initialised from %s (reset_optimizer=%s, reset_schedule=%s)",
                 phase.name, provenance, phase.reset_optimizer, phase.reset_schedule)
        return _Start(state, 0, int(state.step), provenance, {})
    if index == 0 and cfg.initial_checkpoint_path:
        params = loading.initial_params(cfg.initial_checkpoint_path, cfg.model)
        state = fns.from_params(jax.device_put(params, fns.state_sharding.params))
        log.info("[%s] parameters from %s", phase.name, cfg.initial_checkpoint_path)
        return _Start(state, 0, 0, cfg.initial_checkpoint_path, {})
    return _Start(fns.init(jax.random.key(cfg.seed)), 0, 0, None, {})


def _final_checkpoint(cfg: _RunConfig, phase: Phase) -> str:
    """The final checkpoint of the phase ``phase`` starts from (its ``init_from``)."""
    prev = checkpoints.PhaseCheckpoints(os.path.join(cfg.model_dir, phase.init_from),
                                        save_interval_steps=1, max_to_keep=None, read_only=True)
    prev_step = prev.latest_step()
    prev.close()
    prev_phase = next(p for p in cfg.phases if p.name == phase.init_from)
    if prev_step is None or prev_step != prev_phase.num_steps:
        raise checkpoints.CheckpointError(
            f"[{phase.name}] init_from={phase.init_from!r}: no final checkpoint "
            f"(step {prev_phase.num_steps}) in {prev.directory}; latest is {prev_step}"
        )
    step_dir = os.fspath(prev.step_dir(prev_step))
    run_dir.check_stored_config(step_dir, prev.read_meta(prev_step), cfg.model, prev_phase)
    return step_dir


def _train_phase(cfg: _RunConfig, mesh, stop: signals.StopSignals, index: int, phase: Phase,
                 iterator, *, stream_seed: int, reseeded: bool) -> dict:
    """Initialises or resumes one phase, trains it to the end, returns its summary."""
    model = phase.model(cfg.model)  # the run's encoder with the phase's RoPE bases
    fns = step.make_step_functions(
        model, phase.optimizer_config(), mesh, seed=cfg.phase_seeds[index],
        rng_impl=cfg.rng_impl, microbatches=cfg.microbatches,
        packed=cfg.corpora.packed,
    )
    ckpt = checkpoints.PhaseCheckpoints(
        os.path.join(cfg.model_dir, phase.name),
        save_interval_steps=cfg.checkpoint_interval(phase),
        max_to_keep=cfg.keep_checkpoints,
        async_save=cfg.async_checkpointing,
    )
    start = _initial_state(cfg, index, phase, fns, ckpt, iterator, reseeded=reseeded)
    state, phase_step, last_metrics = start.state, start.phase_step, start.metrics

    # ---------------------------------------------------------- train loop
    writer = progress.Writer(os.path.join(cfg.model_dir, phase.name, "train"))
    # The batches' prediction slots, as the masking rate sets them (xlmeta_jax.model.mlm).
    slots = iterator.element_spec["mlm_positions"].shape[-1]
    flops_per_token = hardware.mlm_flops_per_token(model, phase.sequence_length, slots)
    tokens_per_step = phase.tokens_per_step()
    # Tokens the model has seen before this phase (its init_from chain's), so curves of
    # phases of other shapes line up on TensorBoard's by_tokens/ scalars.
    tokens_earlier = tokens_before(cfg.phases, phase)
    steps_after = sum(p.num_steps for p in cfg.phases[index + 1:])
    t_phase = t_log = time.time()
    steps_since_log = 0
    # A step's metrics are read on the host one step late (the host runs ahead of the
    # devices), or at once where a log line, a checkpoint or a stop needs them.
    pending = None  # (phase_step, device metrics) not yet read
    # Tokens predicted since the last progress line, and that window's first step.
    predictions, window_first = 0.0, phase_step + 1
    # Packed rows: the summed text share of the steps run now, and their count (the rest of
    # a row is end-of-row padding).
    text_share, text_steps = 0.0, 0

    if start.phase_step == 0:
        log.info("[%s] compiling the train step and reading the first batch", phase.name)
    while phase_step < phase.num_steps:
        batch = next(iterator)
        state, metrics = fns.train_step(state, batch)
        phase_step += 1
        steps_since_log += 1
        if phase_step == start.phase_step + 1 and phase_step % cfg.log_every:
            # This process's first step compiled the step: its time is no step's time (the
            # first rate and ETA after a start or a resume would include the compile).
            t_log, steps_since_log = time.time(), 0
        done = phase_step == phase.num_steps
        save_now = done or ckpt.manager.should_save(phase_step)
        log_now = phase_step % cfg.log_every == 0 or done
        # Every process asks at the same steps (a collective at a sync point).
        stopping = not done and stop.requested(sync_point=save_now or log_now)
        to_read = [pending] if pending else []
        pending = (phase_step, metrics)
        if save_now or log_now or stopping:
            to_read, pending = [*to_read, pending], None
        for pstep, device_metrics in to_read:
            last_metrics = progress.host_metrics(phase, pstep, device_metrics,
                                                 start.step_offset, ckpt)
            predictions += last_metrics["num_predictions"]
            if "text_share" in last_metrics:
                text_share, text_steps = text_share + last_metrics["text_share"], text_steps + 1
        if log_now:
            if predictions == 0:
                ckpt.wait()  # as for a non-finite loss: no save left half-written
                raise errors.NothingTrainedError(
                    f"[{phase.name}] steps {window_first} to {phase_step} predicted no token "
                    "(no position was masked): nothing trains; check the masking rate "
                    "(MASK_RATE) and the data")
            predictions, window_first = 0.0, phase_step + 1
            # No rate when the only step since the last line was the compiling one.
            elapsed = time.time() - t_log
            tok_s = (tokens_per_step * steps_since_log / max(elapsed, 1e-9)
                     if steps_since_log else math.nan)
            step_s = elapsed / steps_since_log if steps_since_log else math.nan
            remaining = (phase.num_steps - phase_step) + steps_after
            mfu = (flops_per_token * tok_s / (cfg.peak_flops * jax.device_count())
                   if cfg.peak_flops and steps_since_log else None)
            seen = tokens_earlier + phase_step * tokens_per_step
            scalars = dict(last_metrics, tokens_seen=seen)
            if steps_since_log:
                scalars.update(tokens_per_second=tok_s, step_time=step_s)
            if mfu is not None:
                scalars["mfu"] = mfu
            writer.scalars(phase_step, scalars)
            writer.scalars(seen, {f"by_tokens/{k}": last_metrics[k]
                                  for k in ("loss", "accuracy", "learning_rate")})
            log.info(
                "[%s] step %d/%d | %s tokens | loss %.4f | acc %.4f | lr %.3g | gnorm %.3g | "
                "%s tok/s | MFU %s | ETA %s",
                phase.name, phase_step, phase.num_steps, fmt_tokens(seen), last_metrics["loss"],
                last_metrics["accuracy"], last_metrics["learning_rate"],
                last_metrics["grad_norm"], progress.fmt_rate(tok_s),
                f"{100 * mfu:.1f}%" if mfu is not None else "n/a",
                progress.fmt_duration(remaining * step_s),
            )
            t_log, steps_since_log = time.time(), 0
        if (save_now or stopping) and ckpt.save(
                phase_step, state, iterator,
                _meta(cfg, index, phase, model, start, phase_step, last_metrics,
                      stream_seed, use_cached=_reads_cache(iterator)),
                force=done or stopping):
            _write_config(cfg)
        if stopping:
            # A second signal meanwhile ends the process at once (signals.StopSignals): the
            # write in flight never looks like a checkpoint, and the next run removes it.
            ckpt.wait()
            latest = ckpt.latest_step()
            ckpt.close()
            raise errors.Interrupted(
                f"[{phase.name}] stopped at step {phase_step}/{phase.num_steps}; rerunning "
                f"the same command resumes from {ckpt.step_dir(latest)}"
            )

    # --------------------------------------------------------- phase end
    if text_steps:
        log.info("[%s] packing: %.1f%% of tokens are text (whole documents in %d-token rows, "
                 "the rest padding at their ends; %d steps)", phase.name,
                 100 * text_share / text_steps, phase.sequence_length, text_steps)
    ckpt.wait()
    final_step = ckpt.latest_step()
    ckpt.close()
    writer.close()
    return progress.phase_summary(phase, last_metrics, ckpt.step_dir(final_step), start.provenance,
                          steps_run=phase.num_steps - start.phase_step,
                          wall=time.time() - t_phase)


def _reads_cache(iterator) -> bool:
    """Whether a phase's iterator reads seqio's offline token cache (synthetic: no)."""
    return bool(getattr(iterator, "use_cached", False))


def _meta(cfg: _RunConfig, index: int, phase: Phase, model: network.EncoderConfig,
          start: _Start, phase_step: int, metrics: dict, stream_seed: int, *,
          use_cached: bool) -> dict:
    """What a checkpoint records beside the state (checks.check_stored_run reads it)."""
    return {
        "phase": phase.name,
        "phase_step": phase_step,
        "num_steps": phase.num_steps,
        "step_offset": start.step_offset,
        "task": phase.task,
        # The phase's own data settings (None: the run's; see Phase).
        "languages": phase.languages and list(phase.languages),
        "alpha": phase.alpha,
        "mask_rate": phase.mask_rate,
        "data_seed": cfg.phase_seeds[index],
        "stream_seed": stream_seed,
        "use_cached": use_cached,
        "process_count": jax.process_count(),
        "batch_size": phase.batch_size,
        "sequence_length": phase.sequence_length,
        "model_config": dataclasses.asdict(model),
        "vocab_path": cfg.vocab_path,
        "tokenizer": cfg.tokenizer,
        "initialized_from": start.provenance,
        "metrics": metrics,
        # The run's phases in order: MODEL_DIR resolves to the last one (loading.py).
        "run_phases": cfg.run_phases(),
    }
