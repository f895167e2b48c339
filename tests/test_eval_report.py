"""Report command: results.json files of several runs -> markdown tables and PNG plots."""

import pytest

from xlmeta_jax import report
from xlmeta_jax.evaluation import finetuning, scorers


def _qa_results(scores):
    per_lang = {lang: {"f1": f1, "exact_match": f1 - 10, "num_examples": 5}
                for lang, f1 in scores.items()}
    return {"task": "tydiqa", "metric": "f1", "languages": per_lang,
            **scorers.transfer_summary(per_lang, "f1")}


def _tatoeba_results(acc):
    per_lang = {"de": {"accuracy": acc, "accuracy_en2xx": acc, "num_examples": 9}}
    return {"task": "tatoeba", "metric": "accuracy", "languages": per_lang,
            **scorers.transfer_summary(per_lang, "accuracy"),
            "layer_sweep": {"0": {"xx2en": 1.0, "en2xx": 2.0}, "1": {"xx2en": acc, "en2xx": acc}}}


@pytest.fixture
def runs(tmp_path):
    for name, f1, acc in (("meta", 80.0, 40.0), ("xlmr", 70.0, 30.0)):
        for task, res in (("tydiqa", _qa_results({"en": f1, "sw": f1 - 20, "te": f1 - 30})),
                          ("tatoeba", _tatoeba_results(acc))):
            (tmp_path / name / task).mkdir(parents=True)
            finetuning.write_results(tmp_path / name / task, res)
    return tmp_path


def test_report_tables_and_plots(runs, tmp_path):
    out = tmp_path / "report"
    path = report.main([str(runs / "meta"), f"baseline={runs / 'xlmr'}", "--output", str(out)])
    text = path.read_text()
    # en first; meta: avg (80+60+50)/3, target avg 55, gap 25.
    assert "| run | en | sw | te | average | average_target | english | transfer_gap |" in text
    assert "| meta | 80.0 | 60.0 | 50.0 | 63.3 | 55.0 | 80.0 | 25.0 |" in text
    assert "| baseline | 70.0 | 50.0 | 40.0 | 53.3 | 45.0 | 70.0 | 25.0 |" in text
    assert "| meta | 40.0 | 40.0 | 40.0 | – | – |" in text
    for png in ("tydiqa_languages.png", "tatoeba_languages.png", "tatoeba_layers.png",
                "english_vs_transfer.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png
        assert f"]({png})" in text


def test_report_bad_input(runs, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        report.gather([str(tmp_path / "nope")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no results.json"):
        report.gather([str(tmp_path / "empty")])
    with pytest.raises(ValueError, match="two tatoeba results for run 'x'"):
        report.gather([f"x={runs / 'meta'}", f"x={runs / 'xlmr'}"])
