"""The experiment's report on a tiny fake experiment: the numbers in report.md and the plots."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from xlmeta_jax.evaluation import tasks
from xlmeta_jax.experiment import plots, report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(arm, seed, en, de, fr, tatoeba_by_layer, losses):
    """One arm x seed of the fake experiment: XNLI (en, de, fr) and Tatoeba (de, fr)."""
    target = (de + fr) / 2
    return {
        "arm": arm, "seed": seed,
        "pretraining": {
            "tokens": 4096 * len(losses),
            "phases": [{"phase": arm, "task": "mix", "steps": len(losses), "tokens": 4096,
                        "final_loss": losses[-1]}],
            "loss_curve": {"tokens": [4096 * (i + 1) for i in range(len(losses))],
                           "loss": losses, "phase": [arm] * len(losses)},
        },
        "evaluations": {
            "xnli": {"metric": "accuracy", "english": en, "average_target": target,
                     "transfer_gap": en - target, "average": (en + de + fr) / 3,
                     "languages": {"en": en, "de": de, "fr": fr},
                     "num_examples": {"en": 40, "de": 40, "fr": 40},
                     "comparable_to_xtreme": False,
                     "differences_from_xtreme": ["evaluated on half of dev instead of test"]},
            "tatoeba": {"metric": "accuracy", "english": None,
                        "average_target": tatoeba_by_layer[1], "transfer_gap": None,
                        "languages": {"de": tatoeba_by_layer[1], "fr": tatoeba_by_layer[1]},
                        # Chance: 100/20 = 5 (de), 100/50 = 2 (fr); mean 3.5.
                        "num_examples": {"de": 20, "fr": 50},
                        # A 2-layer encoder reports its last layer (1): hidden state 2.
                        "layer": 1, "hidden_states_index": 2,
                        "layer_sweep": {str(i): v for i, v in enumerate(tatoeba_by_layer)}},
        },
    }


@pytest.fixture()
def fake_results():
    runs = [
        _run("meta", 0, 70.0, 60.0, 58.0, [10.0, 30.0, 20.0], [6.0, 5.0, 4.0]),
        _run("meta", 1, 74.0, 64.0, 60.0, [12.0, 34.0, 22.0], [6.1, 5.1, 4.1]),
        _run("xlmr", 0, 66.0, 62.0, 62.0, [8.0, 20.0, 18.0], [6.2, 5.3, 4.5]),
        _run("xlmr", 1, 68.0, 60.0, 64.0, [9.0, 22.0, 19.0], [6.3, 5.2, 4.4]),
    ]
    return {
        "experiment": {"name": "fake", "command": "python -m xlmeta_jax.experiment ...",
                       "arms": ["meta", "xlmr"], "seeds": [0, 1], "tasks": ["xnli", "tatoeba"]},
        "runs": {f"{r['arm']}/seed{r['seed']}": r for r in runs},
    }


def test_summary_is_mean_and_sample_std_over_seeds(fake_results):
    s = report.summarize(fake_results)
    meta = s["xnli"]["meta"]
    assert meta["english"]["mean"] == pytest.approx(72.0)
    assert meta["english"]["std"] == pytest.approx(np.std([70.0, 74.0], ddof=1))
    # target averages 59 and 62; gaps 11 and 12
    assert meta["average_target"]["mean"] == pytest.approx(60.5)
    assert meta["transfer_gap"]["mean"] == pytest.approx(11.5)
    assert meta["transfer_gap"]["std"] == pytest.approx(np.std([11.0, 12.0], ddof=1))
    xlmr = s["xnli"]["xlmr"]
    assert xlmr["transfer_gap"]["mean"] == pytest.approx(((66 - 62) + (68 - 62)) / 2)
    # Retrieval has no English score and no gap.
    assert s["tatoeba"]["meta"]["english"] == {"mean": None, "std": None, "n": 0}
    assert report.mean_std([3.0]) == {"mean": 3.0, "std": None, "n": 1}


def test_per_language_and_per_layer_numbers(fake_results):
    langs = report.per_language(fake_results, "xnli")
    assert langs["meta"]["de"]["mean"] == pytest.approx(62.0)
    assert langs["xlmr"]["fr"]["mean"] == pytest.approx(63.0)
    layers = report.layer_sweep(fake_results, "tatoeba")
    assert sorted(layers["meta"]) == [0, 1, 2]
    assert layers["meta"][1]["mean"] == pytest.approx(32.0)
    assert layers["xlmr"][2]["mean"] == pytest.approx(18.5)


def test_report_markdown_and_plots(tmp_path, fake_results):
    (tmp_path / "results.json").write_text(json.dumps(fake_results))
    paths = report.write_report(fake_results, tmp_path)
    names = sorted(p.name for p in paths)
    assert names == sorted(["report.md", "english_vs_target.png", "xnli_languages.png",
                            "tatoeba_languages.png", "retrieval_layers.png",
                            "pretraining_loss.png"])
    for p in paths:
        if p.suffix == ".png":
            data = p.read_bytes()
            assert data.startswith(PNG_MAGIC) and len(data) > 2000, p
    text = (tmp_path / "report.md").read_text()
    assert "python -m xlmeta_jax.experiment ..." in text
    lines = text.splitlines()
    xnli = lines.index("## xnli (accuracy)")
    # meta: English 72.0 ± 2.8, target 60.5 ± 2.1 (59, 62), gap 11.5 ± 0.7
    assert lines[xnli + 4] == "| meta | 72.0 ± 2.8 | 60.5 ± 2.1 | 11.5 ± 0.7 |"
    assert lines[xnli + 5] == "| xlmr | 67.0 ± 1.4 | 62.0 ± 0.0 | 5.0 ± 1.4 |"
    assert lines[xnli + 7] == "Not XTREME's protocol: evaluated on half of dev instead of test."
    tatoeba = lines.index("## tatoeba (accuracy)")
    assert lines[tatoeba + 4] == "| meta | – | 32.0 ± 2.8 | – |"
    assert "| meta | 0 | mix: 3 | 12,288 | 4.000 |" in lines
    for name in names:
        if name.endswith(".png"):
            assert f"({name})" in text


def test_plots_are_skipped_when_there_is_nothing_to_plot(tmp_path):
    results = {"experiment": {"arms": ["meta"], "tasks": ["xnli"]},
               "runs": {"meta/seed0": {"arm": "meta", "seed": 0, "pretraining": None,
                                       "evaluations": {}}}}
    paths = report.write_report(results, tmp_path)
    assert [p.name for p in paths] == ["report.md"]
    assert "| meta | 0 |  | – | – |" in (tmp_path / "report.md").read_text()


def test_sign_flip_p_values_and_holm_by_hand():
    from xlmeta_jax.experiment import statistics

    # n = 4, all positive: only the observed pattern and its mirror reach |mean| = 2.5.
    assert statistics.sign_flip_p_value([1.0, 2.0, 3.0, 4.0]) == 2 / 16
    # |mean| of patterns of (1, 1, 1, -3): observed 0; every pattern reaches it.
    assert statistics.sign_flip_p_value([1.0, 1.0, 1.0, -3.0]) == 1.0
    # (1, 2, 3, -1): observed sum 5; the signed sums of magnitudes (1, 2, 3, 1) reaching
    # |s| >= 5 are +-(1+2+3+1) = 7, +-(1+2+3-1) = 5 and +-(-1+2+3+1) = 5: 6 of 16.
    assert statistics.sign_flip_p_value([1.0, 2.0, 3.0, -1.0]) == 6 / 16
    # Holm: sorted p times (m - rank), made monotone; order kept.
    assert statistics.holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert statistics.smallest_p(4) == 0.125 and statistics.smallest_p(6) == 2 / 64
    # 30 comparisons at 0.05: 2 / 2^n <= 0.05 / 30 first holds at n = 11.
    assert statistics.seeds_needed(0.05, 30) == 11
    low, high = statistics.t_interval([1.0, 2.0, 3.0, 4.0])
    # mean 2.5, s = 1.291, t(0.975, 3) = 3.182: half-width 2.054.
    assert (low, high) == pytest.approx((2.5 - 2.0540, 2.5 + 2.0540), abs=1e-3)


def test_paired_comparisons_pair_seeds(fake_results):
    from xlmeta_jax.experiment import statistics

    rows = {(r["task"], r["score"]): r for r in statistics.paired_comparisons(fake_results)}
    # XNLI English: meta (70, 74) - xlmr (66, 68) = (4, 6) per seed.
    english = rows[("xnli", "english")]
    assert (english["n"], english["mean"], english["baseline"]) == (2, 5.0, "xlmr")
    assert english["std"] == pytest.approx(np.std([4.0, 6.0], ddof=1))
    assert english["p"] == 0.5  # 2 of the 4 sign patterns reach |mean| 5
    # Tatoeba has no English score: only its target average is compared.
    assert ("tatoeba", "english") not in rows and ("tatoeba", "average_target") in rows
    assert len(rows) == 3
    assert english["p_holm"] == pytest.approx(min(1.0, 3 * 0.5))


def test_report_states_what_the_seeds_can_detect(fake_results):
    text = report.markdown(fake_results)
    assert "## Paired comparison: meta − baseline, per seed" in text
    assert "| xnli | english | xlmr | 2 | +5.00 ± 1.41 |" in text
    assert "With 2 seeds the exact test cannot give p below 0.500" in text
    assert "No difference is significant after Holm at 0.05." in text


# ----------------------------------------------------------------------------------------
# What the plots draw, read back from the matplotlib figures
# ----------------------------------------------------------------------------------------


@pytest.fixture()
def close_figures():
    yield
    plots.pyplot().close("all")


def _lines(ax, gid):
    return [line for line in ax.get_lines() if line.get_gid() == gid]


def _chance_ys(ax) -> list[float]:
    """The y values of the Axes' chance line(s), NaN breaks dropped."""
    ys = [float(y) for line in _lines(ax, "chance") for y in line.get_ydata()]
    return sorted({round(y, 6) for y in ys if y == y})


