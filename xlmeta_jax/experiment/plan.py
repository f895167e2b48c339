"""The experiment's plan and its time estimate (``--dry_run``).

Step rates are read from this experiment's finished runs when there are any, else
measured now on synthetic batches of the experiment's shape; evaluations are timed
from finished ones of the same task, else estimated from their settings.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable

import jax

from xlmeta_jax.data.feeding import SyntheticMLMIterator
from xlmeta_jax.evaluation import tasks
from xlmeta_jax.experiment.arms import phase_tokens
from xlmeta_jax.experiment.runner import (
    Experiment,
    evaluation_done,
    final_checkpoint,
    finetune_argv,
    format_duration,
    pretraining_done,
)
from xlmeta_jax.model import partitioning
from xlmeta_jax.pretrain import checkpoints
from xlmeta_jax.pretrain import step as step_lib


def measure_step_seconds(exp: Experiment, steps: int = 5) -> tuple[float, float, float]:
    """(compile seconds, seconds per step, share of the CPUs used) of the train step.

    Measured on synthetic batches of the experiment's shape (no input pipeline), on
    the mesh and PRNG the trainer is configured with. The share is the process's CPU
    time over wall time x cores while stepping (on the CPU backend; 1.0 elsewhere): on
    a machine other jobs share it is below what the step would use alone.
    """

    setting = exp.train_settings.get
    mesh = partitioning.create_mesh(*setting("mesh_shape", (-1, 1, 1)))
    first = next(p for arm in exp.arms for p in exp.phases(arm))  # a pretrained arm's
    fns = step_lib.make_step_functions(exp.model, first.optimizer_config(),
                                       mesh, rng_impl=setting("rng_impl", "threefry2x32"),
                                       microbatches=setting("microbatches", 1))
    batches = SyntheticMLMIterator(sequence_length=exp.budget.sequence_length,
                                   global_batch_size=exp.budget.batch_size, mesh=mesh, seed=0,
                                   vocab_size=exp.model.vocab_size)
    state = fns.init(jax.random.key(0))
    t0 = time.time()
    state, metrics = fns.train_step(state, next(batches))
    jax.block_until_ready(metrics)
    compile_s = time.time() - t0
    t0, cpu0 = time.time(), time.process_time()
    for _ in range(steps):
        state, metrics = fns.train_step(state, next(batches))
    jax.block_until_ready(metrics)
    wall, cpu = time.time() - t0, time.process_time() - cpu0
    share = 1.0
    if jax.default_backend() == "cpu":
        share = min(1.0, cpu / (wall * (os.cpu_count() or 1)))
    return compile_s, wall / steps, share


def _rates_from_runs(exp: Experiment) -> tuple[float, float] | None:
    """(seconds per phase start, seconds per step) from finished runs' summaries."""
    steps = wall = phases = 0
    for arm in exp.arms:
        for seed in exp.seeds:
            summary = pretraining_done(exp, arm, seed)
            for p in (summary or {}).get("phases", []):
                if p.get("steps_run_now") and p.get("wall_seconds_now"):
                    steps += p["steps_run_now"]
                    wall += p["wall_seconds_now"]
                    phases += 1
    if not steps:
        return None
    # The per-phase overhead is inside the wall time already.
    return 0.0, wall / steps


def _phase_progress(exp: Experiment, arm: str, seed: int) -> list[int]:
    """Steps already checkpointed per phase of one run (0 where none)."""

    if pretraining_done(exp, arm, seed) is not None:
        return [p.num_steps for p in exp.phases(arm)]
    out = []
    for phase in exp.phases(arm):
        path = os.path.join(exp.run_dir(arm, seed), phase.name)
        latest = None
        if os.path.isdir(path):
            ckpt = checkpoints.PhaseCheckpoints(path, save_interval_steps=1, max_to_keep=None,
                                                read_only=True)
            try:
                latest = ckpt.latest_step()
            finally:
                ckpt.close()
        out.append(latest or 0)
    return out


