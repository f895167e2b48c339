"""seqio is used through its public API only: no private attribute, no private override."""

import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
SOURCES = sorted([*(REPO / "xlmeta_jax").rglob("*.py"), *(REPO / "tasks").rglob("*.py")])


def test_no_line_touches_a_private_seqio_attribute():
    # The check of issue #10: grep -rn "\._[a-z]" xlmeta_jax tasks | grep -i seqio
    hits = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in SOURCES
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\._[a-z]", line) and "seqio" in line.lower()
    ]
    assert not hits, "\n".join(hits)


# seqio's abstract methods that a subclass must implement: its documented extension points
# (seqio/feature_converters.py: a FeatureConverter "overrides _convert_features and
# get_model_feature_lengths"; seqio/vocabularies.py: a Vocabulary subclass "must implement
# methods for converting between strings and tokens both in pure python (`_encode`/`_decode`)
# and in TensorFlow (`_encode_tf`/`_decode_tf`)", and `_base_vocab_size`), not internals.
SEQIO_ABSTRACT_METHODS = {"_convert_features", "_encode", "_decode", "_encode_tf",
                          "_decode_tf", "_base_vocab_size"}


def _private_members(source: str) -> list[tuple[int, str]]:
    """(line, "Class.member") of every private method or ``self._x`` in a seqio subclass."""
    found = []
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef) or not any(
            "seqio" in ast.unparse(base) for base in cls.bases
        ):
            continue
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.FunctionDef)
                and node.name.startswith("_")
                and not (node.name.startswith("__") and node.name.endswith("__"))
                and node.name not in SEQIO_ABSTRACT_METHODS
            ):
                found.append((node.lineno, f"{cls.name}.{node.name}"))
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append((node.lineno, f"{cls.name}.self.{node.attr}"))
    return found


def test_seqio_subclasses_neither_override_nor_set_private_members():
    """Subclasses of seqio classes (data sources) define public members only.

    A ``_name`` method or ``self._name`` attribute in a seqio subclass overrides or
    shadows seqio internals (as overriding ``_model_context`` or flagging
    ``self._registering`` did).
    """
    found = [
        f"{path.relative_to(REPO)}:{line}: {member}"
        for path in SOURCES
        for line, member in _private_members(path.read_text())
    ]
    assert not found, "\n".join(found)


def test_the_check_flags_a_private_override():
    old = (
        "def configured():\n"
        "    class ConfiguredVocabulary(seqio.SentencePieceVocabulary):\n"
        "        def _model_context(self):\n"
        "            self._model = None\n"
        "    class Plain(object):\n"
        "        def _helper(self):\n"
        "            self._x = 1\n"
    )
    assert _private_members(old) == [
        (3, "ConfiguredVocabulary._model_context"),
        (4, "ConfiguredVocabulary.self._model"),
    ]
