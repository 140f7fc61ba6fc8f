"""mmcse.rundir: the one owner of the run directory layout (paths, recognition, atomic writes,
finding runs), and no other library module spelling a name of that layout."""

from __future__ import annotations

import ast
import json
import logging
import os
import re
from pathlib import Path

import pytest

from mmcse import files, rundir
from mmcse.errors import MmcseError
from mmcse.files import atomic_dir, read_json, write_json
from mmcse.recipes import layout
from mmcse.recipes.layout import AblationDir, SeedsDir
from mmcse.reports.results import merge_results, run_result
from mmcse.rundir import (
    Checkpoint,
    RunDir,
    find_runs,
    is_checkpoint_dir,
    is_model_dir,
    is_run_dir,
    resolve_model_dir,
    run_of_checkpoint,
    run_of_model,
)

ROOT = Path(__file__).resolve().parents[1]


def make_checkpoint(path: Path, **info) -> Checkpoint:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    checkpoint = Checkpoint(path)
    if info:
        checkpoint.write_info(info)
    return checkpoint


# ---- layout -----------------------------------------------------------------------------------


def test_every_path_of_a_run(tmp_path):
    run = RunDir(str(tmp_path / "run"))  # a str is taken too
    assert run.path == tmp_path / "run"
    expected = {
        run.config: "config.json",
        run.plan: "plan.json",
        run.metrics: "metrics.jsonl",
        run.tensorboard: "tensorboard",
        run.results: "results.json",
        run.transfer: "transfer.json",
        run.retrieval: "retrieval.json",
        run.align_uniform: "align_uniform.json",
        run.training_curves: "training_curves.png",
        run.best.path: "best",
        run.last.path: "last",
    }
    assert {path: path.relative_to(run.path).as_posix() for path in expected} == expected
    assert [run.result_file(s).name for s in ("sts", "transfer", "retrieval")] == [
        "results.json", "transfer.json", "retrieval.json",
    ]  # fmt: skip
    last = run.last
    assert (last.heads, last.run_info, last.trainer_state, last.integrity) == (
        run.path / "last" / "mmcse_heads.safetensors",
        run.path / "last" / "mmcse_run.json",
        run.path / "last" / "trainer_state.pt",
        run.path / "last" / "mmcse_integrity.json",
    )
    assert not run.path.exists()  # naming a path creates nothing


# holds a run folder as a training process does, until killed
HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
from mmcse.rundir import RunDir
with RunDir(sys.argv[1]).lock():
    print("held", flush=True)
    time.sleep(600)
