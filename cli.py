"""The ``mmcse`` command line (typer). Thin: each command parses flags and calls the library.

Errors a user can fix (:class:`mmcse.errors.MmcseError`, missing files, bad values) print one
``error: ...`` line and exit with status 2, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from mmcse.errors import MmcseError

app = typer.Typer(
    help="Multimodal contrastive sentence embeddings: Stage-1 teacher cache + Stage-2 trainer.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
cache_app = typer.Typer(help="Inspect, verify, merge and remove cached feature sets.", no_args_is_help=True)
bench_app = typer.Typer(help="Speed benchmarks (ratios measured in one run).", no_args_is_help=True)
recipes_app = typer.Typer(help="Paper settings as named recipes.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")
app.add_typer(bench_app, name="bench")
app.add_typer(recipes_app, name="recipes")


# ---- train / demo / bench train (Stage 2) --------------------------------------------------

# ---- eval ------------------------------------------------------------------------------------

# ---- cache -----------------------------------------------------------------------------------

# ---- extract-images / extract-text / import-hdf5 / bench extract (Stage 1) -------------------

# ---- extract-objects / bench objects (MCSEO) -------------------------------------------------

# ---- recipes / ablate --------------------------------------------------------------------------


def main() -> None:
    """Entry point: run the app, turning user errors into one line on stderr and exit 2."""
    try:
        app(standalone_mode=False)
    except (MmcseError, FileNotFoundError, NotADirectoryError, ValueError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        typer.echo(f"error: {message}", err=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
