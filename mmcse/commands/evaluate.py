"""``mmcse eval`` (SentEval STS, transfer, retrieval) and ``mmcse export``."""

from __future__ import annotations

import typer

from mmcse.commands import show
from mmcse.commands.flags import with_flags
from mmcse.evaluation.request import EvalRequest

app = typer.Typer()
Opt = typer.Option


@app.command("eval")
@with_flags(EvalRequest, "request", build=True)
def eval_command(request: EvalRequest) -> None:
    """SentEval STS (Spearman x 100, 'all'), transfer tasks and cross-modal retrieval; a run
    directory keeps every result beside its earlier ones, per task and protocol."""
    from mmcse.evaluation.evaluate import evaluate_model

    show(evaluate_model(request))


@app.command()
def export(
    run: str = typer.Argument(..., help="training run dir (uses run/best), checkpoint or HF dir"),
    out: str = typer.Argument(..., help="sentence-transformers model dir to write"),
    pooler: str = Opt(None, help="(default: the pooler mmcse eval uses for RUN)"),
    overwrite: bool = Opt(False, "--overwrite", help="replace a non-empty OUT"),
) -> None:
    """Write a sentence-transformers model dir that encodes exactly as mmcse eval scores RUN."""
    from mmcse.reports.export import export_run

    path, used = export_run(run, out, pooler=pooler, overwrite=overwrite)
    typer.echo(f"exported {run} to {path} (pooling {used}); model card {path}/README.md")