def plan(exp: Experiment, *, estimate: bool = True,
         eval_seconds: Callable[[str], float] | None = None) -> str:
    """The plan as text: every run and evaluation with its state, and the time left.

    Args:
      exp: the experiment.
      estimate: measure step rates (or read them from finished runs) and add times.
      eval_seconds: estimated seconds of one evaluation of a task (default: from finished
        evaluations of that task, else :func:`estimate_eval_seconds`).
    """
    b = exp.budget
    m = exp.model
    lines = [
        f"experiment {exp.name!r} in {exp.model_dir}",
        f"  model: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads, "
        f"MLP {m.mlp_dim}, vocabulary {m.vocab_size}; batch {b.batch_size} x "
        f"{b.sequence_length} tokens; peak LR {exp.optimizer.learning_rate:g}, "
        f"warm-up {exp.optimizer.warmup_steps} steps per phase",
        f"  META_STEPS {b.meta_steps}, XLING_STEPS {b.xling_steps}; joint: English at "
        f"{100 * b.english_share:.1f}% of the tokens",
        "",
        f"  {'arm':<11}{'seed':>5}  {'phases (task x steps)':<58}{'tokens':>13}  state",
    ]
    steps_left = phases_left = 0
    for arm in exp.arms:
        phases = exp.phases(arm)
        desc = (" -> ".join(f"{p.task} x {p.num_steps}" for p in phases)
                or f"released: {exp.released.get(arm)}")
        for seed in exp.seeds:
            done = _phase_progress(exp, arm, seed)
            left = [p.num_steps - d for p, d in zip(phases, done)]
            steps_left += sum(left)
            phases_left += sum(1 for x in left if x > 0)
            state = ("done" if not any(left) else "to do" if not any(done)
                     else f"{sum(done)}/{sum(p.num_steps for p in phases)} steps")
            lines.append(f"  {arm:<11}{seed:>5}  {desc[:58]:<58}"
                         f"{phase_tokens(phases):>13,}  {state}")
    evals_left: dict[str, int] = {}
    evals_done = 0
    for arm in exp.arms:
        for seed in exp.seeds:
            ckpt = final_checkpoint(exp, arm, seed)
            for task in exp.tasks:
                if ckpt is not None and evaluation_done(exp, arm, seed, task, ckpt):
                    evals_done += 1
                else:
                    evals_left[task] = evals_left.get(task, 0) + 1
    evals_left = {t: evals_left[t] for t in exp.tasks if t in evals_left}
    n_evals = len(exp.arms) * len(exp.seeds) * len(exp.tasks)
    lines += ["", f"  evaluations: {', '.join(exp.tasks)} for every run: {n_evals} "
                  f"({evals_done} done); first one:",
              "    python -m xlmeta_jax.finetune "
              + " ".join(finetune_argv(exp, exp.arms[0], exp.seeds[0], exp.tasks[0]))]
    if not estimate or not any(exp.phases(arm) for arm in exp.arms):
        return "\n".join(lines)  # (released arms only: no pretraining step to measure)

    rates = _rates_from_runs(exp)
    share = 1.0
    if rates is not None:
        compile_s, step_s = rates
        source = "measured on this experiment's finished runs (incl. input pipeline)"
    else:
        compile_s, step_s, share = measure_step_seconds(exp)
        source = ("measured now on synthetic batches (without input pipeline); compile "
                  f"{compile_s:.1f}s per phase")
    pre_s = steps_left * step_s + phases_left * compile_s
    per_task = {task: (eval_seconds or (lambda t: estimate_eval_seconds(exp, t, step_s,
                                                                        compile_s)))(task)
                for task in evals_left}
    eval_s = sum(n * per_task[t] for t, n in evals_left.items())
    lines += [
        "",
        f"  step time {step_s:.3f}s ({b.tokens_per_step / step_s:,.0f} tokens/s), {source}",
        f"  pretraining left: {steps_left:,} steps in {phases_left} phases ~ "
        f"{format_duration(pre_s)}",
        "  evaluation left: " + (", ".join(
            f"{t} {n} x {format_duration(per_task[t])}" for t, n in evals_left.items())
            or "none") + f" ~ {format_duration(eval_s)}",
        f"  estimated time left: {format_duration(pre_s + eval_s)}",
    ]
    if share < 0.8:
        lines.append(
            f"  (the measurement got {100 * share:.0f}% of the {os.cpu_count()} CPUs: other "
            f"jobs share the machine; alone it would take about "
            f"{format_duration(share * (pre_s + eval_s))})")
    return "\n".join(lines)


def estimate_eval_seconds(exp: Experiment, task: str, step_s: float, compile_s: float) -> float:
    """Seconds of one evaluation of ``task``.

    From the evaluations of that task that finished already, else from its settings: the
    fine-tuning steps' tokens at the pretraining step's time per token, forward passes
    (model selection on English dev, evaluation, retrieval) at a third of it, two
    compilations and loading, times the fine-tuning seeds (the task's ``FineTuneConfig``
    of ``exp.finetunes``).
    """
    finished = []
    for arm in exp.arms:
        for seed in exp.seeds:
            ckpt = final_checkpoint(exp, arm, seed)
            results = ckpt and evaluation_done(exp, arm, seed, task, ckpt)
            if results and results.get("total_seconds"):
                finished.append(float(results["total_seconds"]))
    if finished:
        return sum(finished) / len(finished) + compile_s

    config = exp.finetunes[task]
    s = dataclasses.asdict(config.settings)
    spec = tasks.get(task)
    languages = spec.check_languages(config.languages)
    data_dir = config.data_dir
    token_s = step_s / exp.budget.tokens_per_step
    forward_s = token_s / 3
    length = min(s["max_seq_length"], exp.model.max_length)
    limit = s["max_eval_examples"] or sys.maxsize
    if not spec.fine_tunes:
        # Tatoeba has up to 1000 pairs per language; both sides are embedded once.
        pairs = len(languages) * min(limit, 1000)
        return 2 * pairs * length * forward_s + compile_s + 5.0
    split = dict(train_fraction=s["train_fraction"], select_fraction=s["select_fraction"])
    n_train = len(spec.load_train(data_dir, **split))
    if s["max_train_examples"]:
        n_train = min(n_train, s["max_train_examples"])
    steps = s["train_steps"] or math.ceil(s["num_epochs"] * n_train / s["batch_size"])
    n_eval = sum(min(limit, len(spec.load_eval(lang, data_dir, **split)))
                 for lang in languages)
    n_select = 0
    if s["eval_every"]:
        select = spec.load_select(data_dir, **split) or []
        n_select = min(limit, len(select)) * (steps // s["eval_every"] + 1)
    one_seed = (steps * s["batch_size"] * length * token_s
                + (n_eval + n_select) * length * forward_s + 2 * compile_s)
    return exp.finetune_seeds * one_seed + 5.0
