"""A run's progress: log lines, TensorBoard scalars, durations and rates, the summary."""

from __future__ import annotations

import datetime
import logging
import math
import os
import shlex

import jax

from xlmeta_jax import errors
from xlmeta_jax.pretrain import checkpoints

log = logging.getLogger("xlmeta_jax.train")


class Writer:
    """TensorBoard scalars via clu when TensorFlow is present, else logs only."""

    def __init__(self, logdir: str):
        self._writer = None
        if jax.process_index() != 0:
            return
        try:
            from clu import metric_writers  # noqa: PLC0415 - clu imports TensorFlow; only where it is used

            self._writer = metric_writers.SummaryWriter(logdir)
        except Exception as e:  # noqa: BLE001 - TensorBoard is optional on TF-less hosts
            log.warning("TensorBoard summaries disabled (%s)", e)

    def scalars(self, step: int, values: dict):
        if self._writer is not None:
            self._writer.write_scalars(step, values)

    def close(self):
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()


def fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    return str(datetime.timedelta(seconds=int(seconds)))


def fmt_rate(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def log_summary(summary: dict) -> None:
    lines = [f"run {summary['model_dir']}:"]
    width = max([8, *(len(p["phase"]) for p in summary["phases"])])
    lines.append(f"  {'phase':<{width}} {'task':<28} {'steps':>7} {'loss':>8} {'acc':>7}  "
                 "checkpoint")
    for p in summary["phases"]:
        loss = f"{p['final_loss']:.4f}" if p["final_loss"] is not None else "-"
        acc = f"{p['final_accuracy']:.4f}" if p["final_accuracy"] is not None else "-"
        lines.append(
            f"  {p['phase']:<{width}} {p['task'][:28]:<28} {p['steps']:>7} {loss:>8} {acc:>7}  "
            f"{p['checkpoint']}"
        )
    lines.append(f"  TensorBoard: tensorboard --logdir {shlex.quote(summary['model_dir'])}")
    log.info("\n".join(lines))


def complete_summary(model_dir: str, phase) -> dict:
    """The summary of a phase a rerun finds complete (nothing is restored)."""
    ckpt = checkpoints.PhaseCheckpoints(os.path.join(model_dir, phase.name),
                                        save_interval_steps=1, max_to_keep=None, read_only=True)
    latest = ckpt.latest_step()
    meta = ckpt.read_meta(latest)
    ckpt.close()
    log.info("[%s] already complete at %s", phase.name, ckpt.step_dir(latest))
    return phase_summary(phase, meta.get("metrics") or {}, ckpt.step_dir(latest),
                         meta.get("initialized_from"), steps_run=0, wall=0.0)


def phase_summary(phase, metrics, step_dir, provenance, *, steps_run, wall) -> dict:
    """A phase's entry of the run's summary (summary.json, the closing table)."""
    return {
        "phase": phase.name,
        "task": phase.source(),
        "steps": phase.num_steps,
        "steps_run_now": steps_run,
        "final_loss": metrics.get("loss"),
        "final_accuracy": metrics.get("accuracy"),
        "tokens": phase.num_steps * phase.batch_size * phase.sequence_length,
        "wall_seconds_now": wall,
        "checkpoint": os.fspath(step_dir),
        "initialized_from": provenance,
    }


def host_metrics(phase, phase_step: int, metrics, step_offset: int,
                 ckpt: checkpoints.PhaseCheckpoints) -> dict:
    """A step's metrics on the host; a non-finite loss stops the run."""
    host = {k: float(v) for k, v in jax.device_get(metrics).items()}
    if not math.isfinite(host["loss"]):
        # The save in flight holds an earlier, finite state: finished, it leaves no
        # temporary folder, and config.gin (written with it) names a real checkpoint.
        ckpt.wait()
        last = ckpt.latest_step()
        last = "no checkpoint yet" if last is None else f"last checkpoint: {last}"
        raise errors.NonFiniteError(
            f"[{phase.name}] non-finite loss {host['loss']} at step {phase_step} (global step "
            f"{phase_step + step_offset}); {last}. Lower the learning rate or check the data."
        )
    return host
