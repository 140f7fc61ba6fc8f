"""``mmcse cache ls|verify|rm|finalize|merge``: inspect and manage cached feature sets."""

from __future__ import annotations

import typer

from mmcse.commands import show

app = typer.Typer(
    help="Inspect, verify, merge and remove cached feature sets.", no_args_is_help=True
)


@app.command("ls")
def cache_ls(root: str = typer.Argument("cache", help="Directory searched for sets.")) -> None:
    """List the feature sets and corpora under ROOT (unfinished writes and bad manifests marked)."""
    from mmcse.reports.overview import cache_listing

    show(cache_listing(root))


@app.command("verify")
def cache_verify(
    path: str = typer.Argument(..., help="A feature set or corpus, or a folder of them."),
) -> None:
    """Re-hash every shard, check schemas, rows, ids and NaN/Inf of one set or of every set
    under a folder; exit 2 naming the first problem if any."""
    from mmcse.cache import verify_report

    show(verify_report(path))


@app.command("rm")
def cache_rm(path: str = typer.Argument(..., help="Feature set or corpus directory.")) -> None:
    """Delete one set (refuses directories that are not a set or hold other files)."""
    from mmcse.cache import remove

    remove(path)
    typer.echo(f"removed {path}")


@app.command("finalize")
def cache_finalize(
    path: str = typer.Argument(..., help="Directory the ranks wrote their shards into."),
    num_shards: int = typer.Option(None, help="Require exactly shards 0..N-1."),
) -> None:
    """Write the manifest of a set whose shards were written by several ranks or jobs."""
    from mmcse.cache import FeatureSetWriter

    m = FeatureSetWriter.reopen(path).finalize(num_shards=num_shards)
    typer.echo(f"finalized {path}: {m.num_rows} rows, fingerprint {m.fingerprint}")


@app.command("merge")
def cache_merge(
    sources: list[str] = typer.Argument(..., help="Finished sets of the same producer."),
    out: str = typer.Option(..., "--out", "-o", help="Directory of the merged set."),
) -> None:
    """Combine finished sets (e.g. one per extraction job) into a new set OUT."""
    from mmcse.cache import merge

    manifest = merge(sources, out)
    typer.echo(f"merged {len(sources)} sets into {out}: {manifest.num_rows} rows")
