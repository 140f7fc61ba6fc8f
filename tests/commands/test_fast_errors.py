"""Errors at the speed of a check (issue 32): a missing input to ``mmcse train`` is reported
before torch, transformers or the training loop are imported, and ``mmcse cache ls`` never
imports torch. Each runs in a fresh interpreter, so ``sys.modules`` shows what the command
itself imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "mmcse.training.loop", "datasets")


def run_cli(args: list[str], cwd: Path) -> tuple[int, str, dict[str, bool]]:
    """Exit code, stderr and which heavy modules the command imported."""
    script = (
        "import json, sys\n"
        f"sys.argv = ['mmcse', *{args!r}]\n"
        "import cli\n"
        "try:\n    cli.main()\n    code = 0\n"
        "except SystemExit as exc:\n    code = exc.code\n"
        f"print(json.dumps([code, {{m: m in sys.modules for m in {HEAVY!r}}}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    code, imported = json.loads(done.stdout.strip().splitlines()[-1])
    return code, done.stderr, imported


def test_cache_ls_does_not_import_torch(tmp_path):
    code, _, imported = run_cli(["cache", "ls", str(tmp_path)], tmp_path)
    assert code == 0 and not any(imported.values()), imported


@pytest.mark.parametrize("missing", ["corpus", "model", "feature"])
def test_a_missing_input_is_reported_before_any_model_loads(tmp_path, tiny_model, missing):
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("a dog runs\nthe cat sits\n")
    gone = tmp_path / "gone"
    args = {
        "corpus": ["--model", str(tiny_model), "--text-corpus", str(gone / "wiki.txt")],
        "model": ["--model", str(gone / "model"), "--text-corpus", str(corpus)],
        "feature": ["--model", str(tiny_model), "--method", "mcse", "--text-corpus",
                    str(corpus), "--feature", f"image={gone / 'image-resnet50'}"],
    }[missing]  # fmt: skip
    code, stderr, imported = run_cli(
        ["-q", "train", *args, "--output-dir", str(tmp_path / "run")], tmp_path
    )
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and str(gone) in errors[0], stderr
    assert not any(imported.values()), imported
    assert not (tmp_path / "run").exists()
