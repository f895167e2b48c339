"""Report command: results.json files of several runs -> markdown tables and PNG plots."""

import re

import pytest

from xlmeta_jax.evaluation import scorers, tasks
from xlmeta_jax.evaluation.results import write_results
from xlmeta_jax.tools import report

_SETTINGS = {"learning_rate": 3e-5, "num_epochs": 3.0, "max_train_examples": None}


def _provenance(task, source="local", settings=_SETTINGS):
    return {"provenance": tasks.get(task).provenance(source, "/data", settings, 3696),
            "settings": dict(settings)}


def _qa_results(scores):
    per_lang = {lang: {"f1": f1, "exact_match": f1 - 10, "num_examples": 5}
                for lang, f1 in scores.items()}
    return {"task": "tydiqa", "metric": "f1", "languages": per_lang,
            **scorers.transfer_summary(per_lang, "f1"), **_provenance("tydiqa")}


def _tatoeba_results(acc):
    per_lang = {"de": {"accuracy": acc, "accuracy_xx2en": acc, "num_examples": 9}}
    return {"task": "tatoeba", "metric": "accuracy", "languages": per_lang,
            **scorers.transfer_summary(per_lang, "accuracy"), **_provenance("tatoeba"),
            "layer_sweep": {"0": {"xx2en": 1.0, "en2xx": 2.0}, "1": {"xx2en": acc, "en2xx": acc}}}


