"""The Task interface: everything the evaluation knows about one benchmark.

A :class:`Task` names its languages, headline metric and labels, says where its data
comes from and how that differs from XTREME's protocol (``provenance`` of every
results.json). A :class:`FineTunedTask` also reads its English training, selection and
evaluation sets (local files or TFDS), turns examples into features, scores a model's
outputs and names the score that selects the checkpoint; its ``head`` names the
:data:`xlmeta_jax.evaluation.models.HEADS` entry it trains. A retrieval task
(:mod:`xlmeta_jax.evaluation.tasks.retrieval`) fine-tunes nothing and runs its own
evaluation.
"""

from __future__ import annotations

import abc
import dataclasses
import pathlib
from collections.abc import Sequence
from typing import Any, ClassVar

from xlmeta_jax import errors
from xlmeta_jax.evaluation import readers
from xlmeta_jax.evaluation.settings import FineTuneSettings
from xlmeta_jax.evaluation.tokenization import Tokenizer

# Settings whose non-default values make a run a demo or subsample, not XTREME's recipe.
FINE_TUNE_SUBSAMPLING = ("max_train_examples", "max_eval_examples", "train_steps")
# Retrieval fine-tunes nothing: of those settings only the evaluated sentences apply to it.
RETRIEVAL_SUBSAMPLING = ("max_eval_examples",)


class TaskError(errors.UserError, ValueError):
    """An unknown task or language, or data a task cannot use (one line)."""


@dataclasses.dataclass(frozen=True)
class Task(abc.ABC):
    """What a benchmark is, where its data comes from, and how it is scored."""

    # Registry name (also the gin file gin/finetune/<name>.gin and results.json's "task").
    name: str
    # Languages evaluated by default (all that the local data holds).
    languages: tuple[str, ...]
    # Key of the headline metric in the per-language scores.
    metric: str
    # Label names (classification / tagging).
    labels: tuple[str, ...] = ()
    # Local data: (training data, selection data, evaluation data) as told in provenance.
    local_data: tuple[str | None, str | None, str] = (None, None, "")
    # Why a local-data number is not XTREME's number (docs/evaluation.md lists the same).
    local_differences: tuple[str, ...] = ()
    # How the metric is defined where the versions of XTREME's scorers disagree.
    scoring: str | None = None
    # Languages with a TFDS config; empty: the task has no TFDS source.
    tfds_languages: tuple[str, ...] = ()

    # True when the task fine-tunes a head (False: retrieval, run by `evaluate`).
    fine_tunes: ClassVar[bool] = True
    # Settings that, when set, make the run a subsample (named in provenance).
    subsampling: ClassVar[tuple[str, ...]] = FINE_TUNE_SUBSAMPLING
    # Provenance of TFDS runs: the selection and evaluation data.
    tfds_select_data: ClassVar[str | None] = None
    tfds_eval_data: ClassVar[str] = "each language's test split (TFDS)"

    def check_languages(self, languages: Sequence[str] | None) -> tuple[str, ...]:
        """Requested languages checked against the task's (None: all of them).

        Raises:
          TaskError: a string instead of a list, an unknown language or an empty list.
        """
        if languages is None:
            return self.languages
        if isinstance(languages, str):
            raise TaskError(f"{self.name}: languages must be a list of codes, got the string "
                            f"{languages!r}")
        unknown = [lang for lang in languages if lang not in self.languages]
        if unknown:
            raise TaskError(f"{self.name}: unknown language(s) {unknown}; available: "
                            f"{list(self.languages)}")
        if not languages:
            raise TaskError(f"{self.name}: empty language list")
        return tuple(languages)

    def check_tfds(self, lang: str | None = None) -> None:
        """Raises TaskError for a task or language without a TFDS builder here."""
        if not self.tfds_languages:
            raise TaskError(f"task {self.name!r} has no TFDS source; use the local files "
                            "(data_source='local')")
        if lang is not None and lang not in self.tfds_languages:
            raise TaskError(f"{self.name}: language {lang!r} has no TFDS config; available: "
                            f"{list(self.tfds_languages)}")

    def provenance(self, data_source: str, data_dir: str | None, settings: dict,
                   train_examples: int | None) -> dict[str, Any]:
        """The ``provenance`` entry of a results.json.

        Args:
          data_source: "local" or "tfds".
          data_dir: the data folder read (recorded as is).
          settings: the run's settings (``dataclasses.asdict`` of FineTuneSettings).
          train_examples: English training examples read (None: no fine-tuning).

        Returns:
          Data source, training / selection / evaluation data, scoring, and
          ``comparable_to_xtreme`` with the ``differences`` that make it not so.
        """
        differences: list[str] = []
        if data_source == "local":
            train, select, evaluate = self.local_data
            differences += self.local_differences
        else:
            train = "English training split (TFDS)"
            select = self.tfds_select_data
            evaluate = self.tfds_eval_data
        for key in self.subsampling:
            if settings.get(key) is not None:
                differences.append(f"{key}={settings[key]} (a subsample / demo run)")
        return {
            "data_source": data_source,
            "data_dir": data_dir,
            "train_data": train,
            "train_examples": train_examples,
            "selection_data": select,
            "eval_data": evaluate,
            "scoring": self.scoring,
            "comparable_to_xtreme": not differences,
            "differences": differences,
        }


