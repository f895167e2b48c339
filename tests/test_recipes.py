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


# mmBERT at 3,000 x 2^20 tokens: its 2.3 : 0.6 : 0.1 shares are whole numbers of steps of
# 16 x 64 (base 2,300, ext 600 / 2 of 16 x 128, decay 100 / 2), less the ramp's 3 x 32 x 2^10.
_M = 2 ** 20
_MMBERT = dict(task="xlmeta_cc100", optimizer=OptimizerConfig(learning_rate=8e-4),
               total_tokens=3000 * _M, batch_size=16, ramp_batches=(4, 8, 12),
               ramp_tokens=32 * 1024, base_length=64, ext_length=128, warmup_tokens=16 * 1024)


@pytest.mark.parametrize("options, stages", [
    ({}, [("ramp1", 128, 4, 64, None, 60), ("ramp2", 64, 8, 64, "ramp1", 60),
          ("ramp3", 43, 12, 64, "ramp2", 60), ("base", 2300 * 1024 - 96, 16, 64, "ramp3", 60),
          ("ext", 300 * 1024, 16, 128, "base", None), ("decay_eng", 50 * 1024, 16, 128, "ext", 30),
          ("decay_cont", 50 * 1024, 16, 128, "ext", None),
          ("decay_all", 50 * 1024, 16, 128, "ext", None)]),
    # No ramp; a stage's tokens given; one branch (no merge); a language list.
    (dict(ramp_batches=(), ext_tokens=16 * 128 * 10, branches=["decay_all"],
          base_languages=["de", "fr"]),
     [("base", 2300 * 1024, 16, 64, None, 2), ("ext", 10, 16, 128, "base", None),
      ("decay_all", 50 * 1024, 16, 128, "ext", None)]),
])
def test_mmbert_stages_take_its_shares_of_the_budget(options, stages):
    recipe = recipes.mmbert(**{**_MMBERT, **options})
    got = [(p.name, p.num_steps, p.batch_size, p.sequence_length, p.init_from,
            None if p.languages is None else len(p.languages)) for p in recipe.phases]
    assert got == stages
    # One warm-up-stable-decay schedule over a branch's chain, the decay the branch's.
    chain = [p for p in recipe.phases if p.init_from != "ext"] + [recipe.phases[-1]]
    opt = recipe.phases[0].optimizer
    assert all(p.optimizer == opt for p in recipe.phases)
    assert (opt.schedule, opt.decay_shape, opt.total_steps, opt.decay_steps) == (
        "wsd", "1-sqrt", sum(p.num_steps for p in chain), recipe.phases[-1].num_steps)
    assert opt.warmup_steps == 16 * 1024 // (recipe.phases[0].batch_size * 64)  # 64 or 16
    assert not any(p.reset_optimizer or p.reset_schedule for p in recipe.phases)
    branches = [p.name for p in recipe.phases if p.init_from == "ext"]
    if len(branches) == 1:  # the branch is the product
        assert recipe.merge is None
    else:
        assert recipe.merge.base == "ext" and recipe.merge.method == "ties"
        assert list(recipe.merge.branches) == branches
    by_name = {p.name: p for p in recipe.phases}
    assert by_name["ext"].global_rope_theta == by_name["ext"].local_rope_theta == 160000.0
    assert (by_name["base"].alpha, by_name["base"].mask_rate) == (0.7, 0.3)
    if "decay_eng" in by_name:  # the largest by CC-100 size, sampled by size
        assert by_name["decay_eng"].languages[:3] == ("en", "vi", "ru")
        assert by_name["decay_eng"].alpha == 1.0


