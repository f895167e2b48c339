"""The experiment: arms at equal compute, the joint mixture's English share, configuration
checks, resume bookkeeping and the dry-run estimate."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from xlmeta_jax.cli import experiment_runs
from xlmeta_jax.experiment import arms, plan, runner
from xlmeta_jax.model import network
from xlmeta_jax.model.optimizer import OptimizerConfig

BUDGET = arms.Budget(meta_steps=300, xling_steps=900, batch_size=32, sequence_length=128)
OPT = OptimizerConfig(learning_rate=1e-3, warmup_steps=60)


def _phases(arm, budget=BUDGET, opt=OPT):
    return arms.arm_phases(arm, budget, english_task="en_task", xling_mixture="xling_mix",
                           optimizer=opt)


# ----------------------------------------------------------------------------- arms


def test_meta_xlmr_joint_train_equal_tokens_xling_only_the_xling_part():
    tokens = {arm: arms.phase_tokens(_phases(arm)) for arm in arms.ARMS}
    per_step = 32 * 128
    assert tokens["meta"] == tokens["xlmr"] == tokens["joint"] == 1200 * per_step
    assert tokens["xling_only"] == 900 * per_step


def test_every_phase_shares_batch_length_peak_lr_and_warmup_with_its_own_schedule():
    for arm in arms.ARMS:
        for p in _phases(arm):
            assert (p.batch_size, p.sequence_length) == (32, 128)
            opt = p.optimizer_config()
            assert opt.learning_rate == 1e-3 and opt.warmup_steps == 60
            # The schedule ends exactly at the phase's last step (no steps at rate 0).
            assert opt.total_steps == p.num_steps


def test_meta_is_english_then_the_mixture_from_phase_one():
    p1, p2 = _phases("meta")
    assert (p1.name, p1.task, p1.num_steps, p1.init_from) == ("phase1", "en_task", 300, None)
    assert (p2.task, p2.num_steps, p2.init_from) == ("xling_mix", 900, "phase1")
    assert p2.reset_optimizer and p2.reset_schedule
    (x,) = _phases("xlmr")
    assert (x.task, x.num_steps, x.init_from) == ("xling_mix", 1200, None)
    (o,) = _phases("xling_only")
    assert (o.task, o.num_steps) == ("xling_mix", 900)
    (j,) = _phases("joint")
    assert (j.task, j.num_steps) == ("xlmeta_joint", 1200)
    assert BUDGET.english_share == 0.25


def test_unknown_arm_and_warmup_longer_than_a_phase_are_refused():
    with pytest.raises(arms.ArmError, match="unknown arm 'mbert'"):
        _phases("mbert")
    short = dataclasses.replace(BUDGET, meta_steps=50)
    with pytest.raises(arms.ArmError, match="phase 'phase1': warmup_steps=60 exceeds its 50"):
        _phases("meta", budget=short)


def test_joint_mixture_gives_english_the_meta_share_of_the_tokens(toy_cc100, shared_data,
                                                                     tmp_path):
    """tasks.register's xlmeta_joint: English at META / (META + XLING) of the blocks (every
    block is full, so of the tokens), the languages at their alpha rates in the rest."""
    seqio = pytest.importorskip("seqio")
    from xlmeta_jax.data import task_names as names
    from xlmeta_jax.data import tasks

    english = tmp_path / "english.txt"
    text = (shared_data / "english_pd" / "tinyshakespeare" / "input.txt").read_text()
    english.write_text("\n\n".join(p.replace("\n", " ") for p in text.split("\n\n")[:800]))
    budget = arms.Budget(meta_steps=100, xling_steps=300, batch_size=8, sequence_length=32)
    # 'en' stays out of the multilingual part so that every 'en' block is the English task's.
    langs = ["de", "ru", "ja", "sw"]
    tasks.register(vocab_path=toy_cc100["vocab"], cc100_dir=toy_cc100["cc_dir"],
                   languages=langs, english_files=[str(english)],
                   joint_english_share=budget.english_share)
    (joint,) = arms.arm_phases("joint", budget, english_task=names.ENGLISH_TEXT_TASK,
                               xling_mixture=names.CC100_MIXTURE, optimizer=OPT)
    mix = seqio.get_mixture_or_task(joint.task)
    total = sum(mix.get_rate(t) for t in mix.tasks)
    rate = {t.name: mix.get_rate(t) / total for t in mix.tasks}
    assert rate[names.ENGLISH_TEXT_TASK] == pytest.approx(0.25)
    q = tasks.language_probabilities(names.CC100_MIXTURE)
    for lang in langs:
        assert rate[names.cc100_task(lang)] == pytest.approx(0.75 * q[lang])

    length, n = 32, 3000
    ds = mix.get_dataset({"inputs": length, "targets": length}, shuffle=False, seed=3,
                         num_epochs=None, passthrough_features=["language"])
    blocks = list(ds.take(n).as_numpy_iterator())
    assert all(b["targets"].shape == (length,) and 0 not in b["targets"] for b in blocks)
    tokens = {}
    for b in blocks:
        lang = b["language"].decode()
        tokens[lang] = tokens.get(lang, 0) + len(b["targets"])
    english_share = tokens["en"] / sum(tokens.values())
    assert abs(english_share - 0.25) < 4 * np.sqrt(0.25 * 0.75 / n)


def test_joint_mixture_needs_both_corpora(toy_cc100):
    pytest.importorskip("seqio")
    from xlmeta_jax.data import tasks, text_files

    with pytest.raises(text_files.CorpusError, match="needs exactly one English corpus"):
        tasks.register(vocab_path=toy_cc100["vocab"], cc100_dir=toy_cc100["cc_dir"],
                       languages=["de"], joint_english_share=0.25)
    with pytest.raises(text_files.CorpusError, match=r"joint_english_share: must be in \(0, 1\)"):
        tasks.register(vocab_path=toy_cc100["vocab"], cc100_dir=toy_cc100["cc_dir"],
                       languages=["de"], joint_english_share=1.0)


# ----------------------------------------------------------------------------- configuration


def _experiment(model_dir, **overrides):
    kw = dict(
        name="test", model_dir=str(model_dir), arms=arms.ARMS, seeds=(0, 1),
        meta_steps=4, xling_steps=6, batch_size=8, sequence_length=32,
        model=network.EncoderConfig(vocab_size=100, num_layers=1, hidden_size=16, num_heads=2,
                                    mlp_dim=32, max_position_embeddings=34),
        optimizer=OptimizerConfig(warmup_steps=2), english_task="en_task",
        xling_mixture="xling_mix", tasks=("pawsx", "tatoeba"),
    )
    kw.update(overrides)
    return runner.experiment(**kw)


@pytest.mark.parametrize("overrides, message", [
    ({"arms": ("meta", "bert")}, "experiment.arms=\\['meta', 'bert'\\]"),
    ({"arms": ("meta", "meta")}, "expected distinct arms"),
    ({"seeds": (0, 0)}, "SEEDS \\(experiment.seeds\\) = \\[0, 0\\]"),
    ({"meta_steps": 0}, "experiment.meta_steps=0"),
    ({"tasks": ("xnli", "glue")}, "experiment.tasks="),
    ({"finetune_seeds": 0}, "experiment.finetune_seeds=0"),
    ({"optimizer": OptimizerConfig(warmup_steps=5)}, "warmup_steps=5 exceeds its 4 steps"),
])
def test_bad_settings_name_the_setting(tmp_path, overrides, message):
    with pytest.raises(runner.ExperimentError, match=message):
        _experiment(tmp_path, **overrides)


def _fake_finished_run(exp, arm, seed, seconds_per_step=0.5):
    """A run folder as the trainer leaves it (summary.json), without training."""
    run_dir = exp.run_dir(arm, seed)
    phases = exp.phases(arm)
    summary = {"model_dir": run_dir, "phases": [
        {"phase": p.name, "task": p.source(), "steps": p.num_steps, "steps_run_now": p.num_steps,
         "final_loss": 5.0, "final_accuracy": 0.1,
         "tokens": p.num_steps * p.batch_size * p.sequence_length,
         "wall_seconds_now": seconds_per_step * p.num_steps,
         "checkpoint": os.path.join(run_dir, p.name, str(p.num_steps)),
         "initialized_from": None} for p in phases]}
    if (merge := exp.merge(arm)) is not None:  # the trainer's merge step ends the run
        summary["phases"].append({"phase": merge.name, "task": "ties merge", "steps": 0,
                                  "steps_run_now": 0, "merged_now": True,
                                  "checkpoint": os.path.join(run_dir, merge.name, "0")})
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f)
    return summary


def _fake_results(exp, arm, seed, task, checkpoint, seconds=30.0):
    out = exp.eval_dir(arm, seed, task)
    os.makedirs(out, exist_ok=True)
    results = {"task": task, "metric": "accuracy",
               "languages": {"en": {"accuracy": 60.0}, "de": {"accuracy": 50.0}},
               "average": 55.0, "average_target": 50.0, "english": 60.0, "transfer_gap": 10.0,
               "model": {"checkpoint": checkpoint}, "total_seconds": seconds}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f)


def test_finished_work_is_found_and_a_changed_plan_is_refused(tmp_path):
    exp = _experiment(tmp_path)
    assert runner.pretraining_done(exp, "meta", 0) is None
    summary = _fake_finished_run(exp, "meta", 0)
    assert runner.pretraining_done(exp, "meta", 0) == summary
    ckpt = runner.final_checkpoint(exp, "meta", 0)
    assert ckpt == summary["phases"][-1]["checkpoint"]
    assert runner.evaluation_done(exp, "meta", 0, "pawsx", ckpt) is None
    _fake_results(exp, "meta", 0, "pawsx", ckpt)
    assert runner.evaluation_done(exp, "meta", 0, "pawsx", ckpt)["english"] == 60.0
    with pytest.raises(runner.ExperimentError, match="evaluates .* not this experiment's"):
        runner.evaluation_done(exp, "meta", 0, "pawsx", "/elsewhere/7")
    longer = _experiment(tmp_path, xling_steps=8)
    with pytest.raises(runner.ExperimentError, match="holds a finished run of phases"):
        runner.pretraining_done(longer, "meta", 0)

    # Phases with data of their own and a merge step (the mmBERT arms): the run's product
    # is the merge.
    for arm in ("annealed", "mmbert"):
        summary = _fake_finished_run(exp, arm, 0)
        assert runner.pretraining_done(exp, arm, 0) == summary
    assert runner.final_checkpoint(exp, "mmbert", 0) == os.path.join(
        exp.run_dir("mmbert", 0), "merged", "0")

    runner.check_model_dir(exp)
    runner.check_model_dir(exp)  # the same plan resumes
    with pytest.raises(runner.ExperimentError, match="another budget"):
        runner.check_model_dir(longer)


def test_finetune_command_of_an_evaluation(tmp_path):
    exp = _experiment(tmp_path, finetune_gin_files=("experiments/cpu_finetune.gin",),
                      data_dir=str(tmp_path / "data"), finetune_seeds=3)
    _fake_finished_run(exp, "joint", 1)
    argv = runner.finetune_argv(exp, "joint", 1, "pawsx")
    ckpt = runner.final_checkpoint(exp, "joint", 1)
    assert argv == [
        "--gin_file=finetune/pawsx.gin",
        "--gin_file=experiments/cpu_finetune.gin",
        f"--gin.DATA_DIR={str(tmp_path / 'data')!r}",
        f"--gin.INITIAL_CHECKPOINT_PATH={ckpt!r}",
        f"--gin.MODEL_DIR={exp.eval_dir('joint', 1, 'pawsx')!r}",
        "--gin.finetune.seed=3",
        "--seeds=3",
    ]


def test_plan_counts_what_is_left_and_estimates_from_finished_runs(tmp_path):
    exp = _experiment(tmp_path)
    # Every run but xlmr seed 1 finished at 0.5 s per step; every pawsx evaluation took 30 s.
    for arm in exp.arms:
        for seed in exp.seeds:
            if (arm, seed) != ("xlmr", 1):
                _fake_finished_run(exp, arm, seed, seconds_per_step=0.5)
                _fake_results(exp, arm, seed, "pawsx", runner.final_checkpoint(exp, arm, seed))
    text = plan.plan(exp, eval_seconds=lambda task: 100.0)
    assert "xlmr           1" in text and "to do" in text
    assert text.count("  done") == 7
    assert "evaluations: pawsx, tatoeba for every run: 16 (7 done)" in text
    # Left: xlmr seed 1 (10 steps) at 0.5 s; 9 evaluations at 100 s.
    assert "pretraining left: 10 steps in 1 phases ~ 5s" in text
    assert "pawsx 1 x 1m40s, tatoeba 8 x 1m40s ~ 15m00s" in text
    assert "estimated time left: 15m05s" in text


def test_plan_measures_the_step_when_nothing_ran_yet(tmp_path):
    exp = _experiment(tmp_path, arms=("xlmr",), seeds=(0,))
    text = plan.plan(exp, eval_seconds=lambda task: 60.0)
    assert "measured now on synthetic batches (without input pipeline)" in text
    step_s = float(text.split("step time ")[1].split("s ")[0])
    compile_s = float(text.split("compile ")[1].split("s per phase")[0])
    assert step_s > 0 and compile_s > 0
    # 10 steps in 1 phase, then 2 evaluations of 60 s.
    assert "pretraining left: 10 steps in 1 phases" in text
    assert "evaluation left: pawsx 1 x 1m00s, tatoeba 1 x 1m00s ~ 2m00s" in text


def test_annealed_arm_trains_meta_tokens_in_three_stages_on_one_schedule():
    stages = arms.arm_phases("annealed", BUDGET, english_task="en_task",
                             xling_mixture="xling_mix", optimizer=OPT,
                             languages=["sw", "en", "hi", "de", "ja", "fr", "th", "ru", "ar", "vi"])
    assert arms.phase_tokens(stages) == arms.phase_tokens(_phases("meta"))
    assert [p.num_steps for p in stages] == [840, 240, 120]
    # The largest languages first (CC-100 tokens), then more, then all ten.
    assert [p.languages for p in stages] == [
        ("en", "vi", "ru"), ("en", "vi", "ru", "de", "fr", "ar"),
        ("en", "vi", "ru", "de", "fr", "ar", "th", "hi", "ja", "sw")]
    assert [(p.alpha, p.mask_rate) for p in stages] == [(0.7, 0.3), (0.5, 0.15), (0.3, 0.05)]
    assert [p.init_from for p in stages] == [None, "stage1", "stage2"]
    assert not any(p.reset_optimizer or p.reset_schedule for p in stages)
    opt = stages[0].optimizer_config()
    assert all(p.optimizer_config() == opt for p in stages)
    assert (opt.schedule, opt.total_steps, opt.decay_steps, opt.decay_shape) == (
        "wsd", 1200, 120, "1-sqrt")
    assert opt.learning_rate == 1e-3 and opt.warmup_steps == 60
    assert "annealed" not in arms.ARMS and "annealed" in arms.ALL_ARMS


def test_a_recipe_arm_calls_its_recipe_with_the_users_bindings(clean_gin):
    """The arms call the recipe functions (gin's configurable of each, from the command):
    a recipe parameter the experiment's gin binds reaches the arm; the budget, the shape
    and the languages stay the arm's."""
    from xlmeta_jax.cli import flags as gin_cli

    langs = ["sw", "en", "hi", "de", "ja", "fr", "th", "ru", "ar", "vi"]
    gin_cli.apply_gin(["experiments/tiny.gin"], [
        "MODEL_DIR = '/unused'", "xlmeta_jax.pretrain.recipes.mmbert.ext_alpha = 0.45",
        "xlmeta_jax.pretrain.recipes.mmbert.merge_density = 0.5",
        "xlmeta_jax.pretrain.recipes.annealed.alphas = (0.9, 0.6, 0.2)",
        # The arm's own: ignored in favour of the budget's.
        "xlmeta_jax.pretrain.recipes.mmbert.batch_size = 4608"], finalize=False)
    configured = experiment_runs.recipes()
    settings = dict(english_task="en_task", xling_mixture="xling_mix", optimizer=OPT,
                    languages=langs, recipes=configured)
    mm = arms.arm_phases("mmbert", BUDGET, **settings)
    assert [(p.name, p.alpha, p.batch_size) for p in mm][:2] == [("base", 0.7, 32),
                                                                 ("ext", 0.45, 32)]
    assert arms.arm_merge("mmbert", BUDGET, **settings).density == 0.5
    annealed = arms.arm_phases("annealed", BUDGET, **settings)
    assert [p.alpha for p in annealed] == [0.9, 0.6, 0.2]
    # Without the command's configurables: the recipes' own defaults.
    plain = dict(settings, recipes=None)
    assert arms.arm_phases("mmbert", BUDGET, **plain)[1].alpha == 0.5
    assert arms.arm_merge("mmbert", BUDGET, **plain).density is None
    assert arms.arm_merge("meta", BUDGET, **plain) is None


def _chain_tokens(phases, last):
    """Tokens along the init_from chain ending at ``last`` (what the model has seen)."""
    by_name = {p.name: p for p in phases}
    total, p = 0, by_name[last]
    while p is not None:
        total += p.num_steps * p.batch_size * p.sequence_length
        p = by_name.get(p.init_from)
    return total


def test_mmbert_pair_trains_the_budget_with_and_without_the_english_stage():
    langs = ["sw", "en", "hi", "de", "ja", "fr", "th", "ru", "ar", "vi"]
    settings = dict(english_task="en_task", xling_mixture="xling_mix", optimizer=OPT,
                    languages=langs)
    stages = {arm: arms.arm_phases(arm, BUDGET, **settings) for arm in ("mmbert", "meta_mmbert")}
    mm, meta = stages["mmbert"], stages["meta_mmbert"]
    # mmBERT's 2.3 : 0.6 : 0.1 of 1200 steps' tokens; ext and the decay at twice the length.
    assert [(p.name, p.num_steps, p.sequence_length) for p in mm] == [
        ("base", 920, 128), ("ext", 120, 256), ("decay_cont", 20, 256), ("decay_all", 20, 256)]
    # The English stage takes meta's 300 steps; mmBERT's stages the other 900 steps' tokens.
    assert [(p.name, p.num_steps) for p in meta] == [
        ("english", 300), ("base", 690), ("ext", 90), ("decay_cont", 15), ("decay_all", 15)]
    # Each branch's chain sees the budget's tokens, within one rounded step of 2 x 128 tokens.
    budget = arms.phase_tokens(_phases("meta"))
    for phases in (mm, meta):
        for branch in ("decay_cont", "decay_all"):
            assert abs(_chain_tokens(phases, branch) - budget) <= 32 * 256
    # The recipe's settings per stage, and where each stage starts from.
    assert [(p.init_from, p.reset_optimizer, p.alpha, p.mask_rate, p.global_rope_theta)
            for p in meta[1:]] == [
        ("english", True, 0.7, 0.3, 1e4), ("base", False, 0.5, 0.15, 1.6e5),
        ("ext", False, 0.5, 0.05, 1.6e5), ("ext", False, 0.3, 0.05, 1.6e5)]
    assert mm[0].init_from is None and mm[0].languages == ("en", "vi", "ru", "de", "fr", "ar")
    assert mm[1].languages == tuple(p.languages for p in mm)[-1] and len(mm[1].languages) == 10
    opt = mm[0].optimizer_config()
    assert (opt.schedule, opt.total_steps, opt.decay_steps, opt.warmup_steps) == (
        "wsd", 920 + 120 + 20, 20, 60)
    # Both end in a TIES merge of the two branches against ext.
    merge = arms.arm_merge("meta_mmbert", BUDGET, **settings)
    assert (merge.branches, merge.base, merge.method) == (("decay_cont", "decay_all"), "ext",
                                                          "ties")
