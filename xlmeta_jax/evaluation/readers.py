"""Readers of the evaluation data in its original formats, and the task registry.

The local layout is that of ``../shared/data`` (each subfolder has a README naming its
source): SQuAD v1.1 JSON for TyDi QA GoldP, XQuAD and MLQA; XTREME TSV for XNLI and
PAWS-X; CoNLL-style ``token<TAB>tag`` for PAN-X; CoNLL-U for UD POS; line-aligned text
for Tatoeba; ``id<TAB>sentence`` files for BUCC.

Splits when only labelled dev data exists (XNLI, PAWS-X): the dev files are parallel
(line i of every language is a translation of line i of English). Lines are first joined
into groups of pairs that share a sentence word for word in any language (XNLI: the
three hypotheses of a premise; PAWS-X: 411 of the second half's 1000 English pairs
share a sentence with the first half, and translations add a few more), and the split
runs between groups: the first ``train_fraction`` of the lines
(whole groups) trains, the last ``select_fraction`` of that part is held out as the
English development set for model selection, and every language is evaluated on the
remaining groups only — no evaluation sentence, nor its translation, is in the training
data. :func:`xlmeta_jax.evaluation.splits.pair_groups` computes the groups.

QA has no English training data for XQuAD / MLQA here: all three QA tasks fine-tune on
TyDi QA GoldP's English training set (3696 questions).

UD POS: the English-EWT dev set trains, the English-EWT test set is the English
development set for model selection, and the 19 parallel PUD test sets (ar cs de en es fi
fr hi id is it ko pl pt ru sv th tr zh) are evaluated, every language's sentences put in
English-PUD's order by ``# sent_id`` (Icelandic lists them sorted by id), so that the
first N sentences are the same sentences in every language. The XTREME
``xtreme_udpos/test-*.tsv`` export is not used (it was corrupt);
:func:`read_token_tag_tsv` rejects such files with the line number.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from collections.abc import Sequence

from xlmeta_jax.evaluation import splits

# Default location of the shared data: $XLMETA_SHARED_DATA, else ../shared/data next to
# the repository root.
DEFAULT_DATA_DIR = pathlib.Path(
    os.environ.get(
        "XLMETA_SHARED_DATA",
        pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data",
    )
)


# ----------------------------------------------------------------------------------------
# Example types
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ClassificationExample:
    """A sentence pair with a label index."""

    id: str
    text_a: str
    text_b: str
    label: int


@dataclasses.dataclass(frozen=True)
class QAExample:
    """An extractive QA question with its context and gold answers."""

    id: str
    question: str
    context: str
    # Gold answer texts (several for dev sets with multiple annotations).
    answers: tuple[str, ...]
    # Character offset of each answer in `context`.
    answer_starts: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TaggingExample:
    """A sentence as words with one tag per word."""

    id: str
    tokens: tuple[str, ...]
    tags: tuple[str, ...]


# ----------------------------------------------------------------------------------------
# Task registry
# ----------------------------------------------------------------------------------------

XNLI_LABELS = ("entailment", "neutral", "contradiction")
PAWSX_LABELS = ("0", "1")
PANX_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")
UPOS_LABELS = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON",
    "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X",
)

TYDIQA_FOLDERS = {
    "ar": "arabic", "bn": "bengali", "en": "english", "fi": "finnish", "id": "indonesian",
    "ko": "korean", "ru": "russian", "sw": "swahili", "te": "telugu",
}
# English training (EWT dev) and model-selection (EWT test) treebanks of UD POS.
UD_TRAIN_FILE = "UD_English-EWT/en_ewt-ud-dev.conllu"
UD_SELECT_FILE = "UD_English-EWT/en_ewt-ud-test.conllu"
# The 19 parallel PUD test treebanks: language -> folder name.
UD_PUD = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
    "fi": "Finnish", "fr": "French", "hi": "Hindi", "id": "Indonesian", "is": "Icelandic",
    "it": "Italian", "ko": "Korean", "pl": "Polish", "pt": "Portuguese", "ru": "Russian",
    "sv": "Swedish", "th": "Thai", "tr": "Turkish", "zh": "Chinese",
}
UD_TEST_FILES = {
    lang: f"UD_{name}-PUD/{lang}_pud-ud-test.conllu" for lang, name in UD_PUD.items()
}
PANX_LANGUAGES = tuple(
    "af ar az bg bn de el en es et eu fa fi fr gu he hi hu id it ja jv ka kk ko lt ml mr ms "
    "my nl pa pl pt qu ro ru sw ta te tl tr uk ur vi yo zh".split()
)
# XTREME's 36 Tatoeba languages: ISO 639-1 -> LASER file code (ISO 639-3).
TATOEBA_CODES = {
    "af": "afr", "ar": "ara", "bg": "bul", "bn": "ben", "de": "deu", "el": "ell", "es": "spa",
    "et": "est", "eu": "eus", "fa": "pes", "fi": "fin", "fr": "fra", "he": "heb", "hi": "hin",
    "hu": "hun", "id": "ind", "it": "ita", "ja": "jpn", "jv": "jav", "ka": "kat", "kk": "kaz",
    "ko": "kor", "ml": "mal", "mr": "mar", "nl": "nld", "pt": "por", "ru": "rus", "sw": "swh",
    "ta": "tam", "te": "tel", "th": "tha", "tl": "tgl", "tr": "tur", "ur": "urd", "vi": "vie",
    "zh": "cmn",
}


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What a benchmark is and how it is scored."""

    name: str
    # "classification", "qa", "tagging" or "retrieval".
    kind: str
    # Languages evaluated by default (all that the local data holds).
    languages: tuple[str, ...]
    # Key of the headline metric in the per-language scores.
    metric: str
    # Label names (classification / tagging).
    labels: tuple[str, ...] = ()
    # QA answer normalisation: "squad" or "mlqa".
    qa_normalization: str = "squad"


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec("xnli", "classification",
                 tuple("ar bg de el en es fr hi ru sw th tr ur vi zh".split()), "accuracy",
                 XNLI_LABELS),
        TaskSpec("pawsx", "classification", tuple("de en es fr ja ko zh".split()), "accuracy",
                 PAWSX_LABELS),
        TaskSpec("tydiqa", "qa", tuple(TYDIQA_FOLDERS), "f1"),
        TaskSpec("xquad", "qa", tuple("ar de el en es hi ro ru th tr vi zh".split()), "f1"),
        TaskSpec("mlqa", "qa", tuple("ar de en es hi vi zh".split()), "f1",
                 qa_normalization="mlqa"),
        TaskSpec("panx", "tagging", PANX_LANGUAGES, "f1", PANX_LABELS),
        # XTREME scores UD-POS with seqeval's F1 over the tag sequence (evaluate.py).
        TaskSpec("udpos", "tagging", tuple(UD_TEST_FILES), "f1", UPOS_LABELS),
        TaskSpec("tatoeba", "retrieval", tuple(TATOEBA_CODES), "accuracy"),
        TaskSpec("bucc", "retrieval", ("zh",), "f1"),
    )
}


