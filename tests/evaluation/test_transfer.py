"""SentEval transfer tasks: probe, validation loops, file readers, CLI errors."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from support.cli import assert_one_error, run_main
from support.worlds import write_downstream
from typer.testing import CliRunner

import cli
from mmcse.errors import MmcseError
from mmcse.evaluation import probe
from mmcse.evaluation.transfer import (
    evaluate_transfer,
    format_transfer_table,
    load_transfer_task,
    mrpc_features,
    parse_tasks,
)


def blobs(n: int, dim: int, seed: int, shift: float = 1.5, classes: int = 2):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    centres = rng.standard_normal((classes, dim)) * shift
    return (centres[y] + rng.standard_normal((n, dim))).astype(np.float32), y


# ---- the probe -----------------------------------------------------------------------------


def test_torch_probe_agrees_with_sklearn_logistic_regression():
    """A weakly regularised SentEval probe and scikit-learn's LogisticRegression (lbfgs, near
    no penalty) learn the same classifier: same test predictions on nearly every point."""
    x, y = blobs(600, 12, seed=0, shift=1.0)
    ours = probe.LinearProbe(probe.SETTINGS["test"], dim=12, classes=2, l2reg=1e-5)
    ours.fit(x[:400], y[:400], validation_data=(x[400:450], y[400:450]))
    reference = LogisticRegression(C=1e4, max_iter=5000).fit(x[:400], y[:400])
    agree = float((ours.predict(x[450:]) == reference.predict(x[450:])).mean())
    assert agree >= 0.96, agree
    assert abs(ours.score(x[450:], y[450:]) - reference.score(x[450:], y[450:])) <= 0.03


def test_probe_is_deterministic_and_leaves_global_rng_alone():
    x, y = blobs(200, 6, seed=1)
    settings = probe.SETTINGS["fasttest"]
    np.random.seed(7)
    before = np.random.rand()
    np.random.seed(7)
    runs = []
    for _ in range(2):
        p = probe.LinearProbe(settings, 6, 2, 1e-4)
        p.fit(x, y, validation_split=0.05)
        runs.append(p.model.weight.detach().clone())
    assert np.random.rand() == before  # our streams are private
    assert (runs[0] == runs[1]).all()


def test_early_stopping_counter_is_never_reset_like_senteval(monkeypatch):
    """Dev accuracies .5 .6 .55 .7 .6 .6 ... with tenacity 2: SentEval stops after the 6th pass
    (misses at passes 3, 5, then the check at 6); a counter reset on improvement would need 7."""
    sequence = iter([0.5, 0.6, 0.55, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6])
    monkeypatch.setattr(probe.LinearProbe, "_accuracy", lambda self, x, y: next(sequence))
    settings = probe.ProbeSettings(kfold=2, optim="adam", batch_size=8, tenacity=2, epoch_size=1)
    x, y = blobs(20, 3, seed=2)
    p = probe.LinearProbe(settings, 3, 2, 0.0)
    assert p.fit(x, y, validation_data=(x, y)) == 0.7
    assert p.epochs_run == 6


def _sklearn_nested_cv(x, y, k):
    """SentEval's InnerKFoldClassifier with usepytorch=False, written out independently."""
    grid = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]
    tests = []
    outer = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
    for tr, te in outer.split(x, y):
        means = []
        for c in grid:
            inner = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
            accs = [
                LogisticRegression(C=c, random_state=1111)
                .fit(x[tr][a], y[tr][a])
                .score(x[tr][b], y[tr][b])
                for a, b in inner.split(x[tr], y[tr])
            ]
            means.append(round(100 * np.mean(accs), 2))
        best = grid[int(np.argmax(means))]
        model = LogisticRegression(C=best, random_state=1111).fit(x[tr], y[tr])
        tests.append(round(100 * model.score(x[te], y[te]), 2))
    return round(float(np.mean(tests)), 2)


def test_inner_kfold_matches_an_independent_sklearn_computation():
    x, y = blobs(48, 4, seed=3, shift=0.5)
    settings = replace(probe.SETTINGS["fasttest"], kfold=3, backend="sklearn")
    assert probe.inner_kfold(x, y, settings)["acc"] == _sklearn_nested_cv(x, y, 3)


