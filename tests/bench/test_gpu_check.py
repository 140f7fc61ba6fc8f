"""The GPU check end to end on the CPU at a tiny size: on a GPU only the device is new."""

from __future__ import annotations

import json

import pytest

from mmcse.bench import gpu_check
from mmcse.training import fastpath


@pytest.fixture
def aot_eager(monkeypatch):
    """Capture compiles with the aot_eager backend (inductor's CPU code generation takes minutes)."""
    monkeypatch.setitem(fastpath.CAPTURE_COMPILE, "cpu", {"backend": "aot_eager"})


def test_the_gpu_check_runs_end_to_end_on_cpu(tmp_path, aot_eager, capsys):
    out = tmp_path / "gpu-check.json"
    argv = ["--device", "cpu", "--size", "tiny", "--out", str(out), "--captures", "off"]
    # pytest -m cuda over one file: CI has no GPU, so its tests are skipped (collecting the
    # whole suite in a child process would cost a minute)
    code = gpu_check.main([*argv, "--pytest-args", "tests/training/test_cuda.py"])
    assert code == 0
    results = json.loads(out.read_text())
    assert results["cuda_tests"]["exit_code"] in (0, 5)  # skipped or deselected: no GPU here
    figures = {(r["method"], r["capture"], r["packed"]) for r in results["steps"]}
    want = {(m, "off", p) for m, _ in gpu_check.METHODS for p in (False, True)}
    assert figures == want and not results["skipped"]
    for step in results["steps"]:
        assert step["step_ms"] > 0 and step["compile_s"] > 0 and step["mean_real_tokens"] > 0
        assert step["step"] == step["capture"]  # the trainer captured as asked
    assert any("packed ÷ padded" in line for line in results["summary"])
    printed = capsys.readouterr().out
    assert "simcse fastest" in printed and str(out) in printed


def test_the_time_budget_skips_rather_than_overruns(tmp_path, aot_eager):
    out = tmp_path / "gpu-check.json"
    gpu_check.main(["--device", "cpu", "--size", "tiny", "--out", str(out), "--no-tests",
                    "--budget-s", "0"])  # fmt: skip
    results = json.loads(out.read_text())
    assert results["steps"] == [] and len(results["skipped"]) == 8
    assert results["skipped"][:2] == ["simcse whole padded", "simcse whole packed"]
    assert "cuda_tests" not in results
    assert set(results["versions"]) == {"torch", "transformers"}
    gpu_check.main(["--device", "cpu", "--size", "tiny", "--out", str(out), "--no-tests",
                    "--budget-s", "0", "--methods", "mcse"])  # fmt: skip
    skipped = json.loads(out.read_text())["skipped"]
    assert len(skipped) == 4 and all(label.startswith("mcse ") for label in skipped)


def test_a_missing_gpu_or_a_bad_capture_is_one_error_line(capsys):
    assert gpu_check.main(["--device", "cuda:7", "--no-tests"]) == 2
    assert capsys.readouterr().err.startswith("error: --device cuda:7")
    assert gpu_check.main(["--device", "cpu", "--captures", "all"]) == 2
    assert capsys.readouterr().err.startswith("error: --captures takes")
    assert gpu_check.main(["--device", "cpu", "--methods", "dalr"]) == 2
    assert capsys.readouterr().err.startswith("error: --methods takes")


def test_the_summary_says_which_default_each_figure_supports():
    def step(method, capture, packed, ms):
        return {"method": method, "capture": capture, "packed": packed, "step_ms": ms,
                "compile_s": 30.0, "mfu_real_tokens": 0.4}  # fmt: skip

    results = {
        "device": "cuda",
        "cuda_tests": {"exit_code": 0},
        "steps": [
            step("simcse", "whole", False, 10.0),
            step("simcse", "whole", True, 8.0),
            step("simcse", "forward", False, 12.0),
        ],  # fmt: skip
        "skipped": ["simcse forward packed"],
    }
    lines = gpu_check.summary(results)
    assert "simcse whole: packed ÷ padded step 0.80: supports packing auto=on for cuda" in lines
    assert "simcse: whole ÷ forward step 0.83: supports capture auto=whole" in lines
    assert any(line.startswith("simcse fastest (whole, packed): 8.0 ms") for line in lines)
    assert lines[-1] == "skipped (time budget): simcse forward packed"