def get_task(name: str) -> TaskSpec:
    """The registered task ``name``; a clear error for an unknown one."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of {sorted(TASKS)}")
    return TASKS[name]


def check_languages(task: str, languages: Sequence[str] | None) -> tuple[str, ...]:
    """Validates requested languages against the task's (None -> all of them)."""
    spec = get_task(task)
    if languages is None:
        return spec.languages
    if isinstance(languages, str):
        raise ValueError(f"{task}: languages must be a list of codes, got the string {languages!r}")
    unknown = [lang for lang in languages if lang not in spec.languages]
    if unknown:
        raise ValueError(
            f"{task}: unknown language(s) {unknown}; available: {list(spec.languages)}"
        )
    if not languages:
        raise ValueError(f"{task}: empty language list")
    return tuple(languages)


# ----------------------------------------------------------------------------------------
# Format readers
# ----------------------------------------------------------------------------------------


def _require(path: pathlib.Path, what: str) -> pathlib.Path:
    if not path.is_file():
        raise FileNotFoundError(
            f"{what}: expected file {path} does not exist (is the data directory right? "
            f"see docs/evaluation.md for the layout)"
        )
    return path


def read_squad_json(path: str | os.PathLike) -> list[QAExample]:
    """Questions of a SQuAD v1.1 JSON file (``data/paragraphs/qas/answers``).

    Raises:
      ValueError: for a file that is not SQuAD-shaped or an answer whose
        ``answer_start`` does not point at its text in the context.
    """
    path = _require(pathlib.Path(path), "SQuAD-format QA data")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or "data" not in doc:
        raise ValueError(f"{path}: not SQuAD v1.1 JSON (no top-level 'data')")
    out = []
    for article in doc["data"]:
        for para in article["paragraphs"]:
            context = para["context"]
            for qa in para["qas"]:
                texts, starts = [], []
                for ans in qa["answers"]:
                    start = int(ans["answer_start"])
                    if context[start : start + len(ans["text"])] != ans["text"]:
                        raise ValueError(
                            f"{path}: question {qa['id']}: answer {ans['text']!r} is not at "
                            f"answer_start={start} of its context"
                        )
                    texts.append(ans["text"])
                    starts.append(start)
                if not texts:
                    raise ValueError(f"{path}: question {qa['id']} has no answer")
                out.append(
                    QAExample(str(qa["id"]), qa["question"], context, tuple(texts), tuple(starts))
                )
    if not out:
        raise ValueError(f"{path}: no questions")
    return out