def test_kfold_and_split_match_independent_sklearn_computations():
    x, y = blobs(150, 4, seed=4, shift=0.5, classes=3)
    settings = replace(probe.SETTINGS["fasttest"], kfold=3, backend="sklearn")
    out = probe.kfold(x[:100], y[:100], x[100:], y[100:], settings)
    grid = [2.0**t for t in range(-1, 6)]
    folds = StratifiedKFold(n_splits=3, shuffle=True, random_state=1111)
    cv = [
        round(100 * np.mean([LogisticRegression(C=c, random_state=1111).fit(x[a], y[a]).score(x[b], y[b])
                             for a, b in folds.split(x[:100], y[:100])]), 2)
        for c in grid
    ]  # fmt: skip
    best = grid[int(np.argmax(cv))]
    expected = LogisticRegression(C=best, random_state=1111).fit(x[:100], y[:100])
    assert out["reg"] == best and out["devacc"] == max(cv)
    assert out["acc"] == round(100 * expected.score(x[100:], y[100:]), 2)

    parts = {"train": slice(0, 80), "valid": slice(80, 110), "test": slice(110, 150)}
    split_out = probe.split(
        {k: x[s] for k, s in parts.items()}, {k: y[s] for k, s in parts.items()}, settings
    )
    grid = [2.0**t for t in range(-2, 4)]
    dev = [
        round(100 * LogisticRegression(C=c, random_state=1111).fit(x[:80], y[:80]).score(x[80:110], y[80:110]), 2)
        for c in grid
    ]  # fmt: skip
    best = grid[int(np.argmax(dev))]
    test = LogisticRegression(C=best, random_state=1111).fit(x[:80], y[:80]).score(x[110:], y[110:])
    assert split_out["acc"] == round(100 * test, 2) and split_out["devacc"] == max(dev)


def test_simcse_settings_are_the_released_ones():
    fast, full = probe.SETTINGS["fasttest"], probe.SETTINGS["test"]
    assert (fast.kfold, fast.optim, fast.batch_size, fast.tenacity, fast.epoch_size) == (
        5, "rmsprop", 128, 3, 2,
    )  # fmt: skip
    assert (full.kfold, full.optim, full.batch_size, full.tenacity, full.epoch_size) == (
        10, "adam", 64, 5, 4,
    )  # fmt: skip
    assert probe.TORCH_L2_GRID == (1e-5, 1e-4, 1e-3, 1e-2) and full.seed == 1111


def test_mrpc_features_are_abs_difference_and_product():
    a, b = np.array([[1.0, -2.0]]), np.array([[3.0, 1.0]])
    assert mrpc_features(a, b).tolist() == [[2.0, 3.0, 3.0, -2.0]]


# ---- SentEval-layout files -------------------------------------------------------------------


def test_readers_follow_senteval(tmp_path):
    down = write_downstream(tmp_path) / "downstream"
    subj = load_transfer_task(down, "SUBJ").splits["all"]
    assert len(subj.labels) == 60 and subj.labels.sum() == 30
    assert all(
        s[0] == "dog" for s, label in zip(subj.sentences, subj.labels, strict=True) if label == 1
    )
    keys = [(len(s), label) for s, label in zip(subj.sentences, subj.labels, strict=True)]
    assert keys == sorted(keys)  # SentEval sorts by (token count, label)
    trec = load_transfer_task(down, "TREC").splits
    assert len(trec["train"].labels) == 180 and set(trec["train"].labels) == set(range(6))
    assert all(s[0] != "fine" for s in trec["test"].sentences)  # the fine label is dropped
    mrpc = load_transfer_task(down, "MRPC").splits
    assert len(mrpc["train"].labels) == 90 and len(mrpc["test"].second) == 30
    assert parse_tasks("mr,sst-2,TREC") == ["MR", "SST2", "TREC"]
    with pytest.raises(MmcseError, match="unknown transfer task"):
        parse_tasks("MR,SNLI")


