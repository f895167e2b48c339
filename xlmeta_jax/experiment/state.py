"""The state of an experiment's folder: what is done, and whether it is this experiment's."""

from __future__ import annotations

import json
import os

from xlmeta_jax import errors, files
from xlmeta_jax.experiment.spec import Experiment


class ExperimentError(errors.UserError, ValueError):
    """The experiment's configuration or its MODEL_DIR is invalid (one line)."""


def pretraining_done(exp: Experiment, arm: str, seed: int) -> dict | None:
    """The trainer's summary of a finished arm x seed run, or None.

    A released arm's model is finished as it is: its summary names the folder as the
    checkpoint every evaluation reads.

    Raises:
      ExperimentError: when the folder holds a finished run of other phases.
    """
    if arm in exp.released:
        return {"model_dir": exp.released[arm], "phases": [
            {"phase": "released", "task": None, "steps": 0, "tokens": 0, "final_loss": None,
             "final_accuracy": None, "checkpoint": exp.released[arm]}]}
    path = os.path.join(exp.run_dir(arm, seed), "summary.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        summary = json.load(f)
    # A phase reads its task under its own name when it sets its own data (Phase.source);
    # an arm with a merge step ends in the merge's entry.
    want = [(p.name, p.source(), p.num_steps) for p in exp.phases(arm)]
    if (merge := exp.merge(arm)) is not None:
        want.append((merge.name, 0))
    got = [(p["phase"], p["steps"]) if p.get("merged_now") is not None else
           (p["phase"], p["task"], p["steps"]) for p in summary.get("phases", [])]
    if got != want:
        raise ExperimentError(
            f"{exp.run_dir(arm, seed)} holds a finished run of phases {got}, the experiment "
            f"plans {want}; use a new MODEL_DIR")
    return summary


def evaluation_done(exp: Experiment, arm: str, seed: int, task: str,
                    checkpoint: str | None) -> dict | None:
    """The results.json of a finished evaluation of ``checkpoint``, or None."""
    path = os.path.join(exp.eval_dir(arm, seed, task), "results.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        results = json.load(f)
    recorded = results.get("model", {}).get("checkpoint")
    if checkpoint is not None and recorded not in (None, checkpoint):
        raise ExperimentError(
            f"{path} evaluates {recorded}, not this experiment's {checkpoint}; use a new "
            "MODEL_DIR")
    return results


def check_model_dir(exp: Experiment, write: bool = True) -> None:
    """Records the plan in MODEL_DIR/experiment.json (if ``write``); a resume must match it.

    A MODEL_DIR that cannot be a folder is refused even by a dry run, which writes nothing.
    """
    problem = files.not_a_folder(exp.model_dir, "MODEL_DIR")
    if problem:
        raise ExperimentError(problem)
    path = os.path.join(exp.model_dir, "experiment.json")
    mine = exp.fingerprint()
    if os.path.isfile(path):
        with open(path) as f:
            theirs = json.load(f).get("fingerprint", {})
        for key in mine:
            if json.dumps(theirs.get(key), sort_keys=True) != json.dumps(mine[key],
                                                                          sort_keys=True):
                raise ExperimentError(
                    f"MODEL_DIR {exp.model_dir} holds an experiment with another {key} "
                    f"({theirs.get(key)} there, {mine[key]} now); use a new MODEL_DIR")
        return
    if not write:
        return
    os.makedirs(exp.model_dir, exist_ok=True)
    files.write_atomic(path, json.dumps({"name": exp.name, "fingerprint": mine}, indent=2))



def final_checkpoint(exp: Experiment, arm: str, seed: int) -> str | None:
    """Step directory of the arm x seed run's last phase, once pretraining finished."""
    summary = pretraining_done(exp, arm, seed)
    return None if summary is None else summary["phases"][-1]["checkpoint"]
