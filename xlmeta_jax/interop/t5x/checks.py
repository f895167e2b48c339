"""Our trainer's safety checks and one-line errors under ``python -m t5x.train``.

t5x's command is theirs, so it is reached through its public hooks only:

* importing this module (gin/t5x/run.gin does) installs an absl exception handler
  (``absl.app.install_exception_handler``): a user error (``errors.UserError``, a
  missing file, a left-unset gin macro) ends the command as ours do, with one line on
  stderr and exit status 2 instead of a traceback after hundreds of log lines
  (``XLMETA_DEBUG=1`` keeps the traceback);
* :func:`checked_model` is bound as ``train.model``, the first argument gin evaluates
  for t5x's ``train``, so the checks our trainer makes before any work (vocabulary
  against the model, pad id, the corpora present, the schedule against the steps, phase
  order, MODEL_DIR writable and not in use) run before t5x builds anything;
* :class:`StopOnNonFiniteLoss` is a t5x train action (``train.actions``): a non-finite
  loss stops the run, naming the step, before the state is checkpointed.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import Any

import jax
import numpy as np
from absl import app
from t5x import trainer as t5x_trainer

from xlmeta_jax import errors, files, logs
from xlmeta_jax.pretrain import checks as validation
from xlmeta_jax.pretrain import run_dir

PROG = "t5x.train"
# Held for the life of the process: one writer per MODEL_DIR, as in our trainer.
_locks: list[run_dir.RunLock] = []


class NonFiniteLossError(errors.UserError):
    """The training loss became NaN or infinite."""


class _OneLineErrors(app.ExceptionHandler):
    """Reports a user error as ``t5x.train: error: <line>`` and exits with status 2.

    absl calls installed handlers with the exception before re-raising it (which would
    print the traceback); exiting here is the only way to keep the traceback out and
    give the user-error status, since absl swallows a ``SystemExit`` a handler raises.

    ``os._exit`` does not wait for an Orbax save still running in the background, and
    t5x keeps its checkpoint manager to itself (no public handle to wait on), but no
    checkpoint a run relies on can be in flight here: the checks fail before anything is
    saved, and t5x waits for every periodic save (``wait_until_finished``) before its loop
    goes on, so a non-finite loss is raised with no save pending but possibly step 0's,
    the initial state a rerun rebuilds (Orbax removes the unfinished directory then).
    Only saves at an explicit ``SaveCheckpointConfig.checkpoint_steps`` list, which our
    gin files do not bind, go on without a wait.
    """

    def wants(self, exc: BaseException) -> bool:
        return (not errors.debug_requested(())) and errors.user_message(exc) is not None

    def handle(self, exc: BaseException) -> None:
        logging.shutdown()
        sys.stdout.flush()
        print(f"{PROG}: error: {errors.user_message(exc)}", file=sys.stderr, flush=True)
        os._exit(errors.EXIT_USER_ERROR)


def install_error_handler() -> None:
    """Installs the one-line handler once (idempotent); also quiets Orbax's save waits."""
    if not any(isinstance(h, _OneLineErrors) for h in app.EXCEPTION_HANDLERS):
        app.install_exception_handler(_OneLineErrors())
    logs.quiet_save_waits()


def checked_model(
    model: Any,
    model_dir: str,
    vocab_path: str | None = None,
    task: str | None = None,
    init_params_from: str | None = None,
    sequence_length: int | None = None,
    command_line: Any = None,
) -> Any:
    """``model``, once the run's settings passed our trainer's checks (gin: ``train.model``).

    Gin evaluates the arguments first: ``model`` builds the optimizer configuration (a
    warm-up longer than the run is refused there), ``task`` registers the corpora (a
    missing language file is refused there), ``init_params_from`` is phase 2's source
    checkpoint (refused when phase 1 has not finished) and ``model_dir`` the phase's
    directory.

    Args:
      model: t5x's model (``MODEL``); its ``config`` is our EncoderConfig.
      model_dir: the directory t5x writes (``MODEL_DIR`` or its phase directory).
      vocab_path: the SentencePiece model (``VOCAB_PATH``).
      task: the seqio task or mixture (``MIXTURE_OR_TASK_NAME``), registered.
      init_params_from: phase 2's starting checkpoint, checked to exist.
      sequence_length: the tokens per example (``SEQUENCE_LENGTH``), checked against
        the shortest block the tasks pack and the model's positions.
      command_line: the command line's gin bindings, checked by their own evaluation
        (``xlmeta_jax.cli.t5x_train.checked_bindings``: a macro no binding reads, such
        as a misspelt one, is refused there).

    Returns:
      ``model`` unchanged.

    Raises:
      validation.ConfigError: the vocabulary does not fit the model, or MODEL_DIR
        is not writable.
      run_dir.RunLockedError: another process trains into MODEL_DIR.
    """
    del task, init_params_from, command_line  # checked by their own evaluation
    config = getattr(model, "config", None)
    if config is not None:
        validation.check_vocabulary(vocab_path, config)
    if sequence_length is not None:
        validation.check_sequence_length(sequence_length, config, where="sequence length",
                                         source="SEQUENCE_LENGTH")
    if not model_dir:
        raise validation.ConfigError("MODEL_DIR is not set (bind --gin.MODEL_DIR=\"'/path'\")")
    model_dir = files.user_path(model_dir, "MODEL_DIR")
    validation.check_model_dir(model_dir)

    if jax.process_index() == 0 and run_dir.RunLock.supported(model_dir) and not _locks:
        lock = run_dir.RunLock(model_dir).acquire()
        _locks.append(lock)
        atexit.register(lock.release)
    return model


class StopOnNonFiniteLoss(t5x_trainer.BaseAction):
    """t5x train action: a NaN or infinite loss stops the run before it is checkpointed.

    t5x's own ``TerminateOnNanAction`` asks the loop to stop, which then saves the
    non-finite state as a checkpoint and exits 0. Raising instead ends the command with
    one line naming the step (the handler above), and t5x's loop runs actions before it
    saves. Needs ``train.concurrent_metrics = False`` (t5x runs actions only then).
    """

    def __init__(self, metric: str = "loss"):
        self.metric = metric

    def run(self, train_state, metrics_by_task) -> bool:  # noqa: D102 - BaseAction's
        for metrics in metrics_by_task.values():
            value = metrics.get(self.metric)
            value = getattr(value, "value", value)
            if value is not None and not np.isfinite(np.asarray(value)).all():
                step = int(np.asarray(train_state.step))
                raise NonFiniteLossError(
                    f"non-finite {self.metric} ({float(np.asarray(value))}) in the steps up "
                    f"to {step}; stopped without saving it (the last checkpoint is from "
                    "before; check the vocabulary, LEARNING_RATE and the data)")
        return False


def actions(progress: t5x_trainer.BaseAction | None = None) -> dict:
    """t5x's ``train.actions`` (gin): ``progress``, then the non-finite-loss stop.

    Args:
      progress: the action that prints the progress lines
        (:class:`xlmeta_jax.interop.t5x.progress.ProgressAction`), run first so that
        the step with the non-finite loss has its line before the error's.
    """
    return {"TRAIN": [*([progress] if progress is not None else []), StopOnNonFiniteLoss()]}


install_error_handler()
