"""CI's coverage summary (``.ci/coverage_report.py``) on a report of known content."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_tool():
    spec = importlib.util.spec_from_file_location(
        "coverage_report", ROOT / ".ci" / "coverage_report.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def function(statements: int, covered: int, missing: list[int]) -> dict:
    return {
        "summary": {"num_statements": statements, "covered_lines": covered},
        "missing_lines": missing,
    }


def test_the_report_names_the_total_the_functions_never_run_and_the_gpu_lines(tmp_path):
    source = tmp_path / "pkg" / "mod.py"
    source.parent.mkdir()
    source.write_text(
        "def ran():\n    pass\n\ndef never():\n    x = 1  # pragma: cuda\n    return x\n"
    )
    report = {
        "totals": {"percent_covered": 75.0, "num_statements": 4, "missing_lines": 1},
        "files": {
            "pkg/mod.py": {
                "functions": {
                    "": function(2, 2, []),  # module-level code: not a function
                    "ran": function(1, 1, []),
                    "never": function(1, 0, [6]),
                    "all_excluded": function(0, 0, []),
                }
            }
        },
    }
    path = tmp_path / "coverage.json"
    path.write_text(json.dumps(report))
    tool = load_tool()
    assert tool.never_executed(report) == ["pkg/mod.py:6 never"]
    assert tool.cuda_lines(report, tmp_path) == ["pkg/mod.py:5"]
    text = tool.render(report, tmp_path)
    assert text.startswith("coverage: 75.0 % of 4 statements")
    assert "functions never executed: 1\n  pkg/mod.py:6 never" in text
    assert "lines left to a GPU (# pragma: cuda): 1\n  pkg/mod.py:5" in text
    assert tool.main(["x", str(tmp_path / "missing.json")]) == 2


def test_the_cuda_pragma_is_the_one_coverage_excludes():
    import re
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["coverage"]
    assert config["run"]["source"] == ["mmcse", "pipeline"]
    (pattern,) = config["report"]["exclude_also"]
    tool = load_tool()
    for line in ("x = 1  # pragma: cuda", "y()  #pragma: cuda"):
        assert re.search(pattern, line) and tool.CUDA_PRAGMA.search(line)