def test_real_senteval_files_have_the_published_sizes(shared_data):
    down = shared_data / "senteval" / "downstream"
    sizes = {
        name: {k: len(v.labels) for k, v in load_transfer_task(down, name).splits.items()}
        for name in ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
    }
    assert sizes == {
        "MR": {"all": 10662},
        "CR": {"all": 3775},
        "SUBJ": {"all": 10000},
        "MPQA": {"all": 10606},
        "SST2": {"train": 67349, "dev": 872, "test": 1821},
        "TREC": {"train": 5452, "test": 500},
        "MRPC": {"train": 4076, "test": 1725},
    }


# ---- end to end ------------------------------------------------------------------------------


def test_evaluate_transfer_on_a_tiny_model_and_tiny_tasks(tiny_model, tmp_path):
    write_downstream(tmp_path)
    results = evaluate_transfer(
        str(tiny_model), data_dir=tmp_path, mode="fasttest", pooler="avg", device="cpu"
    )
    tasks = ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC"]
    assert list(results)[:7] == tasks
    assert all(0 <= results[t] <= 100 for t in tasks)
    details = results["details"]["tasks"]
    assert details["MR"]["ntest"] == 60 and details["SST2"]["ntest"] == 30
    assert len(details["MR"]["reg_per_fold"]) == 5  # fasttest: 5 outer folds
    assert results["avg"] == pytest.approx(sum(round(results[t], 2) for t in tasks) / 7)
    assert "f1" in results["details"]["tasks"]["MRPC"]
    table = format_transfer_table(results)
    header = [cell.strip() for cell in table.splitlines()[1].split("|")[1:-1]]
    assert header == ["MR", "CR", "SUBJ", "MPQA", "SST", "TREC", "MRPC", "Avg."]
    assert f"{results['avg']:.2f}" in table.splitlines()[3]


def test_cli_transfer_subset_and_missing_task_folder(tiny_model, tmp_path, monkeypatch, capsys):
    write_downstream(tmp_path / "ok")
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        cli.app,
        ["eval", "--model", str(tiny_model), "--tasks", "MR,TREC", "--transfer-mode", "fasttest",
         "--data", str(tmp_path / "ok"), "--device", "cpu", "--pooler", "avg", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())["transfer"]
    assert set(saved) == {"MR", "TREC", "avg", "details"}

    (tmp_path / "bad" / "downstream").mkdir(parents=True)
    args = [
        "eval",
        "--model",
        str(tiny_model),
        "--tasks",
        "transfer",
        "--data",
        str(tmp_path / "bad"),
    ]
    assert_one_error_line(monkeypatch, capsys, args, "SentEval task folder")
    assert_one_error_line(
        monkeypatch, capsys, ["eval", "--model", "x", "--tasks", "sts,SNLI"], "SNLI"
    )


def assert_one_error_line(monkeypatch, capsys, args: list[str], message: str) -> None:
    monkeypatch.setattr(sys, "argv", ["mmcse", *args])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err, err


# ---- refused before any model work ------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "edit", "fragments"),
    [
        ("MR", ("MR/rt-polarity.pos", None), ["MR", "rt-polarity.pos", "rt-polarity.neg 30"]),
        ("SUBJ", ("SUBJ/subj.subjective", None), ["SUBJ", "subj.subjective 0"]),
        ("TREC", ("TREC/TREC_10.label", "ABBR"), ["TREC", "TREC_10.label", "ABBR 0, DESC 10"]),
        ("SST2", ("SST/binary/sentiment-dev", "\t0"), ["SST2", "sentiment-dev", "label 0 0"]),
    ],
)
def test_a_split_with_an_empty_class_is_refused_with_its_counts(
    tiny_model, tmp_path, monkeypatch, capsys, no_model_load, task, edit, fragments
):
    """MR from its negatives alone scored 100.00: every class must be in every split."""
    write_downstream(tmp_path)
    path, drop = edit
    file = tmp_path / "downstream" / path
    keep = [] if drop is None else [ln for ln in file.read_text().splitlines() if drop not in ln]
    file.write_text("".join(f"{line}\n" for line in keep))
    with pytest.raises(MmcseError, match="gives no sentence of class"):
        load_transfer_task(tmp_path / "downstream", task)
    args = ["eval", "--model", str(tiny_model), "--tasks", task, "--data", str(tmp_path)]
    code, stderr = run_main(args, monkeypatch, capsys)
    assert_one_error(code, stderr, *fragments)


