"""What ``python -m t5x.train`` prints: our trainer's progress lines instead of t5x's log.

t5x logs at INFO every step of its work (the whole gin config, every variable, every
Orbax save); on a terminal that buries the run's state and an error's one line. Through
public hooks only:

* importing this module (gin/t5x/run.gin does) puts a filter on absl's handler
  (``absl.logging.get_absl_handler``): warnings and errors still print, INFO records
  do not, and the few that say where the run is (the main loop's first step, a run
  already complete, the end) become progress lines; clu's deprecation notice of
  ``DatasetIterator.load`` (t5x's restore of the input pipeline) is dropped;
* :class:`ProgressAction` is a t5x train action (``train.actions``): after every
  ``LOG_EVERY`` steps it prints the step, loss, accuracy, learning rate, tokens per
  second and time left, as our trainer does.

Files are untouched: t5x still writes config.gin, the TensorBoard summaries and the
checkpoints. ``XLMETA_DEBUG=1`` (or absl's ``--verbosity``) keeps t5x's whole log.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
from absl import flags
from absl import logging as absl_logging
from t5x import trainer as t5x_trainer

from xlmeta_jax import errors, files, library_text, logs
from xlmeta_jax.pretrain import hardware
from xlmeta_jax.pretrain import progress as fmt

# t5x's own messages that say where a run is: its loop reports progress only through its
# INFO log (train() takes no callback for the loop's start and end).
_T5X_LOG = "t5x.train() logs it at INFO, its only report of the loop's start and end"
_MAIN_LOOP = library_text.declare(
    "Starting main loop over steps %d-%d", module="t5x.train", package="t5x",
    version="0.0.0 (../shared/wheels)", why=_T5X_LOG)
_NOTHING_TO_DO = library_text.declare(
    "Total training steps and checkpoint step were both %d", module="t5x.train", package="t5x",
    version="0.0.0 (../shared/wheels)", why=_T5X_LOG)
_FINISHED = library_text.declare(
    "Finished.", module="t5x.train", package="t5x", version="0.0.0 (../shared/wheels)",
    why=_T5X_LOG)
# Notices of libraries t5x uses that are not failures of the run.
_DROPPED = (library_text.declare(
    "DatasetIterator.load() is deprecated", module="clu.data.dataset_iterator", package="clu",
    version="0.0.12",
    why="clu logs it at ERROR on the absl logger each time t5x restores a run's input "
        "position (t5x calls load(); no option), beside the run's real errors"),)


class ProgressAction(t5x_trainer.BaseAction):
    """t5x train action: one progress line per ``LOG_EVERY`` steps (gin: ``train.actions``).

    Needs ``train.concurrent_metrics = False`` (t5x runs actions only then). The line
    is the one of our trainer: ``[phase1] step 20/40 | loss 7.0766 | acc 0.0243 | lr
    0.0007 | 9.2k tok/s | ETA 0:00:02``, the rate being the last ``LOG_EVERY`` steps'.

    Args:
      model_dir: the directory t5x writes (named in the lines; its last part is the
        run's name unless ``name`` is given).
      total_steps: the run's last step (``TRAIN_STEPS``).
      name: the name in brackets (default: the last part of ``model_dir``).
      start_step: the step the phase starts from (a stage that continues the step of the
        one before: gin/t5x/stage.gin); a start there is no resume.
    """

    def __init__(self, model_dir: str, total_steps: int, name: str | None = None,
                 start_step: int = 0):
        self.model_dir = os.path.abspath(files.user_path(model_dir, "MODEL_DIR"))
        self.total_steps = int(total_steps)
        self.start_step = int(start_step)
        self.name = name or os.path.basename(self.model_dir.rstrip("/")) or "train"
        self.step = None
        # The run's start and end lines come from t5x's log records (_Quiet).
        _QUIET.action = self

    def run(self, train_state, metrics_by_task) -> bool:  # noqa: D102 - BaseAction's
        self.step = int(np.asarray(train_state.step))
        for metrics in metrics_by_task.values():
            rate = _scalar(metrics, "timing/steps_per_second")
            eta = (self.total_steps - self.step) / rate if rate else float("nan")
            lr = _scalar(metrics, "learning_rate/current", _scalar(metrics, "learning_rate"))
            logs.progress.info(
                "[%s] step %d/%d | loss %.4f | acc %.4f | lr %.3g | %s tok/s | ETA %s",
                self.name, self.step, self.total_steps, _scalar(metrics, "loss"),
                _scalar(metrics, "accuracy"), lr,
                fmt.fmt_rate(_scalar(metrics, "timing/tokens_per_second", 0.0)),
                fmt.fmt_duration(eta))
        return False

    def started(self, first_step: int, total_steps: int) -> None:
        """The main loop's start (t5x has restored or initialised the state)."""
        self.total_steps = total_steps
        if first_step > self.start_step:
            where = f"resuming from step {first_step}/{total_steps}"
        elif first_step:
            where = f"steps {first_step + 1} to {total_steps}"
        else:
            where = f"{total_steps} steps"
        logs.progress.info("[%s] %s on %s: compiling the train step and reading the first "
                           "batch", self.name, where, hardware.device_description())

    def complete(self, step: int) -> None:
        """The run found its last step's checkpoint: nothing to train."""
        logs.progress.info("[%s] already complete at step %d (%s)", self.name, step,
                           self.model_dir)
        # Said already: no "done" line when t5x then finishes.
        self.step = None

    def finished(self) -> None:
        """t5x's loop ended (its last checkpoint is written)."""
        if self.step is None:
            return
        logs.progress.info("[%s] done at step %d: %s (TensorBoard: tensorboard --logdir %s)",
                           self.name, self.step, self.model_dir,
                           os.path.dirname(self.model_dir))


def _scalar(metrics: dict, name: str, default: Any = float("nan")) -> Any:
    value = metrics.get(name)
    value = getattr(value, "value", value)
    return default if value is None else float(np.asarray(value))


class _Quiet(logging.Filter):
    """On absl's handler: warnings and errors pass, INFO records become progress or nothing."""

    def __init__(self):
        super().__init__()
        self.action: ProgressAction | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if msg.startswith(_DROPPED):
            return False
        action = self.action
        if msg == _MAIN_LOOP and action is not None and len(record.args or ()) == 2:
            action.started(*record.args)
        elif msg.startswith(_NOTHING_TO_DO) and action is not None and record.args:
            action.complete(record.args[0])
            return False
        elif msg == _FINISHED and action is not None:
            action.finished()
        return record.levelno >= logging.WARNING


_QUIET = _Quiet()


def quiet_t5x_log() -> None:
    """Installs the filter on absl's handler (idempotent), unless the whole log is asked for.

    ``XLMETA_DEBUG=1`` or an explicit ``--verbosity``/``-v`` keeps t5x's log as it is.
    """
    verbosity = flags.FLAGS["verbosity"] if "verbosity" in flags.FLAGS else None
    if errors.debug_requested(()) or (verbosity is not None and verbosity.present):
        return
    logs.show_progress()
    logs.quiet_save_waits()
    absl_logging.get_absl_handler().addFilter(_QUIET)


quiet_t5x_log()
