"""mmcse compare: runs and seed folders in one table (md/csv/latex), best marked, published rows;
recipes run and ablate writing the same formats."""

from __future__ import annotations

import csv
import io
import json
import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from support.recipes import run_recipe

import cli
import mmcse.recipes.ablate as ablate_mod
import mmcse.recipes.runs as recipes_mod
from mmcse.errors import MmcseError
from mmcse.files import write_json
from mmcse.recipes import Recipe, get_recipe
from mmcse.recipes.layout import SeedsDir
from mmcse.recipes.published import COLUMNS, PUBLISHED
from mmcse.recipes.recipe import RecipeRunSpec
from mmcse.recipes.summary import welch_p
from mmcse.reports.compare_runs import compare_table, comparison
from mmcse.reports.recipes import recipe_tables, write_ablation
from mmcse.reports.tables import ALL_TITLES
from mmcse.rundir import RunDir

STS = [c for c in COLUMNS if c != "avg"]


def sts_result(seed: int, shift: float = 0.0) -> dict:
    rng = np.random.default_rng(seed)
    values = {c: float(70 + shift + rng.normal(0, 1)) for c in STS}
    values["avg"] = sum(values.values()) / len(STS)
    return values


def make_run(path: Path, sts: dict | None = None, transfer: dict | None = None, retrieval=None):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    if sts is not None:
        (path / "results.json").write_text(json.dumps({**sts, "details": {}}))
    if transfer is not None:
        details = {"mode": "test", "pooler": "cls"}
        (path / "transfer.json").write_text(json.dumps({**transfer, "details": details}))
    if retrieval is not None:
        (path / "retrieval.json").write_text(json.dumps(retrieval))
    return path


@pytest.fixture
def runs(tmp_path) -> dict[str, Path]:
    """A recipe's two seeds, and a single run with transfer and retrieval numbers."""
    recipe = tmp_path / "mcse-recipe"
    for seed in (0, 1):
        make_run(recipe / f"seed{seed}", sts_result(seed, shift=2.0))
    (recipe / "results.json").write_text(json.dumps({"recipe": {"name": "mcse/wiki+flickr/bert"}}))
    transfer = {"MR": 80.0, "CR": 85.0, "avg": 82.5}
    grounded = {d: {"R@1": 10.0, "R@5": 30.0, "R@10": 40.0, "medr": 12.0} for d in ("t2i", "i2t")}
    single = make_run(
        tmp_path / "simcse", sts_result(5), transfer, {"grounded": grounded, "raw": "n/a"}
    )
    return {"recipe": recipe, "single": single}


def test_means_stds_best_and_published_rows(runs):
    result = comparison([runs["recipe"], runs["single"]])
    rows, columns, measured = result.rows, result.columns, result.measured
    seeds = [sts_result(0, 2.0), sts_result(1, 2.0)]
    recipe_row = rows[0]
    for column in COLUMNS:
        values = [s[column] for s in seeds]
        assert recipe_row.mean[column] == pytest.approx(np.mean(values))
        assert recipe_row.std[column] == pytest.approx(np.std(values, ddof=1))
    assert rows[1].label == PUBLISHED["mcse/wiki+flickr/bert"][0].label.join(["published: ", ""])
    assert measured == [0, 2] and rows[2].label == "simcse"
    assert columns[:8] == list(COLUMNS) and "MR" in columns and "t2i R@1" in columns

    table = compare_table([runs["recipe"], runs["single"]], "md")
    lines = table.splitlines()
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    avg = header.index("Avg.")
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]]
    # the recipe's runs are shifted up by 2, but against one seed no difference is supported
    assert "**" not in table and cells[0][avg] == f"{np.mean([s['avg'] for s in seeds]):.2f} ± 0.09"
    assert cells[0][0] == "mcse-recipe (mcse/wiki+flickr/bert) (n=2)"  # the recipe: its method
    assert "MCSE" in cells[1][-1] + cells[1][0]
    assert cells[2][0] == "simcse (1 seed: not compared)"
    assert "a row of 1 seed is not compared" in table
    assert cells[0][header.index("MR")] == "–" and cells[2][header.index("MR")] == "80.00"