def test_mmbert_after_an_english_stage_takes_the_rest_of_the_budget():
    english = 600 * _M
    meta = recipes.mmbert(**_MMBERT, english_tokens=english, english_task="xlmeta_english_text")
    alone = recipes.mmbert(**{**_MMBERT, "total_tokens": 3000 * _M - english})
    first, *rest = meta.phases
    assert (first.name, first.task, first.num_steps, first.languages, first.mask_rate) == (
        "english", "xlmeta_english_text", english // (16 * 64), None, 0.3)
    assert (first.optimizer.schedule, first.optimizer.total_steps,
            first.optimizer.end_learning_rate) == ("linear", first.num_steps, 0.0)
    assert rest[0].init_from == "english" and rest[0].reset_optimizer and rest[0].reset_schedule
    assert [p.num_steps for p in rest] == [p.num_steps for p in alone.phases]
    with pytest.raises(errors.SettingError, match="english_task: must name"):
        recipes.mmbert(**_MMBERT, english_tokens=english)


@pytest.mark.parametrize("bindings, line", [
    # A stage's own setting through the recipe's overrides.
    (["xlmeta_jax.pretrain.recipes.annealed.overrides = {'stage2': {'use_cached': True}}"],
     None),
    # A scoped Phase binding would do nothing now: refused, naming the overrides.
    (["stage2/xlmeta_jax.pretrain.trainer.Phase.reset_schedule = True"],
     "stage2/xlmeta_jax.pretrain.trainer.Phase.reset_schedule: this run's stages are built by "
     "xlmeta_jax.pretrain.recipes.annealed, not by scoped Phase bindings; bind "
     "xlmeta_jax.pretrain.recipes.annealed.overrides = {'stage2': {'reset_schedule': ...}} "
     "(or the recipe's own parameter)"),
    (["xlmeta_jax.pretrain.recipes.annealed.overrides = {'stage9': {'use_cached': True}}"],
     "xlmeta_jax.pretrain.recipes.annealed.overrides: 'stage9' is not a stage of the recipe "
     "(stage1, stage2, stage3)"),
    (["xlmeta_jax.pretrain.recipes.annealed.overrides = {'stage1': {'num_steps': 5}}"],
     "xlmeta_jax.pretrain.recipes.annealed.overrides: ['num_steps'] are the recipe's own: "
     "bind its parameters"),
    (["xlmeta_jax.pretrain.recipes.annealed.overrides = {'stage1': {'mask_rate': 2.0}}"],
     "stage 'stage1': xlmeta_jax.pretrain.recipes.annealed.overrides: masking rate must be a "
     "number in (0, 1), got 2.0"),
])
def test_a_stage_of_a_recipe_is_set_through_its_overrides(bindings, line):
    gin_cli.apply_gin(["native/annealed.gin"], ["MODEL_DIR = '/unused'",
                                                "VOCAB_PATH = '/unused.model'", *bindings],
                      finalize=False)
    if line is None:
        phases = gin_cli.bound("xlmeta_jax.pretrain.trainer.train.phases", None)
        assert [p.use_cached for p in phases] == [None, True, None]
        return
    with pytest.raises(errors.UserError) as e:
        gin_cli.bound("xlmeta_jax.pretrain.trainer.train.phases", None)
    assert errors.user_message(e.value) == line


@pytest.mark.parametrize("options, phase2", [
    ({}, (3e-4, 10, 40)),  # phase 2's fresh schedule: phase 1's peak and warm-up
    (dict(phase2_learning_rate=1e-4, phase2_warmup_steps=5), (1e-4, 5, 40)),
])
def test_meta_recipe_hands_phase_2_fresh_moments_and_schedule(options, phase2):
    opt = OptimizerConfig(learning_rate=3e-4, warmup_steps=10)
    recipe = recipes.meta(english_task="xlmeta_english_text", xling_mixture="xlmeta_cc100",
                          meta_steps=20, xling_steps=40, batch_size=8, sequence_length=64,
                          optimizer=opt, **options)
    p1, p2 = recipe.phases
    assert (p1.name, p1.task, p1.num_steps, p1.optimizer.total_steps) == (
        "phase1", "xlmeta_english_text", 20, 20)
    assert (p2.name, p2.task, p2.init_from, p2.reset_optimizer, p2.reset_schedule) == (
        "phase2", "xlmeta_cc100", "phase1", True, True)
    assert (p2.optimizer.learning_rate, p2.optimizer.warmup_steps,
            p2.optimizer.total_steps) == phase2
    assert recipe.merge is None
    (one,) = recipes.xlmr(xling_mixture="xlmeta_cc100", steps=60, batch_size=8,
                          sequence_length=64, optimizer=opt).phases
    assert (one.name, one.num_steps, one.optimizer.total_steps, one.init_from) == (
        "xlmr", 60, 60, None)
    # Both see the same tokens.
    assert sum(p.num_steps * p.tokens_per_step() for p in recipe.phases) == (
        one.num_steps * one.tokens_per_step())