def read_pair_tsv(
    path: str | os.PathLike, labels: Sequence[str], id_prefix: str = ""
) -> list[ClassificationExample]:
    """``sentence1<TAB>sentence2<TAB>label`` lines (XTREME's XNLI / PAWS-X files)."""
    path = _require(pathlib.Path(path), "sentence-pair data")
    index = {label: i for i, label in enumerate(labels)}
    out = []
    with open(path, encoding="utf-8", newline="") as f:
        for n, line in enumerate(f):
            line = line.rstrip("\r\n")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != 3:
                raise ValueError(
                    f"{path}:{n + 1}: expected 3 tab-separated fields, got {len(fields)}"
                )
            a, b, label = fields
            if label not in index:
                raise ValueError(
                    f"{path}:{n + 1}: unknown label {label!r}; expected {list(labels)}"
                )
            out.append(ClassificationExample(f"{id_prefix}{n}", a, b, index[label]))
    return out


def read_token_tag_tsv(
    path: str | os.PathLike, labels: Sequence[str] | None = None, id_prefix: str = ""
) -> list[TaggingExample]:
    """CoNLL-style ``token<TAB>tag`` lines, a blank line between sentences (PAN-X).

    Raises:
      ValueError: naming the line of a malformed row or unknown tag.
    """
    path = _require(pathlib.Path(path), "token-tag data")
    allowed = set(labels) if labels is not None else None
    out, tokens, tags = [], [], []

    def flush():
        if tokens:
            out.append(TaggingExample(f"{id_prefix}{len(out)}", tuple(tokens), tuple(tags)))
            tokens.clear()
            tags.clear()

    with open(path, encoding="utf-8", newline="") as f:
        for n, line in enumerate(f):
            line = line.rstrip("\r\n")
            if not line.strip():
                flush()
                continue
            fields = line.split("\t")
            if len(fields) != 2 or not fields[0] or not fields[1]:
                raise ValueError(
                    f"{path}:{n + 1}: expected 'token<TAB>tag', got {line!r} (a corrupt export?)"
                )
            if allowed is not None and fields[1] not in allowed:
                raise ValueError(
                    f"{path}:{n + 1}: unknown tag {fields[1]!r}; expected {sorted(allowed)}"
                )
            tokens.append(fields[0])
            tags.append(fields[1])
    flush()
    return out


def read_conllu_upos(path: str | os.PathLike, id_prefix: str = "") -> list[TaggingExample]:
    """Words and UPOS tags of a CoNLL-U file (multi-word token ranges and empty nodes
    are skipped: their syntactic words carry the tags)."""
    path = _require(pathlib.Path(path), "CoNLL-U treebank")
    out, tokens, tags = [], [], []
    sent_id = None

    def flush():
        nonlocal sent_id
        if tokens:
            sid = sent_id or f"{id_prefix}{len(out)}"
            out.append(TaggingExample(sid, tuple(tokens), tuple(tags)))
        tokens.clear()
        tags.clear()
        sent_id = None

    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            line = line.rstrip("\n")
            if not line:
                flush()
                continue
            if line.startswith("#"):
                if line.startswith("# sent_id = "):
                    sent_id = line[len("# sent_id = ") :]
                continue
            fields = line.split("\t")
            if len(fields) != 10:
                raise ValueError(f"{path}:{n + 1}: expected 10 CoNLL-U columns, got {len(fields)}")
            if "-" in fields[0] or "." in fields[0]:
                continue
            if fields[3] not in UPOS_LABELS:
                raise ValueError(f"{path}:{n + 1}: unknown UPOS tag {fields[3]!r}")
            tokens.append(fields[1])
            tags.append(fields[3])
    flush()
    return out


def read_lines(path: str | os.PathLike) -> list[str]:
    """Lines of a UTF-8 text file without line ends."""
    path = _require(pathlib.Path(path), "text data")
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f]