def test_csv_and_latex(runs):
    text = compare_table([runs["recipe"], runs["single"]], "csv")
    records = list(csv.DictReader(io.StringIO(text)))
    assert [r["label"] for r in records][::2] == ["mcse-recipe (mcse/wiki+flickr/bert)", "simcse"]
    mean = np.mean([sts_result(s, 2.0)["STS12"] for s in (0, 1)])
    assert float(records[0]["STS12 mean"]) == pytest.approx(mean, abs=1e-4)
    assert records[0]["best"] == "" and records[2]["MR mean"] == "80.0000"  # 1 seed: no best
    latex = compare_table([runs["recipe"], runs["single"]], "latex")
    assert latex.startswith(r"\begin{tabular}") and r"\textbf{" not in latex and r"$\pm$" in latex
    assert "mcse-recipe (mcse/wiki+flickr/bert) (n=2)" in latex and latex.count(r"\\") >= 4


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["mmcse", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_compare_and_its_errors(runs, tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "compare", str(runs["single"]), "--format", "md")
    assert code == 0 and "| simcse (1 seed: not compared) |" in out
    code, _, err = run_cli(monkeypatch, capsys, "compare", str(tmp_path / "nope"))
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(monkeypatch, capsys, "compare", str(tmp_path / "empty"))
    assert code == 2 and "no training run" in err
    code, _, err = run_cli(monkeypatch, capsys, "compare", str(runs["single"]), "--format", "xls")
    assert code == 2 and "md, csv or latex" in err


# ---- recipes run / ablate write the same formats ----------------------------------------------


def fake_train(cfg):
    dropped = sum(v == 0 for k, v in cfg.method_args.items() if k.endswith("_weight"))
    return sts_result(cfg.seed, shift=-1.5 * dropped)


def test_recipes_run_and_ablate_write_md_csv_latex(monkeypatch, tmp_path):
    monkeypatch.setattr(recipes_mod, "train_one", fake_train)
    monkeypatch.setattr(Recipe, "check_cache", lambda self, root, overridden=(): None)
    recipe = get_recipe("mcse/wiki+flickr/bert")
    recipe_tables(
        run_recipe(
            recipe, RecipeRunSpec(cache_root=tmp_path, seeds=(0, 1)), output_dir=tmp_path / "r"
        )
    )
    for suffix in (".md", ".csv", ".tex"):
        assert (tmp_path / "r" / f"results{suffix}").is_file()
    rows = list(csv.DictReader((tmp_path / "r" / "results.csv").open()))
    assert rows[0]["label"].startswith("published") and rows[1]["label"].startswith("this run")
    mean = np.mean([sts_result(s)["avg"] for s in (0, 1)])
    assert float(rows[1]["avg mean"]) == pytest.approx(mean, abs=1e-4)

    result = ablate_mod.ablate(
        get_recipe("dalr/wiki+flickr/bert"),
        ablate_mod.parse_drops("image_text"),
        RecipeRunSpec(cache_root=tmp_path, seeds=(0, 1)),
        output_dir=tmp_path / "abl",
    )
    md, _ = write_ablation(result, tmp_path / "abl" / "ablation.md")
    rows = list(csv.DictReader(md.with_suffix(".csv").open()))
    assert [r["label"] for r in rows] == ["full", "w/o image_text"]
    assert "avg" in rows[0]["best"].split(";")  # the full method wins: nothing was dropped
    assert "78.24" in rows[1]["published avg"]
    assert r"\textbf" in md.with_suffix(".tex").read_text()


# ---- like with like ----------------------------------------------------------------------------


def recorded_run(path: Path, config: dict | None = None, environment: dict | None = None):
    """A run folder with its config and best/ run info, results added with write_results."""
    run = RunDir(path)
    make_run(path)
    write_json(run.config, {"method": "simcse", "seed": 0, **(config or {})})
    run.best.path.mkdir()
    write_json(run.best.run_info, {"pooler": "cls", "environment": environment})
    return run


def with_protocol(scores: dict, mode: str = "test", data: str = "/data") -> dict:
    values = [v for k, v in scores.items() if k != "avg"]
    protocol = {"mode": mode, "pooler": "cls", "data": data}
    return {**scores, "avg": sum(values) / len(values), "details": {"protocol": protocol}}


def header_and_cells(table: str) -> tuple[list[str], list[list[str]]]:
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    return header, [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]]