def _assert_in_ylim(ax, ys):
    bottom, top = ax.get_ylim()
    assert all(bottom <= y <= top for y in ys), (ax.get_ylim(), ys)


def _finetune_results(task, scores, num_examples, **extra):
    """One results.json of python -m xlmeta_jax.finetune, as the notebooks plot it."""
    metric = tasks.get(task).metric
    languages = {lang: {metric: v, "num_examples": num_examples[lang]}
                 for lang, v in scores.items()}
    target = [v for lang, v in scores.items() if lang != "en"]
    return {"task": task, "metric": metric, "languages": languages,
            "english": scores.get("en"), "average_target": float(np.mean(target)), **extra}


def test_classification_chance_line_from_the_task_labels(fake_results, close_figures):
    xnli_chance = 100 / len(tasks.get("xnli").labels)
    assert xnli_chance == pytest.approx(100 / 3)
    ax = report.figure_languages(fake_results, "xnli").axes[0]
    assert _chance_ys(ax) == [pytest.approx(xnli_chance)]
    assert "3 labels" in _lines(ax, "chance")[0].get_label()
    _assert_in_ylim(ax, [xnli_chance])
    # The legend is outside the axes (inside it covers bars).
    assert ax.get_legend().get_bbox_to_anchor().x0 >= ax.get_window_extent().x1

    # The notebooks' plot of one fine-tuning run: PAW-X's two labels, chance 50.
    pawsx = _finetune_results("pawsx", {"en": 55.0, "de": 51.0, "fr": 52.0},
                              {"en": 40, "de": 40, "fr": 40})
    ax = plots.finetune_languages(pawsx).axes[0]
    assert _chance_ys(ax) == [pytest.approx(100 / len(tasks.get("pawsx").labels))] == [50.0]
    _assert_in_ylim(ax, [50.0])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["en", "de", "fr"]

    # English against target: chance on both axes, inside both ranges.
    ax = report.figure_english_vs_target(fake_results).axes[0]
    chance = _lines(ax, "chance")
    assert sorted(float(c.get_ydata()[0]) for c in chance if c.get_ydata()[0] ==
                  c.get_ydata()[1]) == [pytest.approx(xnli_chance)]
    bottom, top = ax.get_xlim()
    assert bottom <= xnli_chance <= top
    _assert_in_ylim(ax, [xnli_chance])


