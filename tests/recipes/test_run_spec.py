"""``mmcse recipes run`` and ``mmcse ablate`` make their recipe flags from :class:`RecipeRunSpec`,
and the spec travels whole to the recipe code."""

from __future__ import annotations

import dataclasses

import pytest
from support.cli import run_main_output

import mmcse.reports.recipes as reports_recipes
from mmcse.errors import MmcseError
from mmcse.recipes.recipe import RecipeRunSpec

FLAGS = ["--cache-root", "/c", "--seeds", "2,3", "--model", "/m", "--max-steps", "5",
         "--set", "batch_size=16", "--set", 'method_args={"proj_dim": 8}', "--overwrite"]  # fmt: skip
WANT = RecipeRunSpec(
    "/c", (2, 3), "/m", 5, {"batch_size": 16, "method_args": {"proj_dim": 8}}, overwrite=True
)


@pytest.fixture
def specs(monkeypatch):
    seen = []
    monkeypatch.setattr(
        reports_recipes, "recipe_run", lambda name, spec, *a: seen.append(spec) or []
    )
    monkeypatch.setattr(
        reports_recipes, "ablate_run", lambda r, d, spec, *a: seen.append(spec) or []
    )
    return seen


@pytest.mark.parametrize(
    "command",
    [["recipes", "run", "mcse/wiki+flickr/bert"], ["ablate", "--recipe", "x", "--drop", "y"]],
)
def test_every_spec_field_is_a_flag_of_both_commands(command, specs, monkeypatch, capsys):
    given = {f.name for f in dataclasses.fields(RecipeRunSpec)}
    assert given == {"cache_root", "seeds", "model", "max_steps", "overrides", "overwrite"}
    code, _, err = run_main_output([*command, *FLAGS], monkeypatch, capsys)
    assert code == 0, err
    assert specs == [WANT]
    assert WANT.overrides["overwrite"] is True  # what each seed's TrainConfig gets


def test_no_flag_is_the_recipe_s_own_setting(specs, monkeypatch, capsys):
    run_main_output(["recipes", "run", "mcse/wiki+flickr/bert"], monkeypatch, capsys)
    assert specs == [RecipeRunSpec()]
    assert specs[0].seeds is None and specs[0].overrides == {}


def test_seeds_from_text_are_checked():
    assert RecipeRunSpec(seeds="0,1").seeds == (0, 1)
    with pytest.raises(MmcseError, match="comma-separated integers"):
        RecipeRunSpec(seeds="0,x")
    with pytest.raises(MmcseError, match="given more than once"):
        RecipeRunSpec(seeds=(1, 1))