def test_a_dev_score_never_lands_in_a_test_column(tmp_path):
    test_run = recorded_run(tmp_path / "tested")
    test_run.write_results("sts", with_protocol({t: 70.0 for t in STS}), source="final")
    dev_run = recorded_run(tmp_path / "dev-only")
    dev_run.write_results("sts", with_protocol({"STSBenchmark": 85.0, "SICKRelatedness": 80.0},
                                               mode="dev"))  # fmt: skip
    table = compare_table([test_run.path, dev_run.path])
    header, cells = header_and_cells(table)
    dev_row = cells[1]
    assert dev_row[header.index("STS-B")] == "–" and dev_row[header.index("Avg.")] == "–"
    assert dev_row[header.index("STS-B [dev]")] == "85.00"
    assert dev_row[header.index("Avg. [dev]")] == "82.50"
    assert "not test scores" in table  # the legend says what [dev] is


def test_an_average_over_fewer_tasks_is_its_own_column_and_never_ranked_against_all(tmp_path):
    full = recorded_run(tmp_path / "full")
    seven = {"MR": 80.0, "CR": 80.0, "SUBJ": 80.0, "MPQA": 80.0, "SST2": 80.0, "TREC": 80.0,
             "MRPC": 80.0}  # fmt: skip
    full.write_results("transfer", with_protocol(seven))
    two = recorded_run(tmp_path / "two")
    two.write_results("transfer", with_protocol({"MR": 90.0, "CR": 95.0}))
    fast = recorded_run(tmp_path / "fast")
    fast.write_results("transfer", with_protocol({**seven, "MR": 99.0}, mode="fasttest"))
    result = comparison([full.path, two.path, fast.path])
    header, cells = header_and_cells(result.render())
    whole, subset = header.index("Transfer Avg."), header.index("Transfer Avg. (MR, CR)")
    assert cells[0][whole] == "80.00" and cells[1][whole] == "–"
    assert cells[1][subset] == "92.50" and cells[0][subset] == "–"
    assert "**" not in cells[0][whole]  # alone in its column: nothing to beat
    fasttest = header.index("MR [fasttest]")
    assert cells[2][fasttest] == "99.00" and cells[2][header.index("MR")] == "–"
    assert cells[1][header.index("MR")] == "90.00"  # one seed each: nothing is marked
    assert any("fasttest" in n and "not the papers' protocol" in n for n in result.notes)


def test_numbers_measured_on_different_data_are_not_ranked_and_the_note_says_why(tmp_path):
    runs = []
    for name, data, value in (("x", "/data/a", 70.0), ("y", "/data/b", 75.0)):
        runs.append(recorded_run(tmp_path / name))
        runs[-1].write_results("sts", with_protocol({t: value for t in STS}, data=data))
    result = comparison([r.path for r in runs])
    assert "avg" in result.unranked and "**" not in result.render()
    note = next(n for n in result.notes if n.startswith("avg: not comparable"))
    assert "/data/a (x)" in note and "/data/b (y)" in note