def test_an_unknown_transfer_mode_is_refused_before_any_model_work(
    tiny_model, tmp_path, monkeypatch, capsys, no_model_load
):
    write_downstream(tmp_path)
    fixture = Path(__file__).parents[1] / "fixtures" / "senteval_mini" / "downstream"
    for folder in ("STS", "SICK"):  # STS ran first, then the mode was refused
        shutil.copytree(fixture / folder, tmp_path / "downstream" / folder)
    for tasks in ("sts,transfer", "MR"):
        args = ["eval", "--model", str(tiny_model), "--tasks", tasks, "--data", str(tmp_path),
                "--transfer-mode", "bogus"]  # fmt: skip
        code, stderr = run_main(args, monkeypatch, capsys)
        assert_one_error(code, stderr, "--transfer-mode 'bogus'", "fasttest or test")


def test_eval_records_transfer_per_task_shows_progress_and_keeps_earlier_tasks(
    tiny_model, tmp_path, caplog
):
    import logging
    import shutil

    from mmcse.evaluation.evaluate import evaluate_model
    from mmcse.evaluation.request import EvalRequest
    from mmcse.reports.results import merge_results, run_result
    from mmcse.rundir import BEST_DIR, RunDir

    write_downstream(tmp_path)
    run = RunDir(tmp_path / "run")
    shutil.copytree(tiny_model, run.best.path)
    (run.path / BEST_DIR / "mmcse_run.json").write_text(json.dumps({"pooler": "avg"}))

    def evaluate(tasks: str) -> list[str]:
        request = EvalRequest(str(run.path), tasks=tasks, data=str(tmp_path),
                              transfer_mode="fasttest", device="cpu")  # fmt: skip
        return list(evaluate_model(request))

    with caplog.at_level(logging.INFO, logger="mmcse.evaluation.transfer"):
        evaluate("CR")
    progress = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("CR (1 of 1): nested 5-fold") and "probes" in m for m in progress)
    assert sum(m.startswith("CR fold ") for m in progress) == 5  # one line per outer fold
    first = run_result(run, "transfer")["CR"]

    evaluate("TREC")  # a later TREC-only call
    merged = merge_results(run.read_result_entries("transfer"))
    assert len(merged) == 1 and merged[0]["CR"] == first and "TREC" in merged[0]
    assert merged[0]["details"]["protocol"]["mode"] == "fasttest"
    assert merged[0]["details"]["environment"]["packages"]["torch"]

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mmcse.rundir"):
        evaluate("CR")  # the same task and protocol again: replaces its one entry
    assert any("CR" in r.getMessage() and "replaces" in r.getMessage() for r in caplog.records)
    entries = run.read_result_entries("transfer")
    assert sum("CR" in e["scores"] for e in entries) == 1
    assert set(merge_results(entries)[0]) >= {"CR", "TREC", "avg"}


def test_the_progress_total_is_the_number_of_probes_each_scheme_fits():
    x, y = blobs(150, 4, seed=4, shift=0.5, classes=3)
    settings = replace(probe.SETTINGS["fasttest"], kfold=3, backend="sklearn")
    counted, milestones = [], []
    progress = probe.Progress(fitted=lambda: counted.append(1), milestone=milestones.append)

    probe.inner_kfold(x[:60], y[:60], settings, progress)
    assert len(counted) == probe.fits("inner_kfold", settings) == 3 * (3 * 6 + 1)
    assert [m.split(":")[0] for m in milestones] == ["fold 1/3", "fold 2/3", "fold 3/3"]
    counted.clear()
    probe.kfold(x[:100], y[:100], x[100:], y[100:], settings, progress)
    assert len(counted) == probe.fits("kfold", settings) == 3 * 7 + 1
    counted.clear()
    parts = {"train": slice(0, 80), "valid": slice(80, 110), "test": slice(110, 150)}
    probe.split({k: x[s] for k, s in parts.items()}, {k: y[s] for k, s in parts.items()},
                settings, progress)  # fmt: skip
    assert len(counted) == probe.fits("split", settings) == 6 + 1