def read_id_sentences(path: str | os.PathLike) -> dict[str, str]:
    """BUCC corpus files: ``id<TAB>sentence`` per line."""
    out = {}
    for n, line in enumerate(read_lines(path)):
        if not line:
            continue
        sid, sep, sentence = line.partition("\t")
        if not sep:
            raise ValueError(f"{path}:{n + 1}: expected 'id<TAB>sentence'")
        out[sid] = sentence
    return out


# ----------------------------------------------------------------------------------------
# Dataset splits
# ----------------------------------------------------------------------------------------


def resolve_data_dir(data_dir) -> pathlib.Path:
    """``data_dir`` (None: the default shared-data folder), checked to exist."""
    path = pathlib.Path(data_dir) if data_dir is not None else DEFAULT_DATA_DIR
    if not path.is_dir():
        raise FileNotFoundError(
            f"data directory {path} does not exist (pass data_dir / DATA_DIR pointing at a "
            f"folder laid out like ../shared/data)"
        )
    return path


@functools.lru_cache(maxsize=8)
def _parallel_files(task: str, data_dir: pathlib.Path) -> dict[str, list]:
    spec = get_task(task)
    files = {
        lang: read_pair_tsv(data_dir / task / f"dev-{lang}.tsv", spec.labels, f"{task}-{lang}-")
        for lang in spec.languages
    }
    for lang, rows in files.items():
        if len(rows) != len(files["en"]):
            raise ValueError(
                f"{task}: dev-{lang}.tsv has {len(rows)} lines but dev-en.tsv "
                f"{len(files['en'])}; the dev files must be line-aligned translations"
            )
    return files


def _parallel_dev(task, lang, data_dir, train_fraction, select_fraction, part):
    # The split is computed once over every language, so all use the same lines.
    files = _parallel_files(task, pathlib.Path(data_dir))
    parts = splits.dev_split(list(files.values()), train_fraction, select_fraction)
    return [files[lang][i] for i in parts[part]]


def _pud_in_english_order(lang: str, data_dir: pathlib.Path) -> list[TaggingExample]:
    rows = read_conllu_upos(data_dir / "ud" / UD_TEST_FILES[lang])
    if lang == "en":
        return rows
    order = [ex.id for ex in read_conllu_upos(data_dir / "ud" / UD_TEST_FILES["en"])]
    by_id = {ex.id: ex for ex in rows}
    if set(by_id) != set(order):
        raise ValueError(
            f"udpos: {UD_TEST_FILES[lang]} does not hold the same # sent_id set as English PUD"
        )
    return [by_id[i] for i in order]


def _panx_english_dev(data_dir, select_fraction, part):
    # XTREME selects on English dev and scores English test; without labelled test data
    # here, English dev is split so that selection and English's score do not overlap.
    rows = read_token_tag_tsv(data_dir / "panx" / "dev-en.tsv", PANX_LABELS, "panx-en-")
    if select_fraction == 0:
        return rows if part == "eval" else None
    parts = splits.holdout_split([e.tokens for e in rows], select_fraction)
    return [rows[i] for i in parts[part]]


def load_train(
    task: str, data_dir=None, *, train_fraction: float = 0.5, select_fraction: float = 0.1
) -> list:
    """English training examples of ``task`` from the local data.

    Args:
      task: a registered task name (not a retrieval task).
      data_dir: folder laid out like ``../shared/data`` (default: that folder).
      train_fraction, select_fraction: XNLI / PAWS-X — see :func:`splits.dev_split`.
    """
    spec = get_task(task)
    data_dir = resolve_data_dir(data_dir)
    if task in ("xnli", "pawsx"):
        return _parallel_dev(task, "en", data_dir, train_fraction, select_fraction, "train")
    if spec.kind == "qa":
        return read_squad_json(
            data_dir / "tydiqa" / "language_data" / "english" / "english_tydiqa_train.json"
        )
    if task == "panx":
        return read_token_tag_tsv(data_dir / "panx" / "train-en.tsv", PANX_LABELS, "panx-en-train-")
    if task == "udpos":
        return read_conllu_upos(data_dir / "ud" / UD_TRAIN_FILE)
    raise ValueError(f"task {task!r} ({spec.kind}) has no training data: it is not fine-tuned")