def test_tatoeba_chance_is_100_over_candidates_per_language(fake_results, close_figures):
    ax = report.figure_languages(fake_results, "tatoeba").axes[0]
    # One segment per language: de 100/20, fr 100/50.
    assert _chance_ys(ax) == [pytest.approx(2.0), pytest.approx(5.0)]
    xs = [x for x in _lines(ax, "chance")[0].get_xdata() if x == x]
    ys = [y for y in _lines(ax, "chance")[0].get_ydata() if y == y]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert {labels[round(float(np.mean(xs[i:i + 2])))]: ys[i] for i in (0, 2)} == {
        "de": pytest.approx(5.0), "fr": pytest.approx(2.0)}
    _assert_in_ylim(ax, [2.0, 5.0])


def test_layer_plot_marks_the_reported_layer_where_its_label_says(fake_results,
                                                                  close_figures):
    ax = report.figure_layers(fake_results).axes[0]
    # The average plot's chance: the mean of 100/N over the plotted languages, said so.
    assert _chance_ys(ax) == [pytest.approx((100 / 20 + 100 / 50) / 2)]
    assert "mean of 100/N over 2 languages" in _lines(ax, "chance")[0].get_label()
    _assert_in_ylim(ax, [3.5])
    (marker,) = _lines(ax, "reported")
    named = re.search(r"hidden state (\d+) \(XTREME layer (\d+)\)", marker.get_label())
    assert named, marker.get_label()
    # Drawn at the hidden state the label names, which results.json's sweep keys count.
    assert list(marker.get_xdata()) == [int(named.group(1))] * 2 == [2, 2]
    assert int(named.group(2)) == 1  # results.json's "layer": XTREME's counting
    assert "hidden state" in ax.get_xlabel()


