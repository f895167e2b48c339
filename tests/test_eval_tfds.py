"""TFDS readers map the builders' features to our examples (mocked TFDS data)."""

import pytest

from xlmeta_jax.evaluation import readers, tasks, tfds_readers

tfds = pytest.importorskip("tensorflow_datasets")


@pytest.fixture
def mock_tfds():
    with tfds.testing.mock_data(num_examples=3, policy=tfds.testing.MockPolicy.USE_CODE):
        yield


def test_tfds_examples_have_our_types(mock_tfds):
    qa = tasks.get("tydiqa").tfds_eval("sw")
    assert len(qa) == 3 and all(isinstance(e, readers.QAExample) for e in qa)
    assert all(e.answers and len(e.answers) == len(e.answer_starts) for e in qa)
    assert len(tasks.get("xquad").tfds_eval("de")) == 3
    assert len(tasks.get("mlqa").tfds_eval("zh")) == 3
    # Mock answers are random text, never at their offsets: training drops them all.
    assert tasks.get("xquad").tfds_train() == []

    for task, lang in (("xnli", "sw"), ("pawsx", "ja")):
        n_labels = len(tasks.get(task).labels)
        for examples in (tasks.get(task).tfds_train(), tasks.get(task).tfds_eval(lang)):
            # Mock XNLI rows carry random hypothesis languages: those without it are skipped.
            assert 0 < len(examples) <= 3 if task == "pawsx" else len(examples) <= 3
            assert all(isinstance(e, readers.ClassificationExample) for e in examples)
            assert all(0 <= e.label < n_labels and e.text_a for e in examples)



def test_wikiann_tags_map_by_name(monkeypatch):
    import numpy as np

    info = tfds.builder("wikiann/de").info  # features come from the builder code
    rows = [{"tokens": np.array([b"Angela", b"Merkel", b"sprach"]), "tags": np.array([1, 2, 0])}]
    monkeypatch.setattr(tfds_readers, "load", lambda name, split, data_dir: (rows, info))
    [ex] = tasks.get("panx").tfds_eval("de")
    assert ex.tokens == ("Angela", "Merkel", "sprach")
    assert ex.tags == ("B-PER", "I-PER", "O")
    rows[0]["tags"] = np.array([1, 2])
    with pytest.raises(ValueError, match="3 tokens, 2 tags"):
        tasks.get("panx").tfds_eval("de")


def test_tasks_without_tfds_builder_are_clear_errors():
    with pytest.raises(ValueError, match="'udpos' has no TFDS source"):
        tasks.get("udpos").tfds_train()
    with pytest.raises(ValueError, match="language 'ro' has no TFDS config"):
        tasks.get("xquad").tfds_eval("ro")
