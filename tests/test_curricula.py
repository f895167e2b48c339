"""Staged curricula: phases with their own languages, alpha and masking rate.

A phase that sets any of them reads its corpus registered once more under names of its
own (``xlmeta_cc100.stage1``); the run's own registration, and so every existing run,
stays as it was. Tiny model, toy CC-100 folder, 8 fake CPU devices.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import os
import weakref

import numpy as np
import pytest

seqio = pytest.importorskip("seqio")
from data_toy import TOY_LANGUAGES, TOY_LINES  # noqa: E402

from xlmeta_jax import errors  # noqa: E402
from xlmeta_jax.data import task_names as names  # noqa: E402
from xlmeta_jax.data import tasks  # noqa: E402
from xlmeta_jax.data.corpora import Corpora  # noqa: E402
from xlmeta_jax.model import mlm, network  # noqa: E402
from xlmeta_jax.model.optimizer import OptimizerConfig  # noqa: E402
from xlmeta_jax.pretrain import checkpoints, run_dir, trainer  # noqa: E402

LENGTH = 32
STAGE = dict(languages=("en", "ru", "ja", "af"), alpha=1.0, masking=mlm.Masking(rate=0.3))


def _base(toy):
    return Corpora(vocab_path=toy["vocab"], cc100_dir=toy["cc_dir"],
                   languages=TOY_LANGUAGES, count_unit="lines")


def _blocks(name, n, seed=5):
    ds = seqio.get_mixture_or_task(name).get_dataset(
        {"inputs": LENGTH, "targets": LENGTH}, shuffle=False, seed=seed, num_epochs=None,
        passthrough_features=["language"])
    return list(ds.take(n).as_numpy_iterator())


def test_a_view_registers_its_own_languages_alpha_and_masking(toy_cc100):
    base = _base(toy_cc100)
    tasks.register(base)
    plain = _blocks(names.CC100_MIXTURE, 40)
    view = dataclasses.replace(base, **STAGE)
    registered = tasks.register(base, views={".stage1": view})
    assert "xlmeta_cc100.stage1" in registered and "xlmeta_cc100_ja.stage1" in registered
    # The run's own mixture is untouched by the view: same rates, same blocks bit for bit.
    q = {lang: TOY_LINES[lang] ** 0.3 for lang in TOY_LANGUAGES}
    total = sum(q.values())
    assert tasks.language_probabilities(names.CC100_MIXTURE) == pytest.approx(
        {k: v / total for k, v in q.items()})
    again = _blocks(names.CC100_MIXTURE, 40)
    for a, b in zip(plain, again):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # The view: its four languages at alpha 1 (proportional to size), masked at 30%.
    q1 = {lang: TOY_LINES[lang] / sum(TOY_LINES[x] for x in STAGE["languages"])
          for lang in STAGE["languages"]}
    assert tasks.language_probabilities("xlmeta_cc100.stage1") == pytest.approx(q1)
    drawn = _blocks("xlmeta_cc100.stage1", 300)
    assert {b["language"].decode() for b in drawn} == set(STAGE["languages"])
    slots = {r: math.ceil(r * LENGTH) + 1 for r in (0.15, 0.3)}
    assert plain[0]["mlm_positions"].shape == (slots[0.15],)
    assert drawn[0]["mlm_positions"].shape == (slots[0.3],)
    masked = np.mean([b["mlm_weights"].sum() / (b["inputs"] > 3).sum() for b in drawn])
    assert 0.25 < masked < 0.35  # about 30% of a block's tokens are predicted


def _phases(**stage2):
    opt = OptimizerConfig(learning_rate=1e-3, warmup_steps=1, total_steps=9, schedule="wsd",
                          decay_steps=3, decay_shape="1-sqrt")
    common = dict(task=names.CC100_MIXTURE, num_steps=3, batch_size=8, sequence_length=LENGTH,
                  optimizer=opt, reset_optimizer=False, reset_schedule=False)
    return [
        trainer.Phase("stage1", languages=["en", "ru"], alpha=0.7, mask_rate=0.3, **common),
        trainer.Phase("stage2", init_from="stage1", **{
            **common, "languages": ["en", "ru", "ja", "af"], "alpha": 0.5, "mask_rate": 0.15,
            **stage2}),
        trainer.Phase("stage3", init_from="stage2", alpha=0.3, mask_rate=0.05, **common),
    ]


def test_three_stages_train_log_their_data_and_resume(toy_cc100, tmp_path, caplog,
                                                     monkeypatch):
    # Every stage's pipeline is built before the first trains (a bad input fails early);
    # each is released when its stage ends, not held until the run ends.
    started, held = [], []
    train_phase = trainer._train_phase

    def watched(cfg, mesh, stop, index, phase, iterator, **kwargs):
        gc.collect()
        held.append([ref() is not None for ref in started])
        started.append(weakref.ref(iterator))
        return train_phase(cfg, mesh, stop, index, phase, iterator, **kwargs)

    monkeypatch.setattr(trainer, "_train_phase", watched)
    run = dict(model_dir=os.fspath(tmp_path), model=network.get_config("tiny", pad_token_id=0,
                                                                        vocab_size=2000),
               mesh_shape=(8, 1, 1), checkpoint_every=3, log_every=3,
               async_checkpointing=False, vocab_path=toy_cc100["vocab"],
               corpora=_base(toy_cc100))
    with caplog.at_level(logging.INFO, logger="xlmeta_jax.train"):
        summary = trainer.train(phases=_phases(), **run)
    lines = caplog.text
    assert "[stage1] building the input pipeline of xlmeta_cc100.stage1, 2 languages, " \
           "alpha 0.7, mask rate 0.3" in lines
    assert "xlmeta_cc100.stage3, 10 languages, alpha 0.3, mask rate 0.05" in lines
    assert [p["steps_run_now"] for p in summary["phases"]] == [3, 3, 3]
    assert held == [[], [False], [False, False]]
    metas = [checkpoints.read_meta(tmp_path / f"stage{i}" / "3") for i in (1, 2, 3)]
    assert [m["mask_rate"] for m in metas] == [0.3, 0.15, 0.05]
    assert [m["alpha"] for m in metas] == [0.7, 0.5, 0.3]
    # One schedule over the stages: each continues the previous one's step count.
    assert [m["step_offset"] for m in metas] == [0, 3, 6]
    # The last update ran at the end of the 1-sqrt cool-down: 1e-3 * (1 - sqrt(2/3)).
    assert metas[2]["metrics"]["learning_rate"] == pytest.approx(1e-3 * (1 - math.sqrt(2 / 3)),
                                                                 rel=1e-5)
    rerun = trainer.train(phases=_phases(), **run)
    assert [p["steps_run_now"] for p in rerun["phases"]] == [0, 0, 0]
    with pytest.raises(run_dir.RunConfigMismatch, match=r"alpha=0.5, the config asks for 0.4"):
        trainer.train(phases=_phases(alpha=0.4), **run)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(task="xlmeta_english_text", languages=["en"]),
         r"phase 'p': .*Phase.languages: is for a multilingual mixture"),
        (dict(languages=["en", "xx"]), r"phase 'p': .*Phase.languages: .*'xx'"),
        (dict(alpha=1.5), r"phase 'p': .*Phase.alpha: alpha must be in \(0, 1\]"),
        (dict(mask_rate=1.0), r"phase 'p': .*Phase.mask_rate: masking rate must be"),
        (dict(name="stage-1", alpha=0.5), r"must be letters, digits and '_'"),
    ],
)
def test_own_data_is_checked_where_the_phase_is_built(tmp_path, kwargs, match):
    phase = dict(name="p", task=names.CC100_MIXTURE, num_steps=2, batch_size=8,
                 sequence_length=LENGTH)
    phase.update(kwargs)
    with pytest.raises(errors.SettingError, match=match):
        trainer.train(model_dir=os.fspath(tmp_path), model=network.get_config("tiny"),
                      phases=[trainer.Phase(**phase)], mesh_shape=(8, 1, 1))
    assert not os.listdir(tmp_path)