def test_a_folder_of_two_methods_is_not_averaged_as_seeds(tmp_path, caplog):
    folder = tmp_path / "mixed"
    for seed, method, value in ((0, "simcse", 60.0), (1, "mcse", 70.0)):
        run = recorded_run(folder / f"seed{seed}", {"method": method, "seed": seed})
        run.write_results("sts", with_protocol({t: value for t in STS}), source="final")
    with caplog.at_level(logging.WARNING, logger="mmcse.reports.runs"):
        result = comparison([folder])
    labels = [r.label for r in result.rows]
    assert labels == ["mixed [method=simcse]", "mixed [method=mcse]"]
    assert [r.mean["avg"] for r in result.rows] == [60.0, 70.0]  # never their mean, 65
    warning = caplog.records[0].getMessage()
    assert "seed0: method=simcse" in warning and "seed1: method=mcse" in warning
    assert any("holds runs of 2 settings" in n for n in result.notes)


def test_seeds_of_one_setting_are_still_averaged(tmp_path):
    folder = tmp_path / "seeds"
    for seed, value in ((0, 60.0), (1, 70.0)):
        run = recorded_run(folder / f"seed{seed}", {"seed": seed, "output_dir": f"/o/{seed}"})
        run.write_results("sts", with_protocol({t: value for t in STS}), source="final")
    (row,) = comparison([folder]).rows
    assert row.mean["avg"] == 65.0 and row.n == 2


def test_an_overridden_recipe_run_is_marked_beside_the_published_rows(tmp_path):
    folder = tmp_path / "mcse-run"
    run = recorded_run(folder / "seed0")
    run.write_results("sts", with_protocol({t: 70.0 for t in STS}), source="final")
    write_json(SeedsDir(folder).results, {
        "recipe": {"name": "mcse/wiki+flickr/bert"},
        "overrides": {"learning_rate": {"recipe": 3e-5, "run": 1e-4}},
    })  # fmt: skip
    result = comparison([folder])
    assert result.rows[0].label.endswith("[overridden]")
    assert result.rows[1].label.startswith("published")
    note = next(n for n in result.notes if "[overridden]" in n)
    assert "learning_rate=0.0001 (recipe: 3e-05)" in note


def test_recipe_folders_of_two_methods_are_labelled_by_their_recipes(tmp_path):
    """SimCSE's and MCSE's ``<root>/<method>/wiki+coco/bert`` used to be labelled alike
    (``wiki+coco/bert [overridden]``): the label carries the recipe, so the method."""
    folders = []
    for method, score in (("simcse", 60.0), ("mcse", 70.0)):
        name = f"{method}/wiki+coco/bert"
        folder = tmp_path / "runs" / name
        run = recorded_run(folder / "seed0", {"method": method})
        run.write_results("sts", with_protocol({t: score for t in STS}), source="final")
        write_json(SeedsDir(folder).results, {
            "recipe": {"name": name},
            "overrides": {"learning_rate": {"recipe": 3e-5, "run": 1e-4}},
        })  # fmt: skip
        folders.append(folder)
    labels = [row.label for row in comparison(folders).rows if not row.label.startswith("pub")]
    assert labels == ["simcse/wiki+coco/bert [overridden]", "mcse/wiki+coco/bert [overridden]"]
    mine = tmp_path / "my-try"  # a folder the user named: its name, and the recipe's
    shutil.copytree(folders[1], mine)
    (row, *_) = comparison([mine / "seed0"]).rows
    assert row.label == "my-try (mcse/wiki+coco/bert)/seed0 [overridden]"


def test_compare_lists_where_the_environments_differ(tmp_path):
    def env(torch_version: str) -> dict:
        return {"python": {"version": "3.11.9"}, "packages": {"torch": torch_version},
                "device": {"name": "cpu", "model": "Xeon", "count": 1}}  # fmt: skip

    runs = [recorded_run(tmp_path / n, environment=env(v)) for n, v in (("p", "2.14.1"),
            ("q", "2.13.0"))]  # fmt: skip
    for run in runs:
        run.write_results("sts", with_protocol({t: 70.0 for t in STS}), source="final")
    notes = comparison([r.path for r in runs]).notes
    (line,) = [n for n in notes if n.startswith("Environments differ")]
    assert "torch 2.14.1 (p) vs 2.13.0 (q)" in line and "python" not in line
    same = [recorded_run(tmp_path / n, environment=env("2.14.1")) for n in ("r", "s")]
    for run in same:
        run.write_results("sts", with_protocol({t: 70.0 for t in STS}), source="final")
    assert not any("Environments" in n for n in comparison([r.path for r in same]).notes)


