"""The ``mmcse`` commands, a module per group (``cli.py`` assembles them). A command parses its
flags, calls one library function and prints the result it returns (a table, a listing, the
files written); progress and warnings are the library's ``logging``."""

from __future__ import annotations

from collections.abc import Iterable

import typer


def show(result: str | Iterable[str] | None) -> None:
    """Print a command's result: a text, or each text an iterator yields as soon as it is ready.

    A run stopped by a signal (:class:`mmcse.training.stop.TrainingInterrupted`, raised while
    its lines are iterated) exits 128 + the signal's number: typer would turn any
    KeyboardInterrupt into 130, and a job script must see SIGTERM (143) as SIGTERM."""
    try:
        for text in [result] if isinstance(result, str) else result or ():
            typer.echo(text)
    except KeyboardInterrupt as exc:
        raise typer.Exit(getattr(exc, "exit_code", 130)) from None
