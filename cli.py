"""The ``mmcse`` command line: one typer app assembled from :mod:`mmcse.commands`.

A user error (:class:`mmcse.errors.MmcseError`, or an OS error such as a full disk) prints one
``error: ...`` line and exits 2; anything else is a bug and keeps its traceback. The library
reports progress through ``logging``, shown here as plain lines on stderr (:mod:`mmcse.logs`).
"""

from __future__ import annotations

import logging
import sys

import typer
import typer.rich_utils

from mmcse.commands import bench, cache, evaluate, extract, other_rank, recipes, reports, train
from mmcse.errors import MmcseError, os_error_message
from mmcse.logs import show_logs

#: the one type-label convention of ``--help``: click's upper-case names; a flag has none
TYPE_LABELS = {"str": "TEXT", "int": "INT", "float": "FLOAT", "list[str]": "TEXT", "Path": "PATH"}


def _type_label(param, ctx) -> str | None:
    """A parameter's label in ``--help``: its metavar, else ``TEXT``/``INT``/``FLOAT`` (typer's
    own are ``<str>``/``<int>``, beside the ``TEXT`` of the settings' flags), a choice's values,
    nothing for a flag (it takes no value); ``...`` when it takes several."""
    if getattr(param, "is_flag", False):
        return None
    if param.metavar is not None:
        return param.metavar
    if param.type_descriptor.is_choice:
        return param.display_type(ctx)
    bare = param.bare_type()
    return TYPE_LABELS.get(bare, bare.upper()) + ("..." if param.nargs != 1 else "")


def _folded_help(**kwargs):
    """An option's help where a word wider than its column (a hub id default) folds onto the
    next line instead of ending in an ellipsis."""
    columns = _parameter_help(**kwargs)
    for text in getattr(columns, "renderables", ()):
        if hasattr(text, "overflow"):
            text.overflow = "fold"
    return columns


typer.core.TyperOption.display_type_rich = _type_label
typer.core.TyperArgument.display_type_rich = _type_label
_parameter_help = typer.rich_utils._get_parameter_help
typer.rich_utils._get_parameter_help = _folded_help

app = typer.Typer(
    help="Multimodal contrastive sentence embeddings: Stage-1 teacher cache + Stage-2 trainer.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
for commands in (train.app, evaluate.app, reports.app, extract.app, recipes.app):
    app.add_typer(commands)
app.add_typer(cache.app, name="cache")
app.add_typer(bench.app, name="bench")
app.add_typer(recipes.recipes_app, name="recipes")


def _version(value: bool) -> None:
    if value:
        from mmcse import __version__

        typer.echo(f"mmcse {__version__}")
        raise typer.Exit()


@app.callback()
def _main_options(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_version, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also show debug messages."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only warnings and errors."),
) -> None:
    """Multimodal contrastive sentence embeddings: Stage-1 teacher cache + Stage-2 trainer."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    if other_rank():  # under torchrun, rank 0 alone prints the run's lines; errors still show
        level = logging.ERROR
    ctx.call_on_close(show_logs(level))  # until the command ends


def main() -> None:
    """Entry point: usage errors come from typer; user errors become one line and exit 2."""
    try:
        app()
    except MmcseError as exc:
        _fail(exc)
    except OSError as exc:  # disk full, read-only folder, permissions: name the path
        _fail(os_error_message(exc))
    except KeyboardInterrupt:  # training saved last/ and logged how to resume
        sys.exit(130)


def _fail(message) -> None:
    """One ``error:`` line on its own line (an open progress bar is closed first), exit 2."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
    typer.echo(f"error: {message}", err=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
