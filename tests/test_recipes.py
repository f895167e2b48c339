"""Recipes as functions (xlmeta_jax/pretrain/recipes.py) and the run files that bind them:
the stages, schedules, hand-offs and merge each option gives."""

from __future__ import annotations

import pytest

from xlmeta_jax import errors
from xlmeta_jax.cli import flags as gin_cli
from xlmeta_jax.model.optimizer import OptimizerConfig
from xlmeta_jax.pretrain import recipes

pytestmark = pytest.mark.usefixtures("clean_gin")

_ARGS = dict(task="xlmeta_english_text", steps=100, batch_size=8, sequence_length=64,
             optimizer=OptimizerConfig(learning_rate=3e-4), warmup_steps=10)


def _shape(recipe):
    return [(p.name, p.num_steps, p.sequence_length, p.init_from, p.global_rope_theta,
             p.optimizer.schedule, p.optimizer.total_steps, p.optimizer.decay_steps)
            for p in recipe.phases]


@pytest.mark.parametrize("options, stages, merge", [
    ({}, [("continue", 100, 64, None, None, "linear", 100, 0)], None),
    # The extension continues the schedule: one linear decay over both stages.
    (dict(extension_steps=20, extension_length=128, extension_rope_theta=160000.0),
     [("continue", 100, 64, None, None, "linear", 120, 0),
      ("ext", 20, 128, "continue", 160000.0, "linear", 120, 0)], None),
    # Branches: warm-up-stable-decay, the decay in each branch, merged against its start.
    (dict(extension_steps=20, extension_length=128, extension_rope_theta=160000.0,
          decay_steps=5, branches=[{"name": "a"}, {"name": "b", "mask_rate": 0.05}]),
     [("continue", 100, 64, None, None, "wsd", 125, 5),
      ("ext", 20, 128, "continue", 160000.0, "wsd", 125, 5),
      ("a", 5, 128, "ext", 160000.0, "wsd", 125, 5),
      ("b", 5, 128, "ext", 160000.0, "wsd", 125, 5)], (["a", "b"], "ext")),
    (dict(decay_steps=5, branches=[{"name": "a"}, {"name": "b"}]),
     [("continue", 100, 64, None, None, "wsd", 105, 5),
      ("a", 5, 64, "continue", None, "wsd", 105, 5),
      ("b", 5, 64, "continue", None, "wsd", 105, 5)], (["a", "b"], "continue")),
])
def test_continued_stages(options, stages, merge):
    recipe = recipes.continued(**_ARGS, **options)
    assert _shape(recipe) == stages
    assert all(not p.reset_optimizer and not p.reset_schedule for p in recipe.phases[1:])
    assert recipe.phases[0].optimizer.warmup_steps == 10
    assert recipe.phases[0].optimizer.learning_rate == 3e-4
    if merge is None:
        assert recipe.merge is None
    else:
        assert (list(recipe.merge.branches), recipe.merge.base, recipe.merge.method) == (
            *merge, "ties")
    for branch in options.get("branches", []):  # a branch's own data, the rest the run's
        assert next(p for p in recipe.phases if p.name == branch["name"]).mask_rate == (
            branch.get("mask_rate"))


def test_english_stage_goes_first_and_hands_off_with_fresh_moments():
    recipe = recipes.with_english_stage(recipes.continued(**{**_ARGS, "task": "xlmeta_cc100"}),
                                        steps=30, task="xlmeta_english_text")
    english, mixture = recipe.phases
    assert (english.name, english.task, english.num_steps, english.init_from) == (
        "english", "xlmeta_english_text", 30, None)
    assert (english.optimizer.schedule, english.optimizer.total_steps) == ("linear", 30)
    assert (mixture.task, mixture.init_from, mixture.reset_optimizer,
            mixture.reset_schedule) == ("xlmeta_cc100", "english", True, True)


@pytest.mark.parametrize("branches, message", [
    ([{"languages": ["sw"]}], "a branch is a dict of ['name', 'languages', 'alpha', "
     "'mask_rate'] with a name"),
    ([{"name": "a", "rate": 1}], "(unknown: ['rate'])"),
])
def test_a_bad_branch_is_named(branches, message):
    with pytest.raises(errors.SettingError) as e:
        recipes.continued(**_ARGS, decay_steps=5, branches=branches)
    assert message in str(e.value)


@pytest.mark.parametrize("name, tasks, merged", [
    ("native/continue.gin", ["xlmeta_english_text"], False),
    ("native/meta_continue.gin", ["xlmeta_english_text", "xlmeta_cc100"], False),
])
def test_run_files_bind_the_recipe(name, tasks, merged):
    gin_cli.apply_gin([name], ["MODEL_DIR = '/tmp/unused'",
                               "INITIAL_CHECKPOINT_PATH = '/tmp/unused_ckpt'",
                               "TEXT_FILES = ['/tmp/x.txt']", "ENGLISH_FILES = ['/tmp/x.txt']"],
                      finalize=False)
    phases = gin_cli.bound("xlmeta_jax.pretrain.trainer.train.phases", None)
    assert [p.task for p in phases] == tasks
    assert (gin_cli.bound("xlmeta_jax.pretrain.trainer.train.merge", None) is not None) == merged
    with_branches = gin_cli.bound("xlmeta_jax.pretrain.recipes.continued.branches", None)
    assert with_branches == []