def test_mmcse_eval_records_sts_in_the_run_so_compare_counts_it_scored(tmp_path):
    from mmcse.evaluation.evaluate import evaluate_model
    from mmcse.evaluation.request import EvalRequest
    from mmcse.evaluation.sts import load_tasks
    from mmcse.tiny import build_tiny_bert

    fixture = Path(__file__).parents[1] / "fixtures" / "senteval_mini"
    texts = [s for task in load_tasks(fixture, "test") for s in task.sentences()]
    run = RunDir(tmp_path / "run")
    build_tiny_bert(run.best.path, texts=texts)
    write_json(run.best.run_info, {"pooler": "cls"})
    with pytest.raises(MmcseError, match="none of these runs has results"):
        compare_table([run.path])
    list(evaluate_model(EvalRequest(str(run.path), data=str(fixture), device="cpu")))
    entry = run.read_result_entries("sts")[-1]
    assert entry["source"] == "eval" and entry["protocol"]["mode"] == "test"
    assert entry["environment"]["packages"]["torch"]
    header, cells = header_and_cells(compare_table([run.path]))
    assert cells[0][header.index("source")] == "1 of 1 runs scored"
    assert cells[0][header.index("Avg.")] == f"{entry['avg']:.2f}"


def test_recipes_run_and_ablate_record_the_environment_of_their_runs(monkeypatch, tmp_path):
    def train_recording(cfg):
        torch_version = "2.13.0" if cfg.seed == 1 else "2.14.1"
        environment = {"packages": {"torch": torch_version}, "python": {"version": "3.11.9"}}
        best = RunDir(cfg.output_dir).best
        best.path.mkdir(parents=True)
        write_json(best.run_info, {"environment": environment})
        return fake_train(cfg)

    monkeypatch.setattr(recipes_mod, "train_one", train_recording)
    monkeypatch.setattr(Recipe, "check_cache", lambda self, root, overridden=(): None)
    recipe = get_recipe("mcse/wiki+flickr/bert")
    recipe_tables(
        run_recipe(
            recipe, RecipeRunSpec(cache_root=tmp_path, seeds=(0, 1)), output_dir=tmp_path / "r"
        )
    )
    record = json.loads(SeedsDir(tmp_path / "r").results.read_text())
    assert record["environment"]["packages"]["torch"] == "2.14.1"
    (difference,) = record["environment_differences"]
    assert (
        difference.startswith("torch 2.14.1") and "2.13.0" in difference and "seed 1" in difference
    )
    table = (tmp_path / "r" / "results.md").read_text()
    assert "Environment: " in table and "Environments differ: torch 2.14.1" in table

    result = ablate_mod.ablate(
        get_recipe("dalr/wiki+flickr/bert"),
        ablate_mod.parse_drops("image_text"),
        RecipeRunSpec(cache_root=tmp_path, seeds=(0,)),
        output_dir=tmp_path / "abl",
    )
    md, record_path = write_ablation(result, tmp_path / "abl" / "ablation.md")
    assert json.loads(record_path.read_text())["environment"]["packages"]["torch"] == "2.14.1"
    assert "Environment: " in md.read_text()


# ---- a best mark needs support; caveats; the base model's row -----------------------------------


def seed_folder(path: Path, avgs: list[float], data: str = "/data") -> Path:
    """Seed runs of one setting whose STS tasks all score the given value per seed."""
    for seed, value in enumerate(avgs):
        run = recorded_run(path / f"seed{seed}", {"seed": seed})
        scores = with_protocol({t: value for t in STS}, data=data)
        run.write_results("sts", scores, source="final")
    return path


