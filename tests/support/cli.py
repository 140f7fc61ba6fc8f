"""Running ``mmcse`` through its real entry point in-process, and the one-error-line assertion."""

from __future__ import annotations

import sys

import pytest

import cli


def run_main(args: list[str], monkeypatch, capsys) -> tuple[int, list[str]]:
    """``mmcse ARGS`` through ``cli.main``; returns the exit code and the stderr lines."""
    code, _, err = run_main_output(args, monkeypatch, capsys)
    return code, err.splitlines()


def run_main_output(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """``mmcse ARGS`` through ``cli.main``; returns the exit code, stdout and stderr."""
    monkeypatch.setattr(sys, "argv", ["mmcse", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main()
        raise SystemExit(0)
    captured = capsys.readouterr()
    return info.value.code, captured.out, captured.err


def assert_one_error(code: int, stderr: list[str], *fragments: str) -> str:
    """Exit 2, exactly one ``error:`` line holding every fragment, no traceback; the line."""
    errors = [line for line in stderr if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, stderr
    assert not any("Traceback" in line for line in stderr)
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]