"""


def test_one_process_trains_into_a_run_folder_and_a_killed_one_leaves_it_free(tmp_path):
    import signal
    import subprocess
    import sys

    run = tmp_path / "run"
    script = HOLDER.format(root=str(Path(__file__).resolve().parents[1]))
    args = [sys.executable, "-c", script, str(run)]
    with subprocess.Popen(args, stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout.readline() == "held\n"
            with pytest.raises(MmcseError, match="is in use: another process is training"):
                RunDir(run).lock()
        finally:
            holder.send_signal(signal.SIGKILL)  # no clean-up: the kernel drops the lock
    with RunDir(run).lock():
        assert list(run.iterdir()) == []  # nothing written for the lock
    RunDir(run).lock().release()  # released on leaving


def test_seed_and_ablation_folders(tmp_path):
    seeds = SeedsDir(tmp_path / "mcse")
    assert seeds.seed(3) == RunDir(tmp_path / "mcse" / "seed3")
    assert seeds.results == tmp_path / "mcse" / "results.json"
    assert seeds.tables == tmp_path / "mcse" / "results"
    ablation = AblationDir(tmp_path / "abl")
    assert ablation.row("wo-a").seed(0).path == tmp_path / "abl" / "wo-a" / "seed0"
    assert (ablation.table.name, ablation.record.name, ablation.plot.name) == (
        "ablation.md", "ablation.json", "ablation.png",
    )  # fmt: skip
    assert not ablation.is_ablation()
    write_json(ablation.record, {"rows": []})
    assert ablation.is_ablation()


# ---- recognition ------------------------------------------------------------------------------


def test_recognises_model_checkpoint_and_run_directories(tmp_path):
    run = RunDir(tmp_path / "run")
    make_checkpoint(run.best.path, step=4, finished=True)
    plain = tmp_path / "hf"
    make_checkpoint(plain)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert is_model_dir(plain) and is_model_dir(run.best.path) and not is_model_dir(run.path)
    assert is_checkpoint_dir(run.best.path) and not is_checkpoint_dir(plain)
    assert is_run_dir(run.path) and not is_run_dir(plain) and not is_run_dir(empty)
    assert run.best.saved() and not run.last.saved()
    logging_only = RunDir(tmp_path / "young")  # no best/ yet, but it logged
    logging_only.path.mkdir()
    logging_only.metrics.write_text("")
    assert is_run_dir(logging_only.path)


def test_a_run_resolves_to_its_best_checkpoint(tmp_path):
    run = RunDir(tmp_path / "run")
    make_checkpoint(run.best.path)
    plain = tmp_path / "hf"
    make_checkpoint(plain)
    assert resolve_model_dir(run.path) == str(run.best.path)
    assert resolve_model_dir(str(plain)) == str(plain)
    assert resolve_model_dir("bert-base-uncased") == "bert-base-uncased"  # a hub id: as is
    assert run_of_model(run.path) == run and run_of_model(plain) is None
    assert run_of_checkpoint(run.best.path) == run
    assert run_of_checkpoint(run.last.path) is None  # last/'s weights are not the scored ones


def test_a_folder_that_is_neither_a_model_nor_a_run_is_refused(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "readme.txt").write_text("mine")
    with pytest.raises(MmcseError, match=r"notes is neither an HF model directory.*best/config"):
        resolve_model_dir(folder)
    with pytest.raises(MmcseError, match=r"notes holds no training run .*no seed runs"):
        find_runs(folder)
    with pytest.raises(MmcseError, match=r"readme.txt is not a directory"):
        find_runs(folder / "readme.txt")


def test_a_run_without_best_is_refused_naming_what_is_missing(tmp_path):
    """Its config.json is the run's settings: it used to load as a model ("Unrecognized model")."""
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.config.write_text(json.dumps({"model": "bert-base-uncased", "method": "mcse"}))
    run.plan.write_text("{}")
    with pytest.raises(MmcseError) as info:
        resolve_model_dir(run.path)
    message = str(info.value)
    assert message.startswith(f"{run.path} is a training run without a best checkpoint")
    assert "best/config.json" in message and "saved no checkpoint at all" in message
    make_checkpoint(run.last.path, step=3)
    with pytest.raises(MmcseError, match=f"its latest checkpoint is {run.last.path}"):
        resolve_model_dir(run.path)
    assert resolve_model_dir(run.last.path) == str(run.last.path)  # which loads as asked
    settings_only = RunDir(tmp_path / "killed-at-start")  # it wrote its settings, nothing else
    settings_only.path.mkdir()
    settings_only.config.write_text(json.dumps({"model": "bert-base-uncased", "method": "mcse"}))
    with pytest.raises(MmcseError, match="training run without a best checkpoint"):
        resolve_model_dir(settings_only.path)


def test_atomic_dir_gives_its_files_the_permissions_of_the_umask(tmp_path):
    import torch
    from safetensors.torch import save_file

    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "best") as tmp:
            save_file({"w": torch.zeros(2)}, str(tmp / "model.safetensors"))  # written 0600
            (tmp / "sub").mkdir(mode=0o700)
            (tmp / "sub" / "x.json").write_text("{}")
    finally:
        os.umask(old)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / "best").rglob("*")}
    assert modes == {"model.safetensors": "0o644", "sub": "0o755", "x.json": "0o644"}
    assert oct((tmp_path / "best").stat().st_mode & 0o777) == "0o755"


def test_finds_a_run_or_the_seed_runs_inside_a_folder(tmp_path):
    seeds = SeedsDir(tmp_path / "mcse")
    for k in (1, 0):
        run = seeds.seed(k)
        run.path.mkdir(parents=True)
        run.metrics.write_text("")
    (seeds.path / "notes").mkdir()  # not a run: skipped
    assert find_runs(seeds.path) == [seeds.seed(0), seeds.seed(1)]
    assert find_runs(seeds.seed(1).path) == [seeds.seed(1)]