def load_select(
    task: str, data_dir=None, *, train_fraction: float = 0.5, select_fraction: float = 0.1
) -> list | None:
    """English development examples on which XTREME selects the best checkpoint.

    XNLI / PAWS-X: the held-out "select" part of English dev (:func:`splits.dev_split`);
    PAN-X: the first ``select_fraction`` of English dev (:func:`splits.holdout_split`; the
    rest is English's evaluation set); UD POS: English-EWT test. None for QA (XTREME
    keeps the final parameters) and where ``select_fraction`` is 0. Never an example that
    :func:`load_eval` returns for any language.
    """
    spec = get_task(task)
    data_dir = resolve_data_dir(data_dir)
    if task in ("xnli", "pawsx"):
        if select_fraction == 0:
            return None
        return _parallel_dev(task, "en", data_dir, train_fraction, select_fraction, "select")
    if task == "panx":
        return _panx_english_dev(data_dir, select_fraction, "select")
    if task == "udpos":
        return read_conllu_upos(data_dir / "ud" / UD_SELECT_FILE)
    if spec.kind == "qa":
        return None
    raise ValueError(f"task {task!r} ({spec.kind}) is not fine-tuned")


def load_eval(
    task: str, lang: str, data_dir=None, *, train_fraction: float = 0.5,
    select_fraction: float = 0.1,
) -> list:
    """Evaluation examples of ``task`` in language ``lang`` from the local data.

    PAN-X English: English dev without the selection part (see :func:`load_select`).
    """
    spec = get_task(task)
    check_languages(task, [lang])
    data_dir = resolve_data_dir(data_dir)
    if task in ("xnli", "pawsx"):
        return _parallel_dev(task, lang, data_dir, train_fraction, select_fraction, "eval")
    if task == "tydiqa":
        folder = TYDIQA_FOLDERS[lang]
        return read_squad_json(
            data_dir / "tydiqa" / "language_data" / folder / f"{folder}_tydiqa_dev.json"
        )
    if task == "xquad":
        return read_squad_json(data_dir / "xquad" / f"xquad.{lang}.json")
    if task == "mlqa":
        return read_squad_json(
            data_dir / "mlqa" / "MLQA_V1" / "dev" / f"dev-context-{lang}-question-{lang}.json"
        )
    if task == "panx":
        if lang == "en":
            return _panx_english_dev(data_dir, select_fraction, "eval")
        return read_token_tag_tsv(
            data_dir / "panx" / f"dev-{lang}.tsv", PANX_LABELS, f"panx-{lang}-"
        )
    if task == "udpos":
        return _pud_in_english_order(lang, data_dir)
    raise ValueError(f"{spec.name} is a retrieval task: use read_tatoeba / read_bucc")


def read_tatoeba(lang: str, data_dir=None) -> tuple[list[str], list[str]]:
    """Line-aligned (sentences in ``lang``, English translations) of LASER's Tatoeba.

    ``lang`` is an XTREME code (``de``) or a LASER / ISO 639-3 code (``deu``).
    """
    data_dir = resolve_data_dir(data_dir)
    code = TATOEBA_CODES.get(lang, lang)
    if len(code) != 3:
        raise ValueError(
            f"tatoeba: unknown language {lang!r}; use an ISO 639-3 code or one of "
            f"{sorted(TATOEBA_CODES)}"
        )
    folder = data_dir / "tatoeba"
    src = folder / f"tatoeba.{code}-eng.{code}"
    if not src.is_file() and folder.is_dir():
        available = sorted(
            p.name.split(".")[1].split("-")[0] for p in folder.glob("tatoeba.*-eng.eng")
        )
        raise ValueError(f"tatoeba: no data for language {lang!r}; available: {available}")
    xx = read_lines(src)
    en = read_lines(folder / f"tatoeba.{code}-eng.eng")
    if len(xx) != len(en):
        raise ValueError(f"tatoeba {code}: {len(xx)} sentences but {len(en)} English lines")
    return xx, en


def read_bucc(pair: str = "zh-en", split: str = "dev", data_dir=None):
    """BUCC 2018 corpora and gold pairs: (source {id: sentence}, English {id: sentence},
    gold set of (source id, English id))."""
    data_dir = resolve_data_dir(data_dir) / "bucc2018"
    src_lang, _, tgt_lang = pair.partition("-")
    if tgt_lang != "en":
        raise ValueError(f"bucc: pair must be '<lang>-en', got {pair!r}")
    prefix = data_dir / f"{pair}.{split}"
    src = read_id_sentences(f"{prefix}.{src_lang}")
    tgt = read_id_sentences(f"{prefix}.en")
    gold = set()
    for n, line in enumerate(read_lines(f"{prefix}.gold")):
        if line:
            a, _, b = line.partition("\t")
            if a not in src or b not in tgt:
                raise ValueError(f"{prefix}.gold:{n + 1}: pair ({a}, {b}) not in the corpora")
            gold.add((a, b))
    return src, tgt, gold
