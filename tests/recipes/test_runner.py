"""The one rows × seeds runner (issue 40, item 5): ablations plan, skip finished seeds and say
their plan as table runs do, and every Welch test is written the way ``mmcse compare`` writes a
best mark's evidence."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from scipy import stats

import cli
from mmcse.files import write_json
from mmcse.recipes import Recipe, get_recipe
from mmcse.recipes import runs as recipes_mod
from mmcse.recipes.ablate import ablation_layout, parse_drops
from mmcse.recipes.published import TASKS
from mmcse.recipes.recipe import RecipeRunSpec
from mmcse.recipes.runner import welch
from mmcse.recipes.table_run import plan_table, select, table_rows
from mmcse.reports.recipes import paper_table
from mmcse.reports.tables import Evidence, welch_text
from mmcse.rundir import RunDir

ABLATED = "mcse/wiki+flickr/bert"


def scores(seed: int, shift: float = 0.0) -> dict[str, float]:
    """Per-task numbers of a seed whose avg is ``70 + shift + seed`` (a known spread)."""
    return {**{t: 70.0 + shift + seed for t in TASKS}, "avg": 70.0 + shift + seed}


def finished_seed(recipe: Recipe, spec: RecipeRunSpec, seeds_dir: Path, seed: int, avg_shift=0.0):
    """A finished run of ``recipe`` as ``spec`` says, in ``seeds_dir/seed<k>``, that recorded
    its final STS numbers."""
    run = RunDir(seeds_dir / f"seed{seed}")
    run.path.mkdir(parents=True)
    write_json(run.config, recipe.config(spec, seed=seed, output_dir=run.path).to_dict())
    run.best.path.mkdir()
    write_json(run.best.run_info, {"step": 2, "finished": True})
    run.write_results("sts", scores(seed, avg_shift), source="final")


@pytest.mark.parametrize(
    ("n", "others", "p", "text"),
    [
        (3, 3, 0.0004, "n=3 vs 3, p<0.001"),
        (3, 4, 0.0123, "n=3 vs 4, p=0.012"),
        (2, 3, 0.2, "n=2 vs 3, p=0.200, low power"),
        (1, 3, None, "n=1 vs 3, no test (needs 2 seeds a side)"),
        (3, 3, None, "n=3 vs 3, no test (no variance)"),
    ],
)
def test_every_welch_test_is_written_one_way(n, others, p, text):
    assert welch_text(n, others, p) == text
    if p is not None:  # a best mark's evidence is the same text
        assert Evidence(n, others, p).text() == text


def test_welch_is_scipys_two_sided_unequal_variance_test():
    a, b = [75.1, 75.9, 76.4], [74.0, 74.2, 75.3, 74.9]
    test = welch("full", a, b)
    assert (test.n, test.others, test.against) == (3, 4, "full")
    assert test.p == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert welch("full", [1.0], b).p is None


def test_an_ablation_skips_a_finished_seed_says_its_plan_and_writes_p_as_compare(
    monkeypatch, tmp_path, capsys, library_log
):
    """An ablation goes through the runner: the plan line, the skipped seed, the progress
    line, and its p column in compare's words."""
    recipe = get_recipe(ABLATED)
    spec = RecipeRunSpec(cache_root=str(tmp_path / "cache"), seeds=(0, 1))
    out = tmp_path / "abl"
    (_, _, full_dir, overrides), *_ = ablation_layout(recipe, parse_drops("image_text"), out)
    finished_seed(recipe, spec.with_overrides(overrides), full_dir, seed=0)
    trained = []

    def fake_train(cfg):
        trained.append(Path(cfg.output_dir).relative_to(out).as_posix())
        shift = -2.0 if cfg.method_args["image_text_weight"] == 0 else 0.0
        return scores(cfg.seed, shift)

    monkeypatch.setattr(recipes_mod, "train_one", fake_train)
    monkeypatch.setattr(Recipe, "check_cache", lambda self, root, overridden=(): None)
    monkeypatch.setattr(
        sys,
        "argv",
        ["mmcse", "ablate", "--recipe", ABLATED, "--drop", "image_text", "--seeds", "0,1"]
        + ["--cache-root", str(tmp_path / "cache"), "--output-dir", str(out)],
    )
    with pytest.raises(SystemExit) as done:
        cli.main()
    assert done.value.code in (0, None)
    printed = capsys.readouterr().out
    assert trained == ["full/seed1", "wo-image_text/seed0", "wo-image_text/seed1"]
    assert (
        f"ablation {ABLATED}: 2 row(s) x seeds 0,1 = 4 run(s): 1 finished (skipped), 0 to "
        "resume, 3 to train" in printed
    )
    assert f"ablation {ABLATED}: 1 of 4 runs done, running full seed 1, 2 left" in library_log()
    p = stats.ttest_ind([68.0, 69.0], [70.0, 71.0], equal_var=False).pvalue
    row = next(line for line in printed.splitlines() if line.startswith("| w/o image_text |"))
    assert f"| n=2 vs 2, p={p:.3f}, low power |" in row


def test_a_paper_tables_p_column_is_written_as_compare_writes_it(tmp_path):
    spec = RecipeRunSpec(cache_root=str(tmp_path / "cache"), seeds=(0, 1, 2))
    root = tmp_path / "runs"
    finished = {  # recipe: (avg shift, its finished seeds)
        "simcse/wiki+flickr/bert": (0.0, (0, 1, 2)),
        "mcse/wiki+flickr/bert": (3.0, (0, 1, 2)),
        "simcse/wiki+coco/bert": (0.0, (0, 1)),
        "mcse/wiki+coco/bert": (0.0, (0,)),
    }
    for name, (shift, seeds) in finished.items():
        for seed in seeds:
            finished_seed(get_recipe(name), spec, root / name, seed, shift)
    plan = plan_table(select(list(finished)), spec, root)
    table = paper_table(plan, write=False)
    p = stats.ttest_ind([73.0, 74.0, 75.0], [70.0, 71.0, 72.0], equal_var=False).pvalue
    assert f"| vs simcse/wiki+flickr/bert: n=3 vs 3, p={p:.3f} |" in table
    assert "| vs simcse/wiki+coco/bert: n=1 vs 2, no test (needs 2 seeds a side) |" in table
    recorded = table_rows(plan).record["tests"]  # the record keeps the numbers, not the text
    assert recorded["mcse/wiki+flickr/bert"]["p"] == pytest.approx(p)
    assert recorded["mcse/wiki+coco/bert"] == {
        "against": "simcse/wiki+coco/bert",
        "n": 1,
        "others": 2,
        "p": None,
    }
