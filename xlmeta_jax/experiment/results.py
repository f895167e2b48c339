"""The experiment's results: everything finished so far, as results.json and the report."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import jax

from xlmeta_jax import files
from xlmeta_jax.experiment import report as experiment_report
from xlmeta_jax.experiment.arms import phase_tokens
from xlmeta_jax.experiment.spec import Experiment
from xlmeta_jax.experiment.state import evaluation_done, pretraining_done


def loss_curve(exp: Experiment, arm: str, seed: int) -> dict[str, list]:
    """Training loss against tokens seen, from the trainer's TensorBoard events.

    A resumed phase logs some steps twice; the last value written wins.
    """
    try:
        import tensorflow as tf  # noqa: PLC0415 - TensorFlow only where tf.data runs
    except ImportError:
        return {"tokens": [], "loss": [], "phase": []}

    curve: dict[str, list] = {"tokens": [], "loss": [], "phase": []}
    tokens_before = 0
    for phase in exp.phases(arm):
        points: dict[int, float] = {}
        files = sorted(glob.glob(os.path.join(exp.run_dir(arm, seed), phase.name, "train",
                                              "events.out.tfevents.*")))
        for path in files:
            # Not tf.compat.v1.train.summary_iterator: it logs a deprecation warning.
            for record in tf.data.TFRecordDataset(path, buffer_size=1 << 18):
                event = tf.compat.v1.Event.FromString(record.numpy())
                for value in event.summary.value:
                    if value.tag == "loss":
                        points[int(event.step)] = float(tf.make_ndarray(value.tensor)
                                                        if value.HasField("tensor")
                                                        else value.simple_value)
        per_step = phase.batch_size * phase.sequence_length
        for step_ in sorted(points):
            curve["tokens"].append(tokens_before + step_ * per_step)
            curve["loss"].append(points[step_])
            curve["phase"].append(phase.name)
        tokens_before += phase.num_steps * per_step
    return curve


def _evaluation_summary(results: dict) -> dict:
    metric = results["metric"]
    out = {key: results.get(key) for key in ("metric", "english", "average_target",
                                             "transfer_gap", "average")}
    out["languages"] = {lang: v[metric] for lang, v in results["languages"].items()}
    # Tatoeba's chance level is 100 / the candidate sentences of each language.
    out["num_examples"] = {lang: v.get("num_examples")
                           for lang, v in results["languages"].items()}
    if results.get("layer_sweep"):
        # The headline direction of Tatoeba (XTREME's): English queries, xx is searched.
        # Keys count hidden states (0 = embedding output); the reported layer is
        # hidden_states_index there.
        out["layer_sweep"] = {layer: v["en2xx"] for layer, v in results["layer_sweep"].items()}
        out["layer"] = results.get("layer")
        out["hidden_states_index"] = results.get("hidden_states_index")
    for key in ("total_seconds", "eval_seconds"):
        if key in results:
            out[key] = results[key]
    # How the protocol differs from XTREME's (stated next to the numbers in the report).
    provenance = results.get("provenance") or {}
    if "comparable_to_xtreme" in provenance:
        out["comparable_to_xtreme"] = provenance["comparable_to_xtreme"]
        out["differences_from_xtreme"] = list(provenance.get("differences", []))
    return out


def collect(exp: Experiment, command: str = "") -> dict:
    """The experiment's results.json content: everything finished so far."""

    runs = {}
    for arm in exp.arms:
        for seed in exp.seeds:
            summary = pretraining_done(exp, arm, seed)
            run: dict[str, Any] = {"arm": arm, "seed": seed, "pretraining": None,
                                   "evaluations": {}}
            if summary is not None:
                run["pretraining"] = {
                    "tokens": sum(p["tokens"] for p in summary["phases"]),
                    "phases": [{k: p.get(k) for k in ("phase", "task", "steps", "tokens",
                                                      "final_loss", "final_accuracy",
                                                      "checkpoint")}
                               for p in summary["phases"]],
                    "loss_curve": loss_curve(exp, arm, seed),
                }
                checkpoint = summary["phases"][-1]["checkpoint"]
                for task in exp.tasks:
                    results = evaluation_done(exp, arm, seed, task, checkpoint)
                    if results is not None:
                        run["evaluations"][task] = _evaluation_summary(results)
            runs[f"{arm}/seed{seed}"] = run
    out = {
        "experiment": {
            "name": exp.name, "command": command, "arms": list(exp.arms),
            "seeds": list(exp.seeds), "tasks": list(exp.tasks),
            "english_task": exp.english_task, "xling_mixture": exp.xling_mixture,
            "english_share_of_joint": exp.budget.english_share,
            "tokens": {arm: phase_tokens(exp.phases(arm)) for arm in exp.arms},
            **exp.fingerprint(),
        },
        "runs": runs,
    }
    out["summary"] = experiment_report.summarize(out)
    return out


def write_results(exp: Experiment, command: str = "") -> dict:
    """Writes MODEL_DIR/results.json, report.md and the plots; returns the results."""

    results = collect(exp, command)
    if jax.process_index() != 0:
        # Pretraining on a pod (no tasks, see check_hosts): process 0 writes.
        return results
    files.write_atomic(os.path.join(exp.model_dir, "results.json"),
                       json.dumps(results, indent=1))
    experiment_report.write_report(results, exp.model_dir)
    return results
