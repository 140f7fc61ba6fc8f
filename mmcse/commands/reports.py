"""``mmcse compare`` and ``mmcse plot``: runs side by side, as tables and figures."""

from __future__ import annotations

import typer

from mmcse.commands import show

app = typer.Typer()


@app.command()
def compare(
    runs: list[str] = typer.Argument(
        ...,
        help="Run directories, or folders of seed runs; a model directory or hub id (not a run) "
        "is the base model's row (before fine-tuning), scored once and cached.",
    ),
    table_format: str = typer.Option("md", "--format", help="md | csv | latex"),
    out: str = typer.Option(None, help="Also write the table to this file."),
    data: str = typer.Option(
        None, help="SentEval folder to score a base model on [default: the runs' own]."
    ),
    group_seeds: bool = typer.Option(
        True,
        help="Runs whose configs differ only in seed and output folder are one row "
        "(--no-group-seeds: a row per argument).",
    ),
) -> None:
    """STS (+ transfer, + retrieval) of runs in one table: mean ± std over seeds; a best mark
    only where a Welch test over >= 2 seeds a side supports it, shown with its n and p."""
    from mmcse.reports.compare_runs import compare_report

    show(compare_report(runs, table_format, out, data, group=group_seeds))


@app.command()
def plot(
    runs: list[str] = typer.Argument(..., help="Run directories, seed folders or ablation dirs."),
    out_dir: str = typer.Option(
        None, help="Where the scatter and the overlaid curves go [default: beside the runs]."
    ),
    align_uniform: bool = typer.Option(
        False, "--align-uniform", help="Compute alignment/uniformity on STS-B where missing."
    ),
    data: str = typer.Option(None, help="SentEval data folder (for --align-uniform)."),
) -> None:
    """PNG training curves per run, each metric of all runs overlaid, the alignment–uniformity
    scatter, ablation bar charts."""
    from mmcse.reports.plots import write_run_plots

    written = write_run_plots(runs, out_dir, with_align_uniform=align_uniform, data_dir=data)
    show(f"wrote {path}" for path in written)