def test_a_best_mark_needs_two_seeds_a_side_and_a_welch_test(tmp_path):
    low = seed_folder(tmp_path / "low", [60.0, 60.4, 59.8])
    clear = seed_folder(tmp_path / "clear", [70.0, 70.3, 69.9])  # far beyond its seed noise
    header, cells = header_and_cells(compare_table([low, clear]))
    assert cells[1][header.index("Avg.")].startswith("**70.07")
    noisy = seed_folder(tmp_path / "noisy", [55.0, 66.0, 59.0])
    close = seed_folder(tmp_path / "close", [61.0, 59.0, 62.0])  # best mean, within the noise
    table = compare_table([low, noisy, close])
    assert "**" not in table  # 60.67 vs 60.07 is no finding (Welch p > 0.05)
    assert "Welch t-test" in table and "a row of 1 seed is not compared" in table
    p = welch_p([70.0, 70.3, 69.9], [60.0, 60.4, 59.8])
    header, cells = header_and_cells(compare_table([low, clear]))
    assert p < 0.001 and cells[1][header.index("Avg.")].endswith("** (n=3 vs 3, p<0.001)")
    two = seed_folder(tmp_path / "two", [62.5, 63.0])
    header, cells = header_and_cells(compare_table([low, two]))
    p = welch_p([62.5, 63.0], [60.0, 60.4, 59.8])
    assert cells[1][header.index("Avg.")].endswith(f"** (n=2 vs 3, p={p:.3f}, low power)")
    assert "'low power': fewer than 3 seeds a side" in compare_table([low, two])
    records = list(csv.DictReader(io.StringIO(compare_table([low, two], "csv"))))
    assert 0.001 < p < 0.05 and records[1]["best evidence"].startswith("STS12: n=2 vs 3, p=")
    lower = recorded_run(tmp_path / "one-lower")
    lower.write_results("sts", with_protocol({t: 65.0 for t in STS}), source="final")
    header, cells = header_and_cells(compare_table([low, clear, lower.path]))
    assert cells[1][header.index("Avg.")].startswith("**")  # the seeded rows still compare
    assert cells[2][0] == "one-lower (1 seed: not compared)"
    higher = recorded_run(tmp_path / "one-higher")
    higher.write_results("sts", with_protocol({t: 75.0 for t in STS}), source="final")
    assert "**" not in compare_table([low, clear, higher.path])  # 75 of one seed: no best


def test_caveats_mark_unfinished_runs_random_teachers_and_the_batches_seen(tmp_path):
    run = recorded_run(tmp_path / "mcse", {"method": "mcse"})
    run.write_results("sts", with_protocol({t: 70.0 for t in STS}), source="final")
    random = {"teacher": "resnet50", "weights": "random", "producer": {"weights": "random"}}
    write_json(run.best.run_info, {"pooler": "cls", "finished": False, "step": 4,
                                   "total_steps": 10, "teachers": {"feature:image": random}})  # fmt: skip
    records = [{"step": 2, "loss": 1.0, "text_batches": 2, "caption_batches": 0},
               {"step": 4, "loss": 1.0, "text_batches": 1, "caption_batches": 1},
               {"step": 4, "stsb_dev": 50.0}]  # fmt: skip
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    plain = recorded_run(tmp_path / "simcse")
    plain.write_results("sts", with_protocol({t: 69.0 for t in STS}), source="final")
    table = compare_table([run.path, plain.path])
    header, cells = header_and_cells(table)
    caveat = cells[0][header.index("caveats")]
    assert "unfinished (step 4 of 10)" in caveat
    assert "random-weight teacher: feature:image" in caveat
    assert "batches seen: 3 text + 1 caption" in caveat
    assert cells[1][header.index("caveats")] == ""  # a text-only finished run: nothing to say
    assert "distil from noise" in table  # the legend says what the column means