# ---- run info, finished -----------------------------------------------------------------------


def test_run_info_roundtrip_and_finished_flag(tmp_path):
    run = RunDir(tmp_path / "run")
    assert not run.finished()  # nothing saved yet
    best = make_checkpoint(run.best.path, step=2, finished=False, output=tmp_path)
    assert best.read_info() == {"step": 2, "finished": False, "output": str(tmp_path)}
    assert best.unfinished() and not best.finished() and not run.finished()
    best.mark_finished()
    assert best.read_info()["finished"] is True and not best.unfinished() and run.finished()
    legacy = make_checkpoint(tmp_path / "old" / "best", step=9)  # before the flag existed
    assert not legacy.unfinished() and RunDir(tmp_path / "old").finished()
    plain = make_checkpoint(tmp_path / "hf")
    assert plain.read_info() is None and not plain.unfinished() and not plain.finished()
    plain.mark_finished()  # no run info: nothing to mark, nothing created
    assert not plain.run_info.exists()


def test_unreadable_run_info_is_one_error_line_naming_the_file(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "best")
    checkpoint.run_info.write_text('{"step": 1,')
    with pytest.raises(MmcseError, match=r"mmcse_run.json: not valid JSON"):
        checkpoint.read_info()
    checkpoint.run_info.write_text("[1, 2]")
    with pytest.raises(MmcseError, match=r"mmcse_run.json: expected a JSON object, found list"):
        checkpoint.read_info()


# ---- atomic writes ----------------------------------------------------------------------------


def test_json_is_strict_and_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "deep" / "results.json"
    write_json(path, {"STS12": float("nan"), "rows": (1.0, float("inf")), "avg": 75.5})
    assert path.read_text().endswith("\n")
    assert json.loads(path.read_text()) == {"STS12": None, "rows": [1.0, None], "avg": 75.5}

    def killed(temp, final):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", killed)
    with pytest.raises(OSError, match="disk full"):
        write_json(path, {"avg": 1.0})
    assert json.loads(path.read_text())["avg"] == 75.5  # the old file, whole
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json"]  # no temp left


def test_results_are_recorded_per_suite(tmp_path):
    run = RunDir(tmp_path / "run")
    assert run_result(run, "transfer") is None
    written = run.write_results("transfer", {"MR": 80.0, "avg": 80.0})
    result = run_result(run, "transfer")
    assert written == run.transfer and (result["MR"], result["avg"]) == (80.0, 80.0)
    assert result["details"]["source"] == "eval"
    assert read_json(run.results) is None


def _transfer(scores: dict, mode: str = "test") -> dict:
    protocol = {"mode": mode, "pooler": "cls", "data": "/data"}
    details = {"tasks": {t: {"acc": v} for t, v in scores.items()}, "protocol": protocol}
    return {**scores, "avg": sum(scores.values()) / len(scores), "details": details}


def test_results_accumulate_per_task_and_protocol_and_a_rerun_replaces_its_task(tmp_path, caplog):
    run = RunDir(tmp_path / "run")
    run.write_results("transfer", _transfer({"CR": 85.0, "MR": 80.0}))
    run.write_results("transfer", _transfer({"TREC": 90.0}))  # a TREC-only call
    run.write_results("transfer", _transfer({"CR": 70.0}, mode="fasttest"))
    merged = {r["details"]["protocol"]["mode"]: r for r in merge_results(
        run.read_result_entries("transfer"))}  # fmt: skip
    assert {k: merged["test"][k] for k in ("CR", "MR", "TREC")} == {
        "CR": 85.0, "MR": 80.0, "TREC": 90.0
    }  # fmt: skip
    assert merged["test"]["avg"] == pytest.approx((85.0 + 80.0 + 90.0) / 3)
    assert merged["fasttest"]["CR"] == 70.0  # another protocol: kept apart

    with caplog.at_level(logging.INFO, logger="mmcse.rundir"):
        run.write_results("transfer", _transfer({"CR": 86.0}))  # the same task, same protocol
    assert "CR" in caplog.text and "replaces" in caplog.text
    entries = run.read_result_entries("transfer")
    test_cr = [e["scores"]["CR"] for e in entries if e["protocol"]["mode"] == "test"
               and "CR" in e["scores"]]  # fmt: skip
    assert test_cr == [86.0]  # replaced, not duplicated
    assert [e["scores"] for e in entries if e["protocol"]["mode"] == "fasttest"] == [{"CR": 70.0}]
    assert merge_results(entries)[0]["MR"] == 80.0  # the rest of the first call survives