@dataclasses.dataclass(frozen=True)
class FineTunedTask(Task):
    """A task fine-tuned on English with a head, then evaluated zero-shot per language.

    Local readers take ``train_fraction`` / ``select_fraction`` (see
    :func:`xlmeta_jax.evaluation.splits.dev_split`); tasks with separate files ignore them.
    """

    # Head of xlmeta_jax.evaluation.models.HEADS trained on the encoder.
    head: ClassVar[str]
    # Key of the English-dev score that selects the checkpoint (XTREME's).
    selection_metric: ClassVar[str] = "f1"
    # Learning-rate schedule offset (1: run_tag.py steps its scheduler before the optimizer).
    schedule_offset: ClassVar[int] = 0

    @property
    def num_labels(self) -> int:
        """Outputs of the head (at least 2)."""
        return max(len(self.labels), 2)

    # -- local files ----------------------------------------------------------------------

    def load_train(self, data_dir=None, *, train_fraction: float = 0.5,
                   select_fraction: float = 0.1) -> list:
        """English training examples from the local data.

        Args:
          data_dir: folder laid out like ``../shared/data`` (default: that folder).
          train_fraction, select_fraction: split of dev-only data (see class docstring).
        """
        return self._local_train(readers.resolve_data_dir(data_dir), train_fraction,
                                 select_fraction)

    def load_select(self, data_dir=None, *, train_fraction: float = 0.5,
                    select_fraction: float = 0.1) -> list | None:
        """English development examples on which XTREME selects the best checkpoint.

        None where XTREME keeps the final parameters (QA) and where there is no
        selection data (``select_fraction`` 0). Never an example that
        :meth:`load_eval` returns for any language.
        """
        return self._local_select(readers.resolve_data_dir(data_dir), train_fraction,
                                  select_fraction)

    def load_eval(self, lang: str, data_dir=None, *, train_fraction: float = 0.5,
                  select_fraction: float = 0.1) -> list:
        """Evaluation examples in language ``lang`` from the local data."""
        self.check_languages([lang])
        return self._local_eval(lang, readers.resolve_data_dir(data_dir), train_fraction,
                                select_fraction)

    @abc.abstractmethod
    def _local_train(self, data_dir: pathlib.Path, train_fraction: float,
                     select_fraction: float) -> list: ...

    @abc.abstractmethod
    def _local_select(self, data_dir: pathlib.Path, train_fraction: float,
                      select_fraction: float) -> list | None: ...

    @abc.abstractmethod
    def _local_eval(self, lang: str, data_dir: pathlib.Path, train_fraction: float,
                    select_fraction: float) -> list: ...

    # -- TFDS -----------------------------------------------------------------------------

    def tfds_train(self, tfds_data_dir=None) -> list:
        """English training examples from TFDS (see :mod:`..tfds_readers`)."""
        self.check_tfds()
        return self._tfds_train(tfds_data_dir)

    def tfds_select(self, tfds_data_dir=None) -> list | None:
        """English validation examples for the best-checkpoint selection (None: none)."""
        self.check_tfds()
        return self._tfds_select(tfds_data_dir)

    def tfds_eval(self, lang: str, tfds_data_dir=None) -> list:
        """Evaluation examples in ``lang`` from TFDS."""
        self.check_tfds(lang)
        return self._tfds_eval(lang, tfds_data_dir)

    def _tfds_train(self, tfds_data_dir) -> list:
        raise TaskError(f"task {self.name!r} has no TFDS source")

    def _tfds_select(self, tfds_data_dir) -> list | None:
        return None

    def _tfds_eval(self, lang: str, tfds_data_dir) -> list:
        raise TaskError(f"task {self.name!r} has no TFDS source")

    # -- model side -----------------------------------------------------------------------

    @abc.abstractmethod
    def features(self, examples: list, tokenizer: Tokenizer, settings: FineTuneSettings):
        """Model inputs of ``examples`` (a dict of arrays, or an object with ``arrays()``)."""

    @abc.abstractmethod
    def score(self, lang: str, examples: list, feats, outputs,
              settings: FineTuneSettings) -> tuple[dict[str, float], dict | None]:
        """Scores of the head's ``outputs`` on ``examples`` of ``lang``.

        Returns:
          (scores by metric, predictions to save or None).
        """

    def selection_score(self, scores: dict[str, float]) -> float:
        """The English-dev score that selects the checkpoint (higher is better)."""
        return scores[self.selection_metric]

