"""Registers the MLM pretraining tasks and mixtures of a run's corpora (public seqio API).

:func:`register` validates the :class:`~xlmeta_jax.data.corpora.Corpora` settings,
checks every file (counted once, cached next to the data), computes the alpha
sampling rates and then adds, through ``seqio.TaskRegistry.add`` and
``seqio.MixtureRegistry.add``, one task per configured corpus and language and one
mixture per multilingual corpus (names in :mod:`tasks.names`). Every task yields
packed, masked blocks in the batch format of :mod:`xlmeta_jax.model.mlm`; call
``get_dataset`` with ``sequence_length={"inputs": L, "targets": L}``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence

import jax
import seqio
import tensorflow as tf

from xlmeta_jax.data import corpora as corpora_lib
from xlmeta_jax.data import prepared, preprocessors, providers, rates, text_files, vocabulary
from xlmeta_jax.data import task_names as names
from xlmeta_jax.data.languages import mc4_split_name
from xlmeta_jax.model import mlm

log = logging.getLogger(__name__)

# What the last successful register() call registered: its settings (with its views)
# and providers.
_registered: tuple[tuple, dict[str, seqio.Task | seqio.Mixture]] | None = None
# A view's suffix: '.' and a phase name (seqio task names allow '.' and word characters).
_VIEW_SUFFIX = re.compile(r"\.\w+")


def _output_features(vocab, packed: bool = False) -> dict[str, seqio.Feature]:
    # Non-token features still need a vocabulary object in seqio.
    aux = seqio.PassThroughVocabulary(size=0)
    packed = {name: seqio.Feature(aux, add_eos=False, dtype=tf.int32)
              for name in mlm.PACKED_FEATURES} if packed else {}
    return {
        **packed,
        "inputs": seqio.Feature(vocab, add_eos=False, dtype=tf.int32),
        "targets": seqio.Feature(vocab, add_eos=False, dtype=tf.int32),
        "weights": seqio.Feature(aux, add_eos=False, dtype=tf.float32),
        "mlm_positions": seqio.Feature(aux, add_eos=False, dtype=tf.int32),
        "mlm_targets": seqio.Feature(vocab, add_eos=False, dtype=tf.int32),
        "mlm_weights": seqio.Feature(aux, add_eos=False, dtype=tf.float32),
    }


@dataclasses.dataclass
class _Plan:
    """Everything register() adds, built and checked before the registry is touched."""

    corpora: corpora_lib.Corpora
    output_features: dict
    # Strings -> token-id lists with the run's vocabulary (n_l in tokens).
    encode: object = None
    # Whether files without cached or prepared counts are counted: on one process only
    # (a pod's hosts would each count the whole corpus and write the same files).
    may_count: bool = True
    # Appended to every name this plan registers (a phase's own view: '.stage2').
    suffix: str = ""
    tasks: dict = dataclasses.field(default_factory=dict)  # name -> TaskRegistry.add kwargs
    mixtures: dict = dataclasses.field(default_factory=dict)  # name -> [(task, rate)]

    def has_task(self, name) -> bool:
        return name + self.suffix in self.tasks

    def has_mixture(self, name) -> bool:
        return name + self.suffix in self.mixtures

    def add_task(self, name, source, *, shuffle_buffer_size, language=None):
        name += self.suffix
        steps = [
            functools.partial(preprocessors.tokenize_documents,
                              eos_after=self.corpora.eos_after),
            # Offline caches (xlmeta_jax.tools.caching or seqio's cache_tasks_main) hold tokens.
            seqio.CacheDatasetPlaceholder(),
            (preprocessors.pack_documents if self.corpora.packed
             else preprocessors.pack_blocks),
            functools.partial(
                preprocessors.mlm_mask,
                salt=preprocessors.task_salt(name),
                masking=self.corpora.masking,
            ),
        ]
        if language is not None:
            steps.append(functools.partial(preprocessors.add_language, language=language))
        self.tasks[name] = dict(
            source=source,
            output_features=self.output_features,
            preprocessors=steps,
            shuffle_buffer_size=int(shuffle_buffer_size),
        )

    def add_mixture(self, name, task_by_lang, counts, alpha):
        name += self.suffix
        task_by_lang = {lang: task + self.suffix for lang, task in task_by_lang.items()}
        probs = rates.alpha_probabilities(counts, alpha)
        log.info("%s: alpha=%s, mask rate %s, sampling probabilities %s", name, alpha,
                 self.corpora.masking.rate, {k: round(v, 5) for k, v in probs.items()})
        self.mixtures[name] = [(task_by_lang[lang], q) for lang, q in probs.items()]
        # Each language holds blocks in proportion to how often it is drawn: the blocks a
        # batch takes from any language then come from a window shuffle_buffer_size / batch
        # times larger than what it takes (with an equal split, a frequent language's
        # share of a batch would be a run of neighbouring blocks).
        for lang, q in probs.items():
            self.tasks[task_by_lang[lang]]["shuffle_buffer_size"] = _language_buffer(
                self.corpora, q)


def _english_text(plan: _Plan) -> None:
    c = plan.corpora
    splits = {"train": c.english_files, "validation": c.english_validation_files}
    files_by_split = {}
    for split, patterns in splits.items():
        patterns = corpora_lib.as_patterns(patterns)
        if patterns:
            files = text_files.list_text_files(patterns, what=f"english_files ({split})")
            stats = corpora_lib.checked_files(c, files, may_count=plan.may_count,
                                              needs_counts=False)
            if split == "train":
                corpora_lib.check_shares("ENGLISH_FILES", stats, jax.process_count())
            files_by_split[split] = providers.TextFiles(tuple(files), int(c.max_line_bytes))
    if files_by_split:
        plan.add_task(
            names.ENGLISH_TEXT_TASK,
            providers.TextLineDocumentsSource(files_by_split),
            shuffle_buffer_size=c.shuffle_buffer_size,
            language="en",
        )


def _tfds(c: corpora_lib.Corpora, name: str, splits: dict) -> seqio.TfdsDataSource:
    return seqio.TfdsDataSource(tfds_name=name, tfds_data_dir=c.tfds_data_dir, splits=splits)


def _english_tfds(plan: _Plan) -> None:
    c = plan.corpora
    if not c.english_tfds_name:
        return
    splits = {"train": c.english_tfds_train_split}
    if c.english_tfds_validation_split:
        splits["validation"] = c.english_tfds_validation_split
    source = _tfds(c, c.english_tfds_name, splits)
    plan.add_task(
        names.ENGLISH_TFDS_TASK,
        providers.TfdsDocumentsSource(source, c.english_tfds_text_feature),
        shuffle_buffer_size=c.shuffle_buffer_size,
        language="en",
    )


def _language_buffer(c: corpora_lib.Corpora, probability: float) -> int:
    """Blocks a language of a mixture holds for shuffling: its share of the buffer."""
    return max(16, math.ceil(int(c.shuffle_buffer_size) * probability))


def _cc100(plan: _Plan) -> None:
    c = plan.corpora
    if not c.cc100_dir:
        return
    langs = c.cc100_languages()
    counts = {}
    for lang in langs:
        files_by_split = {}
        for split, folder in (("train", c.cc100_dir), ("validation", c.cc100_validation_dir)):
            if folder:
                files = corpora_lib.cc100_files(folder, lang)
                needs_counts = split == "train" and c.cc100_counts is None
                stats = corpora_lib.checked_files(c, files, may_count=plan.may_count,
                                                  needs_counts=needs_counts)
                if split == "train":
                    corpora_lib.check_shares(f"CC-100 language {lang!r} ({folder})", stats,
                                             jax.process_count())
                if needs_counts:
                    counts[lang] = corpora_lib.language_count(c, stats, plan.encode,
                                                              folder=folder, lang=lang)
                files_by_split[split] = providers.TextFiles(tuple(files), int(c.max_line_bytes))
        plan.add_task(
            names.cc100_task(lang),
            providers.TextLineDocumentsSource(files_by_split),
            shuffle_buffer_size=16,  # set from the rates by add_mixture
            language=lang,
        )
    if c.cc100_counts is not None:
        counts = rates.given_counts(c.cc100_counts, langs, what="cc100_counts")
    plan.add_mixture(names.CC100_MIXTURE, names.CC100_TASKS, counts, c.alpha)


def _mc4(plan: _Plan) -> None:
    c = plan.corpora
    if not c.mc4_tfds_name:
        return
    langs = c.mc4_languages()
    counts = {}
    for lang in langs:
        split = mc4_split_name(lang)
        source = _tfds(c, c.mc4_tfds_name, {"train": split, "validation": f"{split}-validation"})
        if c.mc4_counts is None:
            try:
                counts[lang] = source.num_input_examples("train")
            except Exception as e:  # noqa: BLE001 - TFDS raises several kinds here
                raise text_files.CorpusError(
                    f"mC4 split {split!r} (language {lang!r}) is not available in "
                    f"{c.mc4_tfds_name} at {c.tfds_data_dir or 'the default TFDS folder'}: {e}"
                ) from e
        plan.add_task(
            names.mc4_task(lang),
            providers.TfdsDocumentsSource(source, "text"),
            shuffle_buffer_size=16,  # set from the rates by add_mixture
            language=lang,
        )
    if c.mc4_counts is not None:
        counts = rates.given_counts(c.mc4_counts, langs, what="mc4_counts")
    plan.add_mixture(names.MC4_MIXTURE, names.MC4_TASKS, counts, c.alpha)


def _joint(plan: _Plan) -> None:
    """English mixed into the multilingual mixture at ``joint_english_share`` of the tokens.

    Every block of every task is ``sequence_length`` tokens, so shares of blocks (seqio's
    rates) are shares of tokens; within the multilingual part the languages keep their
    alpha rates (seqio's sub-mixture rule).
    """
    share = plan.corpora.joint_english_share
    if share is None:
        return
    english = [t for t in (names.ENGLISH_TEXT_TASK, names.ENGLISH_TFDS_TASK) if plan.has_task(t)]
    xling = [m for m in (names.CC100_MIXTURE, names.MC4_MIXTURE) if plan.has_mixture(m)]
    if len(english) != 1 or len(xling) != 1:
        raise text_files.CorpusError(
            f"joint_english_share={share} needs exactly one English corpus and one "
            f"multilingual corpus configured; got {english or 'no English'} and "
            f"{xling or 'no multilingual mixture'}"
        )
    plan.mixtures[names.JOINT_MIXTURE + plan.suffix] = [
        (english[0] + plan.suffix, share), (xling[0] + plan.suffix, 1.0 - share)]


def _still_registered(providers_by_name) -> bool:
    for name, provider in providers_by_name.items():
        registry = seqio.TaskRegistry if isinstance(provider, seqio.Task) else seqio.MixtureRegistry
        if name not in registry.names() or registry.get(name) is not provider:
            return False
    return True


def register(
    corpora: corpora_lib.Corpora | None = None, /, *,
    views: Mapping[str, corpora_lib.Corpora] | None = None, **settings
) -> tuple[str, ...]:
    """Registers the seqio tasks and mixtures of the configured corpora; returns their names.

    Call it once the configuration is known (the trainer calls it after parsing
    gin); then ``seqio.get_mixture_or_task(name)`` serves the data, as from t5x or
    a notebook. Only configured corpora are registered: English text files
    (``xlmeta_english_text``), English TFDS (``xlmeta_english_tfds``), CC-100
    (``xlmeta_cc100_{lang}`` and the mixture ``xlmeta_cc100``), mC4 (``xlmeta_mc4_*``),
    and with ``joint_english_share`` the English task mixed into the multilingual mixture
    (``xlmeta_joint``). Language mixture rates are the alpha-sampling probabilities
    ``q_l ∝ n_l^alpha``, from the given or counted (cached) n_l.

    ``views`` registers other settings beside them, each under names of its own: the
    tasks and mixtures of ``views[suffix]`` are named as above with ``suffix`` appended
    (a staged curriculum's phase ``stage2`` reads ``xlmeta_cc100.stage2``, with its own
    languages, alpha and masking; :meth:`Phase.source
    <xlmeta_jax.pretrain.phases.Phase.source>`).

    Calling it again with the same settings does nothing; with other settings it
    replaces every registration of the previous call (``TaskRegistry.remove`` /
    ``MixtureRegistry.remove``). Nothing is changed when the settings are invalid.

    Args:
      corpora: the settings (:class:`xlmeta_jax.data.corpora.Corpora`); default: none.
      views: suffix (``'.{phase}'``) -> settings registered under names ending in it.
      **settings: fields of ``Corpora`` (override those of ``corpora``), e.g.
        ``vocab_path=..., english_files=[...], cc100_dir=..., languages=[...], alpha=0.3``.

    Returns:
      The registered task and mixture names.

    Raises:
      VocabularyError: no or a bad vocabulary.
      CorpusError: missing or unreadable files, bad languages or alpha.
    """
    global _registered
    base = corpora if corpora is not None else corpora_lib.Corpora()
    try:
        c = dataclasses.replace(base, **settings)
    except TypeError as e:
        raise TypeError(f"tasks.register: {e} (see xlmeta_jax.data.corpora.Corpora)") from None
    views = dict(views or {})
    key = (c, tuple(sorted(views.items(), key=lambda kv: kv[0])))
    if _registered is not None and _registered[0] == key and _still_registered(_registered[1]):
        return tuple(_registered[1])
    for suffix in views:
        if not suffix or not _VIEW_SUFFIX.fullmatch(suffix):
            raise ValueError(f"tasks.register: view suffix {suffix!r} is not '.' and a word")
    # The settings were checked when built (Corpora); the files next, and the registry is
    # touched only at the end.
    vocab = vocabulary.load_vocabulary(c.vocab_path)
    plans = [_Plan(settings_, _output_features(vocab, settings_.packed),
                   encode=vocab.encode_batch,
                   may_count=jax.process_count() == 1, suffix=suffix)
             for suffix, settings_ in (("", c), *views.items())]
    for plan in plans:
        for add in (_english_text, _english_tfds, _cc100, _mc4, _joint):
            add(plan)
    new_tasks = {k: v for plan in plans for k, v in plan.tasks.items()}
    new_mixtures = {k: v for plan in plans for k, v in plan.mixtures.items()}
    previous = dict(_registered[1]) if _registered is not None else {}
    for name in set(previous) | set(new_tasks) | set(new_mixtures):
        seqio.MixtureRegistry.remove(name)
        seqio.TaskRegistry.remove(name)
    added: dict[str, seqio.Task | seqio.Mixture] = {}
    for name, kwargs in new_tasks.items():
        added[name] = seqio.TaskRegistry.add(name, **kwargs)
    for name, tasks_and_rates in new_mixtures.items():
        added[name] = seqio.MixtureRegistry.add(name, tasks_and_rates)
    _registered = (key, added)
    if not added:
        log.info("tasks.register: no corpus configured, nothing registered")
    return tuple(added)


# The setting that registers each task or mixture, for the error naming it.
_SETTING = {
    names.ENGLISH_TEXT_TASK: "ENGLISH_FILES (Corpora.english_files; gin/data/english_files.gin)",
    names.ENGLISH_TFDS_TASK: "ENGLISH_TFDS_NAME (Corpora.english_tfds_name; "
    "gin/data/english_tfds.gin)",
    names.CC100_MIXTURE: "CC100_DIR (Corpora.cc100_dir; gin/data/cc100.gin)",
    names.MC4_MIXTURE: "Corpora.mc4_tfds_name (gin/data/mc4.gin)",
}


# The settings of each corpus, unset in reading(name, ...) for the corpora name does not read.
_CORPUS_SETTINGS = {
    names.ENGLISH_TEXT_TASK: {"english_files": None, "english_validation_files": None},
    names.ENGLISH_TFDS_TASK: {"english_tfds_name": None},
    names.CC100_MIXTURE: {"cc100_dir": None, "cc100_validation_dir": None},
    names.MC4_MIXTURE: {"mc4_tfds_name": None},
}


def reading(name: str, corpora: corpora_lib.Corpora) -> corpora_lib.Corpora:
    """``corpora`` with only the corpora the task or mixture ``name`` reads still set.

    What one run registers when it trains on one task (a phase of meta-pretraining under
    t5x): its own files are checked and counted, another phase's are not needed yet.
    The joint mixture reads English and the multilingual corpus; an unknown name gets
    ``corpora`` unchanged (:func:`check_registered` then names what registers it).
    """
    if name == names.JOINT_MIXTURE:
        return corpora
    own = next((k for k in _CORPUS_SETTINGS if name == k or name.startswith(k + "_")), None)
    if own is None:
        return corpora
    unset = {"joint_english_share": None}
    for corpus, settings in _CORPUS_SETTINGS.items():
        if corpus != own:
            unset.update(settings)
    return dataclasses.replace(corpora, **unset)


def check_registered(name: str, registered: Sequence[str]) -> str:
    """``name`` if it is among the ``registered`` names :func:`register` returned.

    Raises:
      CorpusError: naming the setting that registers ``name`` when it is missing.
    """
    if name not in registered:
        base = names.base_name(name)
        hint = next(
            (v for k, v in _SETTING.items() if base == k or base.startswith(k + "_")), None
        )
        if hint:  # the corpus's setting is empty or unset
            raise text_files.CorpusError(f"{name} has no corpus configured: set {hint}")
        shown = sorted(registered)
        listed = ", ".join(shown[:8]) + (f", ... ({len(shown)} in all)" if len(shown) > 8 else "")
        raise text_files.CorpusError(
            f"{name} is not registered by the configured corpora (registered: "
            f"{listed or 'none'})"
        )
    return name


def registered_corpora() -> corpora_lib.Corpora | None:
    """The settings of the last successful :func:`register` call (None before one)."""
    return None if _registered is None else _registered[0][0]


# The info.{split}.json keys of an offline token cache that say where its </s> are
# (caches without it hold documents with one </s> each) and which vocabulary made it.
CACHE_EOS_KEY = "xlmeta_eos_after"
CACHE_VOCAB_KEY = "xlmeta_vocabulary"


def vocabulary_record(vocab_path: str) -> dict:
    """What a token cache records of the vocabulary it was tokenized with: the MD5 of the
    ``.model`` file, or of a tokenizer folder's files (name and bytes, in name order)."""
    digest = hashlib.md5()
    if tf.io.gfile.isdir(vocab_path) or vocab_path.endswith(".json"):
        for name, data in sorted(vocabulary.load_vocabulary(vocab_path).hf.files.items()):
            digest.update(name.encode() + b"\0" + data)
    else:
        with tf.io.gfile.GFile(vocab_path, "rb") as f:
            digest.update(f.read())
    return {"path": vocab_path, "md5": digest.hexdigest()}


def check_cache(task_or_mixture: str, split: str) -> None:
    """Checks, before any reading, the offline token caches a run with use_cached reads.

    Every task of ``task_or_mixture`` needs a complete cache (seqio's own check is an
    ``AssertionError`` naming the task only), tokenized with this run's ``</s>`` convention and
    vocabulary: seqio reads a cache in place of the steps before the task's
    ``CacheDatasetPlaceholder``, so another convention or vocabulary would silently
    train on other tokens. A prepared CC-100 folder's cache (``CC100_DIR/cache``, from
    ``python -m xlmeta_jax.data.prepare --tokenize``) is found without a cache_dir.

    Raises:
      CorpusError: naming the task or cache folder and what is wrong.
    """
    corpora = registered_corpora()
    if corpora is not None and corpora.cc100_dir:
        cache = prepared.cache_dir(corpora.cc100_dir)
        if cache:
            seqio.add_global_cache_dirs([cache])
    vocab = None
    for task in seqio.get_subtasks(seqio.get_mixture_or_task(task_or_mixture)):
        if not task.supports_caching:
            continue
        if not task.cache_dir:
            where = ", ".join(seqio.get_global_cache_dirs()) or "no cache folder"
            raise text_files.CorpusError(
                f"{task.name} has no complete token cache (searched: {where}): write it with "
                "python -m xlmeta_jax.data.prepare --tokenize (CC-100) or python -m "
                "xlmeta_jax.tools.caching, name its folder with make_mlm_iterator.cache_dir, "
                "or read the task without it (use_cached=False)")
        path = seqio.utils.get_cached_info_path(task.cache_dir, split)
        if corpora is None or not tf.io.gfile.exists(path):
            continue
        with tf.io.gfile.GFile(path) as f:
            info = json.load(f)
        cached = info.get(CACHE_EOS_KEY, "document")
        if cached != corpora.eos_after:
            raise text_files.CorpusError(
                f"the token cache {task.cache_dir} puts </s> after each {cached}, this run "
                f"after each {corpora.eos_after} (Corpora.eos_after): rebuild the cache with "
                "python -m xlmeta_jax.tools.caching --overwrite, or set "
                f"xlmeta_jax.data.corpora.Corpora.eos_after='{cached}'"
            )
        made_with = info.get(CACHE_VOCAB_KEY)
        if made_with and corpora.vocab_path:
            vocab = vocab or vocabulary_record(corpora.vocab_path)
            if made_with["md5"] != vocab["md5"]:
                raise text_files.CorpusError(
                    f"the token cache {task.cache_dir} was tokenized with the vocabulary "
                    f"{made_with['path']}, this run's VOCAB_PATH {corpora.vocab_path} is "
                    "another (md5 differs): rebuild the cache with this vocabulary, or train "
                    "with the cache's")


def language_probabilities(mixture_name: str) -> dict[str, float]:
    """q_l per language of a registered language mixture, from its seqio rates."""
    mixture = seqio.get_mixture_or_task(mixture_name)
    total = mixture.total_rate
    return {names.LANGUAGE_OF_TASK[names.base_name(t.name)]: mixture.get_rate(t) / total
            for t in mixture.tasks}