def test_near_chance_accuracy_is_plotted_from_zero(close_figures):
    """5.2-5.8% over 50 candidates (chance 2%) must not fill the axes as if it were a
    large effect: the range reaches down to 0 and includes the chance line."""
    tatoeba = _finetune_results("tatoeba", {"de": 5.5, "fr": 5.5}, {"de": 50, "fr": 50},
                                layer=1, hidden_states_index=2,
                                layer_sweep={str(i): {"en2xx": v, "xx2en": v - 0.1}
                                             for i, v in enumerate([5.2, 5.8, 5.5])})
    ax = plots.tatoeba_layers(tatoeba).axes[0]
    assert _chance_ys(ax) == [pytest.approx(2.0)]
    assert ax.get_ylim()[0] == 0.0
    (marker,) = _lines(ax, "reported")
    assert list(marker.get_xdata()) == [2, 2] and "hidden state 2 " in marker.get_label()
    # Far from chance the range need not start at 0, but still holds the chance line.
    assert plots.accuracy_limits([70.0], [80.0], [100 / 3])[0] == 0.0
    low, high = plots.accuracy_limits([60.0], [80.0], [50.0])
    assert 0.0 < low <= 50.0 and high >= 80.0
    # F1 tasks have no known chance level.
    assert plots.chance_by_language("tydiqa", {"en": 10}) == {}


def test_results_json_keeps_what_the_plots_need():
    """Candidate counts (Tatoeba's chance) and the reported layer reach results.json."""
    from xlmeta_jax.experiment import results

    tatoeba = _finetune_results("tatoeba", {"de": 5.5, "fr": 4.0}, {"de": 20, "fr": 50},
                                layer=1, hidden_states_index=2,
                                layer_sweep={"0": {"en2xx": 1.0, "xx2en": 2.0}})
    summary = results._evaluation_summary(tatoeba)
    assert summary["num_examples"] == {"de": 20, "fr": 50}
    assert (summary["layer"], summary["hidden_states_index"]) == (1, 2)
    assert summary["layer_sweep"] == {"0": 1.0}
