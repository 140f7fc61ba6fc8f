"""``train --resume`` checks last/ against its integrity record first, and leaves a finished run be.

Every refusal is one ``error:`` line, exit 2, with the run directory exactly as it was (no file
added, changed or removed), and no model loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.cli import assert_one_error, run_main
from support.runs import tiny_mcse_settings

import cli
from mmcse.cache import write_feature_set
from mmcse.model import SentenceEncoder
from mmcse.rundir import RunDir
from mmcse.training import metrics as metrics_log
from mmcse.training.config import TrainConfig
from mmcse.training.loop import TrainingInterrupted, train


def write_images(path: Path, seed: int) -> None:
    """A 16-wide image set over the tiny world's 32 images (as ``tiny_world``'s, other rows)."""
    ids = [f"img{i}" for i in range(32)]
    rows = np.random.default_rng(seed).standard_normal((32, 16)).astype(np.float16)
    write_feature_set(
        path, ids, rows, kind="image", dim=16, dtype="float16", dataset="tiny", split="train",
        producer={"teacher": "random"},
    )  # fmt: skip


def interrupted_run(tiny_model, tiny_world, root: Path, **kw) -> dict:
    """A run of 4 steps stopped by SIGINT after step 2 (last/ saved there); its settings."""
    write_images(root / "images", seed=0)
    settings = tiny_mcse_settings(
        tiny_model, tiny_world, root / "run",
        **{"max_steps": 4, "save_every": 2, "eval_steps": 2, "log_every": 1,
           "features": {"image": str(root / "images")}, **kw},
    )  # fmt: skip
    real_write = metrics_log.MetricsLog.write

    def write(self, record):
        real_write(self, record)
        if record.get("step") == 2:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(metrics_log.MetricsLog, "write", write)
        with pytest.raises(TrainingInterrupted):
            train(TrainConfig(**settings))
    return settings


@pytest.fixture(scope="module")
def stopped(tiny_model, tiny_world, tmp_path_factory) -> Path:
    """The root of an interrupted run (``run/``, ``images/``); copy it before changing it."""
    root = tmp_path_factory.mktemp("stopped")
    interrupted_run(tiny_model, tiny_world, root)
    return root


@pytest.fixture
def run(stopped, tmp_path) -> Path:
    """A copy of the interrupted run (its feature set stays the fixture's: read-only here)."""
    shutil.copytree(stopped / "run", tmp_path / "run")
    return tmp_path / "run"


def forbid_model_load(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("the model was loaded before the resume was refused")

    monkeypatch.setattr(SentenceEncoder, "from_pretrained", classmethod(fail))


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) by its sha256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def refused_resume(run: Path, monkeypatch, capsys, *fragments: str, args=()) -> str:
    forbid_model_load(monkeypatch)  # every check comes before the model loads
    before = snapshot(run)
    code, stderr = run_main(["train", "--resume", str(run), *args], monkeypatch, capsys)
    line = assert_one_error(code, stderr, *fragments)
    assert snapshot(run) == before  # nothing added, changed or removed
    return line


def test_a_truncated_last_is_one_error_line(run, monkeypatch, capsys):
    weights = RunDir(run).last.path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    refused_resume(run, monkeypatch, capsys, str(weights), "100 bytes", "truncated")


def test_an_altered_optimizer_or_rng_state_is_refused(run, monkeypatch, capsys):
    state_file = RunDir(run).last.trainer_state
    state = torch.load(state_file, weights_only=False)
    state["rng"]["python"] = list(state["rng"]["python"])  # a state rewritten by hand ...
    state["best_step"] = 1  # ... with one value changed
    torch.save(state, state_file)
    refused_resume(run, monkeypatch, capsys, str(state_file), "changed after the save")
    blob = bytearray(state_file.read_bytes())  # same size, one byte flipped
    blob[len(blob) // 2] ^= 0xFF
    state_file.write_bytes(bytes(blob))
    refused_resume(run, monkeypatch, capsys, str(state_file), "contents changed after the save")


def test_a_file_added_to_last_or_a_missing_record_is_refused(run, monkeypatch, capsys):
    last = RunDir(run).last
    (last.path / "notes.txt").write_text("mine")
    refused_resume(run, monkeypatch, capsys, "notes.txt", "not part of the checkpoint")
    (last.path / "notes.txt").unlink()
    last.integrity.unlink()
    refused_resume(run, monkeypatch, capsys, str(last.integrity), "cannot be checked")


def test_the_last_of_another_run_is_refused_naming_the_setting(
    run, tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    other = interrupted_run(tiny_model, tiny_world, tmp_path / "other", batch_size=4)
    shutil.rmtree(RunDir(run).last.path)
    shutil.copytree(RunDir(other["output_dir"]).last.path, RunDir(run).last.path)
    line = refused_resume(run, monkeypatch, capsys, "batch_size=4 (run: 8)", "another run")
    assert "features" in line  # the other run's image set is another folder too


def test_a_feature_set_re_extracted_since_is_refused_naming_it(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    settings = interrupted_run(tiny_model, tiny_world, tmp_path)
    shutil.rmtree(tmp_path / "images")
    write_images(tmp_path / "images", seed=1)  # same ids, same shape, other rows
    run = Path(settings["output_dir"])
    refused_resume(
        run, monkeypatch, capsys, "feature:image", str(tmp_path / "images"), "changed since"
    )


def test_an_intact_resume_still_trains_to_the_end(run, monkeypatch, capsys):
    code, stderr = run_main(["train", "--resume", str(run)], monkeypatch, capsys)
    assert code == 0, stderr
    info = RunDir(run).last.read_info()
    assert info["step"] == 4 and info["finished"] is True
    # marking last/ finished saved it anew: its record still holds, so a resume says "finished"
    code, stderr = run_main(["train", "--resume", str(run)], monkeypatch, capsys)
    assert code == 0 and not any(line.startswith("error") for line in stderr)


def test_resuming_a_finished_run_trains_nothing_and_exits_0(run, monkeypatch, capsys):
    saved = json.loads(RunDir(run).config.read_text())
    train(TrainConfig(**{**saved, "output_dir": str(run)}), resume=True)
    before = snapshot(run)
    monkeypatch.setattr(
        SentenceEncoder, "from_pretrained", classmethod(lambda *a, **k: pytest.fail("loaded"))
    )
    monkeypatch.setattr(sys, "argv", ["mmcse", "train", "--resume", str(run)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main()
        raise SystemExit(0)
    out, err = capsys.readouterr()
    assert info.value.code == 0, err
    assert "finished at step 4 of 4" in out and "nothing to resume" in out
    assert "error" not in err and snapshot(run) == before
    # a smaller (or equal) --max-steps does not extend it
    refused_resume(run, monkeypatch, capsys, "does not extend", args=["--max-steps", "3"])


def test_a_larger_max_steps_extends_a_finished_run(run, monkeypatch, capsys, library_log):
    saved = json.loads(RunDir(run).config.read_text())
    train(TrainConfig(**{**saved, "output_dir": str(run)}), resume=True)
    library_log()
    result = train(TrainConfig(**{**saved, "output_dir": str(run), "max_steps": 6}), resume=True)
    assert result.steps == 6 and RunDir(run).last.read_info()["step"] == 6
    assert "extending the finished run" in library_log()
    records = [json.loads(x) for x in RunDir(run).metrics.read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]  # log_every 1
    # the run's settings are now the extended ones: a plain resume says it is finished
    code, stderr = run_main(["train", "--resume", str(run)], monkeypatch, capsys)
    assert code == 0 and not any(line.startswith("error") for line in stderr)


def test_an_unfinished_run_refuses_a_new_max_steps(run, monkeypatch, capsys):
    refused_resume(run, monkeypatch, capsys, "has not finished", args=["--max-steps", "6"])