@pytest.fixture
def runs(tmp_path):
    for name, f1, acc in (("meta", 80.0, 40.0), ("xlmr", 70.0, 30.0)):
        for task, res in (("tydiqa", _qa_results({"en": f1, "sw": f1 - 20, "te": f1 - 30})),
                          ("tatoeba", _tatoeba_results(acc))):
            (tmp_path / name / task).mkdir(parents=True)
            write_results(tmp_path / name / task, res)
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
    # Provenance under each table: TyDi QA trained on TyDi QA GoldP English is XTREME's
    # protocol (838c13b), so full local runs are comparable.
    assert ("* meta: local data; trained on TyDi QA GoldP English train (3696 examples); "
            "comparable with XTREME.") in text
    assert "* meta: local data; trained on None (3696 examples); comparable with XTREME" in text
    for png in ("tydiqa_languages.png", "tatoeba_languages.png", "tatoeba_layers.png",
                "english_vs_transfer.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png
        assert f"]({png})" in text


def _lines(ax, gid):
    return [line for line in ax.get_lines() if line.get_gid() == gid]


def test_report_plots_chance_and_the_reported_layer(runs, tmp_path):
    """The command's figures are the experiment report's: read their data back."""
    from xlmeta_jax.experiment import plots

    tasks_by_run = report.gather([str(runs / "meta"), f"baseline={runs / 'xlmr'}"])
    try:
        # Tatoeba per hidden state: the chance line (9 candidates: 100/9) and, for values
        # near it, 0 in range; the reported layer sits where its label says; the legend is
        # outside the axes.
        tatoeba = tasks_by_run["tatoeba"]
        for r in tatoeba.values():
            r["layer_sweep"] = {"0": {"en2xx": 20.0, "xx2en": 21.0}, "1": {"en2xx": 25.0,
                                "xx2en": 24.0}, "2": {"en2xx": 23.0, "xx2en": 22.0}}
            r.update(layer=0, hidden_states_index=1)
        ax = report.figure_layers("tatoeba", tatoeba).axes[0]
        (chance,) = _lines(ax, "chance")
        assert list(chance.get_ydata()) == [pytest.approx(100 / 9)] * 2
        assert ax.get_ylim()[0] == 0.0 and ax.get_ylim()[1] >= 25.0
        (marker,) = _lines(ax, "reported")
        named = re.search(r"hidden state (\d+) \(XTREME layer (\d+)\)", marker.get_label())
        assert list(marker.get_xdata()) == [int(named.group(1))] * 2 == [1, 1]
        assert int(named.group(2)) == 0
        assert ax.get_legend().get_bbox_to_anchor().x0 >= ax.get_window_extent().x1
        # One error-bar curve per run and direction, the sweep's values at its keys.
        curves = {c.get_label(): list(c.lines[0].get_ydata()) for c in ax.containers}
        assert list(ax.containers[0].lines[0].get_xdata()) == [0, 1, 2]
        assert curves["meta: en → xx (XTREME's)"] == [20.0, 25.0, 23.0]
        assert curves["baseline: xx → en"] == [21.0, 24.0, 22.0]
        # A results.json without hidden_states_index: XTREME's layer + 1.
        del tatoeba["meta"]["hidden_states_index"], tatoeba["baseline"]["hidden_states_index"]
        (marker,) = _lines(report.figure_layers("tatoeba", tatoeba).axes[0], "reported")
        assert list(marker.get_xdata()) == [1, 1]

        # Per-language bars: one bar per run and language; F1 has no chance line.
        ax = report.figure_languages("tydiqa", tasks_by_run["tydiqa"]).axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["en", "sw", "te"]
        assert sorted(p.get_height() for p in ax.patches) == [40, 50, 50, 60, 70, 80]
        assert not _lines(ax, "chance")
        ax = report.figure_languages("tatoeba", tatoeba).axes[0]
        assert [float(y) for y in _lines(ax, "chance")[0].get_ydata()] == [
            pytest.approx(100 / 9)] * 2
    finally:
        plots.pyplot().close("all")


def test_report_bad_input(runs, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        report.gather([str(tmp_path / "nope")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no results.json"):
        report.gather([str(tmp_path / "empty")])
    with pytest.raises(ValueError, match="two tatoeba results for run 'x'"):
        report.gather([f"x={runs / 'meta'}", f"x={runs / 'xlmr'}"])


def test_report_refuses_runs_with_different_data_or_settings(runs, tmp_path):
    res = _qa_results({"en": 75.0, "sw": 55.0, "te": 45.0})
    res.update(_provenance("tydiqa", "tfds", {**_SETTINGS, "learning_rate": 5e-5}))
    (tmp_path / "tfds" / "tydiqa").mkdir(parents=True)
    write_results(tmp_path / "tfds" / "tydiqa", res)
    out = tmp_path / "report"
    with pytest.raises(report.ReportError, match=r"tydiqa: runs differ in data or settings.*"
                       r"data_source='tfds' vs meta 'local'.*learning_rate=5e-05"):
        report.main([str(runs / "meta"), str(tmp_path / "tfds" / "tydiqa"), "--output", str(out)])
    assert not out.exists()
    path = report.main([str(runs / "meta"), str(tmp_path / "tfds" / "tydiqa"), "--output",
                        str(out), "--allow_mixed"])
    text = path.read_text()
    assert "| tydiqa | 75.0 | 55.0 | 45.0 |" in text
    assert "Runs differ (shown together on request)" in text
    assert "* tydiqa: tfds data" in text


def test_report_shows_mean_and_std_over_seeds(tmp_path):
    res = _qa_results({"en": 80.0, "sw": 60.0})
    res["languages"]["sw"]["f1_std"] = 1.25
    res.update(average_std=0.5, seeds=[{}, {}, {}])
    (tmp_path / "a").mkdir()
    write_results(tmp_path / "a", res)
    table = report.task_table("tydiqa", report.gather([str(tmp_path / "a")])["tydiqa"])
    assert "| a | 80.0 | 60.0 ± 1.2 | 70.0 ± 0.5 |" in table


def test_retrieval_provenance_names_only_settings_that_apply():
    # Tatoeba and BUCC fine-tune nothing: training steps and examples do not make them a
    # demo run, the evaluated subsample does.
    settings = {"max_train_examples": 2000, "max_eval_examples": 150, "train_steps": 100}
    for task in ("tatoeba", "bucc"):
        prov = tasks.get(task).provenance("local", "/data", settings, None)
        assert [d.split("=")[0] for d in prov["differences"] if "demo run" in d] == [
            "max_eval_examples"]
    full = tasks.get("tatoeba").provenance("local", "/data", {"max_eval_examples": None}, None)
    assert full["comparable_to_xtreme"] and not full["differences"]
    xnli = tasks.get("xnli").provenance("local", "/data", settings, 2000)
    assert [d.split("=")[0] for d in xnli["differences"] if "demo run" in d] == [
        "max_train_examples", "max_eval_examples", "train_steps"]


def test_tydiqa_trained_on_tydiqa_is_xtreme_protocol():
    """XTREME (838c13b) fine-tunes TyDi QA GoldP on its English training set too; XQuAD
    and MLQA, which XTREME trains on SQuAD v1.1, keep that difference."""
    tydiqa = tasks.get("tydiqa").provenance("local", "/data", {}, 3696)
    assert tydiqa["comparable_to_xtreme"] and tydiqa["differences"] == []
    assert tasks.get("tydiqa").provenance("tfds", None, {}, 3696)["differences"] == []
    xquad = tasks.get("xquad").provenance("local", "/data", {}, 3696)
    assert any("SQuAD v1.1" in d for d in xquad["differences"])
    assert tasks.get("udpos").provenance("local", "/data", {}, 1)["scoring"].startswith(
        "F1 as seqeval-0.0.12")