def test_the_base_model_is_a_reference_row_scored_once_and_cached(tmp_path, monkeypatch):
    import mmcse.evaluation as evaluation
    from mmcse.evaluation.sts import load_tasks
    from mmcse.tiny import build_tiny_bert

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fixture = Path(__file__).parents[1] / "fixtures" / "senteval_mini"
    texts = [s for task in load_tasks(fixture, "test") for s in task.sentences()]
    base = build_tiny_bert(tmp_path / "base", texts=texts)
    # the runs were scored on the fixture: the base model is scored there too
    runs = [seed_folder(tmp_path / n, v, str(fixture / "downstream")) for n, v in (("a", [60.0, 60.1]),
                                                                    ("b", [70.0, 70.1]))]  # fmt: skip
    result = comparison([str(base), *runs])
    base_row = result.rows[0]
    label = f"{tmp_path.name}/base [base model, before fine-tuning]"
    assert base_row.label == label and 0 not in result.measured
    assert set(STS) <= set(base_row.mean) and "avg" not in result.unranked
    table = result.render()
    assert f"| {label} |" in table and "reference" in table

    def no_second_evaluation(*args, **kwargs):
        raise AssertionError("the cached base-model scores were not used")

    monkeypatch.setattr(evaluation, "evaluate_sts", no_second_evaluation)
    again = comparison([str(base), *runs])
    assert again.rows[0].mean == base_row.mean


# ---- seeds trained by hand, in sibling folders ------------------------------------------------

SENTEVAL_MINI = Path(__file__).resolve().parents[1] / "fixtures" / "senteval_mini"


def test_four_runs_trained_in_sibling_folders_are_two_rows_of_two_seeds(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    """Two methods x two seeds by ``mmcse train --seed K --output-dir runs/METHOD-sK``: two rows
    of n=2 and a note on what separates them; every mark carries its n and Welch p, and a mark
    is exactly where an independent Welch test on the recorded seeds supports it."""
    from scipy import stats
    from support.cli import run_main_output

    from mmcse.reports.runs import Run

    monkeypatch.chdir(tmp_path)
    folders = []
    for method in ("simcse", "mcse"):
        for seed in (0, 1):
            folder = f"runs/{method}-s{seed}"
            extra = ["--caption-corpus", tiny_world["captions"], "--feature",
                     f"image={tiny_world['image']}"] if method == "mcse" else []  # fmt: skip
            code, _, err = run_main_output(
                ["train", "--method", method, "--model", str(tiny_model), "--text-corpus",
                 tiny_world["text"], *extra, "--max-steps", "2", "--batch-size", "8", "--device",
                 "cpu", "--eval-data", str(SENTEVAL_MINI), "--seed", str(seed), "--output-dir",
                 folder], monkeypatch, capsys)  # fmt: skip
            assert code == 0, err[-2000:]
            folders.append(folder)
    code, out, err = run_main_output(["compare", *folders], monkeypatch, capsys)
    assert code == 0, err
    header, cells = header_and_cells(out)
    assert [c[0] for c in cells] == ["simcse-s{0,1} (n=2)", "mcse-s{0,1} (n=2)"]
    assert "What separates the rows (recorded configs): simcse-s{0,1}: method=simcse" in out
    assert "differ only in seed and output folder" in out
    scores = [[Run(Path(f)).scores() for f in pair] for pair in (folders[:2], folders[2:])]
    marks = 0
    for index, name in enumerate(header[1:-2], start=1):
        key = next(k for k in scores[0][0] if ALL_TITLES.get(k, k) == name)
        sides = [[s[key] for s in side] for side in scores]
        top = int(np.mean(sides[1]) > np.mean(sides[0]))
        p = stats.ttest_ind(sides[top], sides[1 - top], equal_var=False).pvalue
        cell = cells[top][index]
        if p < 0.05:
            assert cell.startswith("**") and f"(n=2 vs 2, p={p:.3f}, low power)" in cell, cell
            marks += 1
        else:
            assert "**" not in cells[0][index] + cells[1][index]
    assert out.count("**") == 2 * marks
    code, out, _ = run_main_output(["compare", "--no-group-seeds", *folders], monkeypatch, capsys)
    assert code == 0 and out.count("(1 seed: not compared)") == 4 and "**" not in out
