"""mmcse compare: runs and seed folders in one table (md/csv/latex), best marked, published rows;
recipes run and ablate writing the same formats."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import cli
import mmcse.recipes.ablate as ablate_mod
import mmcse.recipes.runs as recipes_mod
from mmcse.recipes import Recipe, get_recipe
from mmcse.reports.compare_runs import compare_table, comparison
from mmcse.reports.published import COLUMNS, PUBLISHED

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
    # the recipe's runs are shifted up by 2: its avg is the best measured one, bold
    assert cells[0][avg].startswith("**") and not cells[2][avg].startswith("**")
    assert not cells[1][avg].startswith("**")  # published rows do not compete
    assert cells[0][0] == "mcse-recipe (n=2)" and "MCSE" in cells[1][-1] + cells[1][0]
    assert cells[0][header.index("MR")] == "–" and cells[2][header.index("MR")] == "80.00"


def test_csv_and_latex(runs):
    text = compare_table([runs["recipe"], runs["single"]], "csv")
    records = list(csv.DictReader(io.StringIO(text)))
    assert [r["label"] for r in records][::2] == ["mcse-recipe", "simcse"]
    mean = np.mean([sts_result(s, 2.0)["STS12"] for s in (0, 1)])
    assert float(records[0]["STS12 mean"]) == pytest.approx(mean, abs=1e-4)
    assert "avg" in records[0]["best"].split(";") and records[2]["MR mean"] == "80.0000"
    latex = compare_table([runs["recipe"], runs["single"]], "latex")
    assert latex.startswith(r"\begin{tabular}") and r"\textbf{" in latex and r"$\pm$" in latex
    assert "mcse-recipe (n=2)" in latex and latex.count(r"\\") >= 4


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
    assert code == 0 and "| simcse |" in out
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
    recipes_mod.run_recipe(recipe, cache_root=tmp_path, seeds=(0, 1), output_dir=tmp_path / "r")
    for suffix in (".md", ".csv", ".tex"):
        assert (tmp_path / "r" / f"results{suffix}").is_file()
    rows = list(csv.DictReader((tmp_path / "r" / "results.csv").open()))
    assert rows[0]["label"].startswith("published") and rows[1]["label"].startswith("this run")
    mean = np.mean([sts_result(s)["avg"] for s in (0, 1)])
    assert float(rows[1]["avg mean"]) == pytest.approx(mean, abs=1e-4)

    result = ablate_mod.ablate(
        get_recipe("dalr/wiki+flickr/bert"),
        ablate_mod.parse_drops("image_text"),
        cache_root=tmp_path,
        seeds=(0, 1),
        output_dir=tmp_path / "abl",
    )
    md, _ = ablate_mod.write_ablation(result, tmp_path / "abl" / "ablation.md")
    rows = list(csv.DictReader(md.with_suffix(".csv").open()))
    assert [r["label"] for r in rows] == ["full", "w/o image_text"]
    assert "avg" in rows[0]["best"].split(";")  # the full method wins: nothing was dropped
    assert "78.24" in rows[1]["published avg"]
    assert r"\textbf" in md.with_suffix(".tex").read_text()
