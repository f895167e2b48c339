"""Every seqio Task and Mixture name the project registers, in one place.

Importing this module registers nothing and imports nothing heavy;
:func:`tasks.register` registers them.
"""

from xlmeta_jax.data.languages import XLMR_LANGUAGES, mc4_split_name, task_suffix

# Phase 1: English text files (Corpora.english_files; gin: ENGLISH_FILES).
ENGLISH_TEXT_TASK = "xlmeta_english_text"
# Phase 1: English from TFDS, e.g. Wikipedia or C4 (Corpora.english_tfds_name).
ENGLISH_TFDS_TASK = "xlmeta_english_tfds"
# Phase 2: CC-100, alpha-sampled over Corpora.languages (gin: CC100_DIR, CC100_LANGUAGES).
CC100_MIXTURE = "xlmeta_cc100"
# Phase 2 alternative: mC4 through TFDS, alpha-sampled over Corpora.languages.
MC4_MIXTURE = "xlmeta_mc4"
# One-phase baseline with meta's data: the English task mixed into the multilingual mixture
# at Corpora.joint_english_share of the tokens (the experiment's `joint` arm).
JOINT_MIXTURE = "xlmeta_joint"
# Contrastive fine-tuning's rows (query, positive, hard negatives), in the encoder's ids
# (xlmeta_jax/evaluation/pair_task.py).
EMBEDDING_PAIRS_TASK = "xlmeta_embedding_pairs"


def cc100_task(lang: str) -> str:
    """Name of the CC-100 task of one language (e.g. ``xlmeta_cc100_zh_Hans``)."""
    return f"xlmeta_cc100_{task_suffix(lang)}"


def mc4_task(lang: str) -> str:
    """Name of the mC4 task of one language."""
    return f"xlmeta_mc4_{task_suffix(lang)}"


CC100_TASKS = {lang: cc100_task(lang) for lang in XLMR_LANGUAGES}
MC4_TASKS = {lang: mc4_task(lang) for lang in XLMR_LANGUAGES if mc4_split_name(lang)}
# The language of every per-language task.
LANGUAGE_OF_TASK = {
    task: lang for by_lang in (CC100_TASKS, MC4_TASKS) for lang, task in by_lang.items()
}


def base_name(name: str) -> str:
    """A registered name without its view suffix: ``xlmeta_cc100_fr.stage2`` -> ``xlmeta_cc100_fr``.

    A phase with languages, alpha or masking of its own reads its corpus registered once
    more under names ending in ``.{phase}`` (``tasks.register(views=...)``).
    """
    return name.partition(".")[0]