def test_an_old_flat_results_file_is_read_and_kept_as_legacy(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    write_json(run.results, {"STS12": 70.0, "avg": 70.0, "details": {"mode": "test"}})
    assert run_result(run, "sts")["STS12"] == 70.0
    run.write_results("sts", {"STS12": 75.0, "avg": 75.0, "details": {"protocol": {"mode": "dev"}}})
    sources = [e["source"] for e in run.read_result_entries("sts")]
    assert sources == ["legacy", "eval"]
    assert run_result(run, "sts")["STS12"] == 70.0  # the run's own result is preferred


def test_a_malformed_results_file_is_one_error_line_naming_it(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    write_json(run.transfer, {"format": "mmcse.results/2", "entries": [{"scores": 1}]})
    with pytest.raises(MmcseError, match=r"transfer.json: 'entries' must be a list"):
        run.read_result_entries("transfer")


def test_metrics_skip_a_torn_last_line_and_refuse_a_bad_middle_one(tmp_path):
    run = RunDir(tmp_path)
    run.metrics.write_text('{"step": 1, "loss": 2.0}\n{"note": "no step"}\n{"step": 2, "lo')
    assert run.read_metrics() == [{"step": 1, "loss": 2.0}]
    run.metrics.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(MmcseError, match=r"metrics.jsonl:2: not a JSON object"):
        run.read_metrics()


def test_atomic_dir_keeps_the_previous_checkpoint_on_failure_and_recover_undoes_a_kill(tmp_path):
    run = RunDir(tmp_path / "run")
    with atomic_dir(run.best.path) as tmp:
        (tmp / "model.safetensors").write_text("old")
    with pytest.raises(OSError), atomic_dir(run.best.path) as tmp:
        (tmp / "model.safetensors").write_text("new")
        raise OSError("disk full")
    assert (run.best.path / "model.safetensors").read_text() == "old"
    os.rename(run.best.path, run.path / ".old-best")  # killed between the two renames
    (run.path / ".tmp-last-x1").mkdir()  # and during a last/ save
    run.recover()
    assert sorted(p.name for p in run.path.iterdir()) == ["best"]


def test_clear_removes_what_a_run_wrote_and_nothing_else(tmp_path):
    run = RunDir(tmp_path / "run")
    make_checkpoint(run.best.path, step=1)
    make_checkpoint(run.last.path, step=1)
    (run.path / ".tmp-best-x1").mkdir()
    run.tensorboard.mkdir()
    for path in (run.metrics, run.config, run.plan, run.results, run.transfer, run.retrieval):
        path.write_text("{}")
    (run.path / "notes.txt").write_text("mine")
    run.clear()
    assert sorted(p.name for p in run.path.iterdir()) == ["notes.txt"]


# ---- nothing else spells the layout -----------------------------------------------------------

#: file names only the layout uses: spelled anywhere in a string (docstrings aside), they are
#: a path built by hand. (``config.json`` is also every HF model's and sentence-transformers
#: module's file, so it cannot be told apart by spelling.)
FILE_NAMES = (
    rundir.RUN_INFO_FILE, rundir.HEADS_FILE, rundir.TRAINER_STATE_FILE, rundir.INTEGRITY_FILE,
    rundir.METRICS_FILE,
    rundir.PLAN_FILE, rundir.RESULTS_FILE, rundir.TRANSFER_FILE, rundir.RETRIEVAL_FILE,
    rundir.ALIGN_UNIFORM_FILE, rundir.CURVES_PLOT, rundir.ALIGN_UNIFORM_PLOT,
    layout.ABLATION_TABLE, layout.ABLATION_RECORD, layout.ABLATION_PLOT,
)  # fmt: skip
FILE_NAME = re.compile(
    r"(?<![\w.-])(" + "|".join(re.escape(name) for name in FILE_NAMES) + r")(?![\w-])"
)
#: folder names that are also ordinary words ("best" is a table column, "tensorboard" a
#: --report-to value): only flagged where used as a path part
DIR_NAMES = (rundir.BEST_DIR, rundir.LAST_DIR, rundir.TENSORBOARD_DIR)
PATH_CALLS = ("Path", "joinpath", "join", "with_name")


def docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr):
            value = node.body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.add(id(value))
    return found


def _call_name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def path_parts(node: ast.AST) -> list[ast.expr]:
    """Expressions used as a path part: ``x / "best"``, ``Path(x, "best")``, ``p.name == "best"``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return [node.left, node.right]
    if isinstance(node, ast.Call) and _call_name(node.func) in PATH_CALLS:
        return list(node.args)
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        if any(isinstance(s, ast.Attribute) and s.attr in ("name", "stem") for s in sides):
            return sides
    return []


def layout_spellings(source: str) -> list[str]:
    """Where ``source`` spells a name of the run layout itself, as ``line: text``."""
    tree = ast.parse(source)
    skip = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        text = node.value if isinstance(node, ast.Constant) and id(node) not in skip else None
        if isinstance(text, str) and FILE_NAME.search(text):
            found.append(f"{node.lineno}: {text!r}")
        for part in path_parts(node):
            if isinstance(part, ast.Constant) and part.value in DIR_NAMES:
                found.append(f"{part.lineno}: {part.value!r} as a path part")
        if isinstance(node, ast.JoinedStr):  # f"seed{k}": a seed folder named by hand
            for value, following in zip(node.values, node.values[1:], strict=False):
                if (
                    isinstance(value, ast.Constant)
                    and str(value.value).endswith(layout.SEED_PREFIX)
                    and isinstance(following, ast.FormattedValue)
                ):
                    found.append(f"{value.lineno}: {value.value!r}{{...}}, a seed folder")
    return sorted(set(found))


def test_the_checker_finds_hand_built_run_paths_and_ignores_prose():
    source = '''
"""A run holds metrics.jsonl and best/ (prose: fine)."""
import json
from pathlib import Path

def f(run, seed, report_to):
    """Reads mmcse_run.json (prose)."""
    info = json.loads((run / "best" / "mmcse_run.json").read_text())
    out = Path(run, "last")
    same = run.name == "best"
    nested = f"{run}/results.json"
    folder = run / f"seed{seed}"
    header = ["avg", "best"]
    mode = report_to == "tensorboard"
    other = run / "sentence_bert_config.json"
    message = f"seed {seed} done"
    return info, out, same, nested, folder, header, mode, other, message
'''
    assert layout_spellings(source) == [
        "10: 'best' as a path part",
        "11: '/results.json'",
        "12: 'seed'{...}, a seed folder",
        "8: 'best' as a path part",
        "8: 'mmcse_run.json'",
        "9: 'last' as a path part",
    ]


LAYOUT_OWNERS = (ROOT / "mmcse" / "rundir.py", ROOT / "mmcse" / "recipes" / "layout.py")


def test_no_module_but_the_layouts_spells_a_run_file_name():
    spelled = {}
    for base in ("mmcse", "pipeline"):
        for path in sorted((ROOT / base).rglob("*.py")):
            if path in LAYOUT_OWNERS:
                continue
            found = layout_spellings(path.read_text(encoding="utf-8"))
            if found:
                spelled[path.relative_to(ROOT).as_posix()] = found
    assert spelled == {}, (
        "use mmcse.rundir (RunDir, Checkpoint) or mmcse.recipes.layout (SeedsDir) for these paths"
    )


def test_a_newer_eval_speaks_for_a_run_over_an_old_transfer_file(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    write_json(run.transfer, {"MR": 70.0, "avg": 70.0, "details": {"mode": "test"}})
    run.write_results("transfer", {"MR": 75.0, "avg": 75.0,
                                   "details": {"protocol": {"mode": "test"}}})  # fmt: skip
    assert run_result(run, "transfer")["MR"] == 75.0
    assert [e["source"] for e in run.read_result_entries("transfer")] == ["legacy", "eval"]
