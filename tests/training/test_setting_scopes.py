"""Each training setting declares one scope; what a resume may change, what seeds of one setting
differ in, what a recipe run departs in and what a seed folder must match all follow from it.

Every consumer is checked over every field: change one setting, and the consumer must react as
the field's scope says (another run, or the same run carried out otherwise).
"""

from __future__ import annotations

import dataclasses

import pytest

from mmcse.errors import MmcseError
from mmcse.files import write_json
from mmcse.recipes import get_recipe
from mmcse.recipes.recipe import RecipeRunSpec
from mmcse.recipes.runs import departures, setting_changes
from mmcse.reports import runs as report_runs
from mmcse.training import checkpoint as ckpt
from mmcse.training import config as config_mod
from mmcse.training.config import (
    PER_RUN_SETTINGS,
    RESUMABLE_CHANGES,
    SCOPE_SEED,
    SCOPE_SESSION,
    SCOPE_SETUP,
    SCOPES,
    GivenSettings,
    TrainConfig,
    same_setting,
)

FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
#: the saved run each check starts from: started with --overwrite, so "--no-overwrite" changes it
SAVED = {"overwrite": True, "features": {"image": "feats"}}
#: values no generic rule below finds (free strings and dicts)
OTHER = {
    "model": "other-model",
    "method": "dalr",
    "method_args": {"temperature": 0.1},
    "text_corpus": "other.txt",
    "text_field": "sentence",
    "caption_corpus": "captions",
    "features": {"image": "other-feats"},
    "expect_fingerprints": {"image": "0" * 64},
    "output_dir": "elsewhere",
    "token_cache": "off",
    "eval_data": "senteval-elsewhere",
    "pooler": "avg",
    "device": "cpu",
    "packing": False,  # the default None is auto, resolved at setup
}


def scope(name: str) -> str:
    return FIELDS[name].metadata["scope"]


def other_value(name: str, saved: dict):
    """A valid value of setting ``name`` other than ``saved[name]``."""
    meta, value = FIELDS[name].metadata, saved[name]
    if name in OTHER:
        assert OTHER[name] != value
        return OTHER[name]
    if "choices" in meta:
        return next(c for c in meta["choices"] if c != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5  # every float setting allows it (dropout < 1, eps < 1, ...)
    raise AssertionError(f"no other value for {name}: add it to OTHER")


def saved_config(**changes) -> dict:
    return TrainConfig(**{**SAVED, **changes}).to_dict()


def test_every_setting_declares_exactly_one_known_scope():
    bad = {
        n: f.metadata.get("scope")
        for n, f in FIELDS.items()
        if f.metadata.get("scope") not in SCOPES
    }
    assert bad == {}
    assert all(isinstance(f.metadata["scope"], str) for f in FIELDS.values())


def test_asking_for_an_unknown_scope_is_a_bug_named_at_once():
    with pytest.raises(ValueError, match="unknown setting scope"):
        config_mod.settings_of_scope("sesion")


def test_the_lists_are_derived_from_the_scopes_and_read_by_their_consumers():
    assert set(RESUMABLE_CHANGES) == {n for n in FIELDS if scope(n) == SCOPE_SESSION}
    assert set(PER_RUN_SETTINGS) == {n for n in FIELDS if scope(n) in (SCOPE_SEED, SCOPE_SESSION)}
    assert ckpt.RESUMABLE_CHANGES is config_mod.RESUMABLE_CHANGES
    assert report_runs.PER_RUN_SETTINGS is config_mod.PER_RUN_SETTINGS
    # the decisions this derivation made (issue 40): where a run goes, how it is watched, on
    # which device, what it keeps and where its evaluation data lies; the seed tells seeds apart
    assert set(RESUMABLE_CHANGES) == {
        "output_dir",
        "overwrite",
        "save_every",
        "report_to",
        "keep_last_checkpoint",
        "log_every",
        "device",
        "final_eval",
        "eval_data",
    }
    assert set(PER_RUN_SETTINGS) - set(RESUMABLE_CHANGES) == {"seed"}


@pytest.mark.parametrize("name", sorted(set(FIELDS) - {"output_dir"}))  # output_dir: the run's
def test_a_resume_may_change_exactly_the_session_settings(name, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    saved = saved_config(output_dir=str(run))
    write_json(run / "config.json", saved)
    other = other_value(name, saved)
    given = GivenSettings({name: other})
    if scope(name) == SCOPE_SESSION:
        assert getattr(ckpt.resume_config(run, None, given), name) == other
    else:
        with pytest.raises(MmcseError, match=name) as info:
            ckpt.resume_config(run, None, given)
        assert "\n" not in str(info.value)


def test_a_resume_refuses_overwrite_naming_both_flags(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_json(run / "config.json", saved_config(output_dir=str(run)))
    with pytest.raises(MmcseError, match="--resume .* --overwrite would replace it"):
        ckpt.resume_config(run, None, GivenSettings({"overwrite": True}))


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_a_seed_folder_holds_this_seeds_run_whatever_its_session(name):
    saved = saved_config()
    now = {**saved, name: other_value(name, saved)}
    changed = setting_changes(saved, now)
    assert changed == ({} if scope(name) == SCOPE_SESSION else {name: now[name]})


def test_a_setting_resolved_at_setup_matches_what_it_was_resolved_to():
    # what setup made of the defaults
    saved = saved_config(pooler="avg", dynamic_padding=False, attn_implementation="eager")
    assert setting_changes(saved, saved_config()) == {}
    assert setting_changes(saved, saved_config(pooler="cls")) == {"pooler": "cls"}
    assert setting_changes(saved_config(), saved_config(dynamic_padding=False)) == {
        "dynamic_padding": False
    }
    setup_resolved = {"pooler", "dynamic_padding", "attn_implementation", "packing"}
    assert {n for n in FIELDS if scope(n) == SCOPE_SETUP} == setup_resolved
    assert not same_setting("learning_rate", 1e-5, FIELDS["learning_rate"].default)


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_seeds_of_one_setting_differ_only_in_per_run_settings(name, tmp_path):
    saved = saved_config()
    for label, config in (("a", saved), ("b", {**saved, name: other_value(name, saved)})):
        (tmp_path / label).mkdir()
        write_json(tmp_path / label / "config.json", config)
    a, b = (report_runs.setting_of(report_runs.Run(tmp_path / label)) for label in "ab")
    assert (a == b) == (name in PER_RUN_SETTINGS)


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_a_recipe_run_departs_in_every_setting_but_the_per_run_ones(name, tmp_path):
    """A ``--set`` of a per-run setting (``log_every``, ``device``, ``eval_data``, ...) is not
    labelled "[overridden]": the run is still the published setting."""
    recipe = get_recipe("mcse/wiki+flickr/bert")
    spec = RecipeRunSpec(cache_root=tmp_path, seeds=recipe.seeds)
    base = recipe.config(spec, seed=recipe.seeds[0], output_dir="-").to_dict()
    overrides = {name: other_value(name, base)}
    changed = departures(
        recipe, RecipeRunSpec(cache_root=tmp_path, seeds=recipe.seeds, overrides=overrides)
    )
    assert set(changed) == (set() if name in PER_RUN_SETTINGS else {name})
