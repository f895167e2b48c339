"""The evaluation tasks: one :class:`~xlmeta_jax.evaluation.tasks.base.Task` object each.

``get(name)`` returns a task, ``names()`` lists them (each has its gin file
``gin/finetune/<name>.gin``). A task object knows its languages, labels, headline
metric, data (local files under DATA_DIR and, where a builder exists, TFDS), its
English selection set, the protocol notes of results.json's ``provenance``, and —
for a fine-tuned task — its head, features, scorer and selection metric; the fine-tune
loop (:mod:`xlmeta_jax.evaluation.finetune`) asks it rather than the task's name.

To add a task:

1. Create its object in the module of its kind (``classification.py``, ``qa.py``,
   ``tagging.py``, ``retrieval.py``) — an instance of that module's class, or of a
   subclass overriding what differs (where its files are, its TFDS builder, its scorer;
   see ``UDPOSTask`` in ``tagging.py``) — and add it to ``_TASKS`` below. A new kind of
   head subclasses :class:`~xlmeta_jax.evaluation.tasks.base.FineTunedTask` and adds
   its head to :data:`xlmeta_jax.evaluation.models.HEADS`.
2. Write ``gin/finetune/<name>.gin`` (``include 'finetune/base.gin'``,
   ``finetune.task = '<name>'`` and XTREME's recipe of the task).
3. List its local-data differences in docs/evaluation.md.
"""

from __future__ import annotations

from xlmeta_jax.evaluation.tasks import classification, qa, retrieval, tagging
from xlmeta_jax.evaluation.tasks.base import FineTunedTask, Task, TaskError

__all__ = ["FineTunedTask", "Task", "TaskError", "get", "names"]

_TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        classification.XNLI,
        classification.PAWSX,
        qa.TYDIQA,
        qa.XQUAD,
        qa.MLQA,
        tagging.PANX,
        tagging.UDPOS,
        retrieval.TATOEBA,
        retrieval.BUCC,
    )
}


def names() -> tuple[str, ...]:
    """Names of the registered tasks, in registry order."""
    return tuple(_TASKS)


def get(name: str) -> Task:
    """The registered task ``name``.

    Raises:
      TaskError: for an unknown name, listing the registered ones.
    """
    if name not in _TASKS:
        raise TaskError(f"unknown task {name!r}; expected one of {sorted(_TASKS)}")
    return _TASKS[name]
