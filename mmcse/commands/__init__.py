"""The ``mmcse`` commands, a module per group (``cli.py`` assembles them). A command parses its
flags, calls one library function and prints the result it returns (a table, a listing, the
files written); progress and warnings are the library's ``logging``."""

from __future__ import annotations

import os
from collections.abc import Iterable

import typer


def other_rank() -> bool:
    """A process of a ``torchrun`` launch other than rank 0 (``RANK`` says so): it runs the
    command but prints none of its lines, so a run's lines appear once, not once per process
    (a malformed ``RANK`` is rank 0 here; the run's own checks name it)."""
    rank = os.environ.get("RANK", "0").strip()
    return rank.isdigit() and int(rank) > 0


def show(result: str | Iterable[str] | None) -> None:
    """Print a command's result: a text, or each text an iterator yields as soon as it is ready.

    A run stopped by a signal (:class:`mmcse.training.stop.TrainingInterrupted`, raised while
    its lines are iterated) exits 128 + the signal's number: typer would turn any
    KeyboardInterrupt into 130, and a job script must see SIGTERM (143) as SIGTERM."""
    quiet = other_rank()
    try:
        for text in [result] if isinstance(result, str) else result or ():
            if not quiet:
                typer.echo(text)
    except KeyboardInterrupt as exc:
        raise typer.Exit(getattr(exc, "exit_code", 130)) from None
