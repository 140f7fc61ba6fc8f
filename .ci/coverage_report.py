"""What CI prints after the suite: line coverage of mmcse/ and pipeline/, the functions the suite
never executed, and the lines left to a GPU (``# pragma: cuda``, each exercised by a ``cuda`` test).

Reads coverage.py's JSON report (``python -m pytest --cov --cov-report=json``, which writes
``coverage.json``; the measured packages and the pragma are ``[tool.coverage]`` in
pyproject.toml). ``python .ci/coverage_report.py [coverage.json]``; exit 0 (a report, not a gate).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

CUDA_PRAGMA = re.compile(r"#\s*pragma:\s*cuda\b")


def never_executed(report: dict) -> list[str]:
    """``path:line name`` of every function with statements none of which ran (module-level
    code is not a function; a function whose lines are all excluded has no statements)."""
    out = []
    for path, data in sorted(report["files"].items()):
        for name, fn in data.get("functions", {}).items():
            summary = fn["summary"]
            if name and summary["num_statements"] and not summary["covered_lines"]:
                first = min(fn["missing_lines"])
                out.append(f"{path}:{first} {name}")
    return out


def cuda_lines(report: dict, root: Path) -> list[str]:
    """``path:line`` of every line carrying the CUDA pragma in the measured files."""
    out = []
    for path in sorted(report["files"]):
        source = (root / path).read_text(encoding="utf-8").splitlines()
        out += [f"{path}:{i}" for i, line in enumerate(source, 1) if CUDA_PRAGMA.search(line)]
    return out


def render(report: dict, root: Path) -> str:
    totals = report["totals"]
    missed = never_executed(report)
    cuda = cuda_lines(report, root)
    lines = [
        f"coverage: {totals['percent_covered']:.1f} % of {totals['num_statements']} statements "
        f"of mmcse/ and pipeline/ ({totals['missing_lines']} never run; "
        f"{len(cuda)} lines left to a GPU: # pragma: cuda, run by the `cuda` tests)",
        f"functions never executed: {len(missed)}",
        *(f"  {entry}" for entry in missed),
        f"lines left to a GPU (# pragma: cuda): {len(cuda)}",
        *(f"  {entry}" for entry in cuda),
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    path = Path(argv[1] if len(argv) > 1 else "coverage.json")
    if not path.is_file():
        print(f"error: no coverage report at {path} (run python -m pytest --cov --cov-report=json)")
        return 2
    print(render(json.loads(path.read_text(encoding="utf-8")), Path.cwd()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
