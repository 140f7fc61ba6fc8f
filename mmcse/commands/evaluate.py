"""``mmcse eval`` (SentEval STS, transfer, retrieval) and ``mmcse export``."""

from __future__ import annotations

import typer

from mmcse.commands import show

app = typer.Typer()
Opt = typer.Option


@app.command("eval")
def eval_command(
    model: str = Opt(..., help="Training run directory (uses run/best) or HF model dir."),
    pooler: str = Opt(None, help="cls | cls_before_pooler | avg (= mean) | max | avg_first_last "
                      "| avg_top2 | auto (default: the run's, else the student's own "
                      "1_Pooling config, else cls_before_pooler)"),
    data: str = Opt(None, help="SentEval folder (holds downstream/STS) [../shared/data/senteval]"),
    out: str = Opt(None, help="Write the results as JSON to this file."),
    mode: str = Opt("test", help="test: the 7 STS tasks; dev: STS-B and SICK-R dev."),
    batch_size: int = Opt(128, help="Sentences per forward pass."),
    device: str = Opt(None, help="cpu, cuda, cuda:1, ... (default: cuda if any)"),
    align_uniform: bool = Opt(False, "--align-uniform", help="Also alignment and uniformity."),
    tasks: str = Opt("sts", help="Comma-separated: sts, transfer (or some of MR,CR,SUBJ,MPQA,"
                     "SST2,TREC,MRPC), retrieval."),
    transfer_mode: str = Opt("test", help="test (the papers': 10-fold, Adam) | fasttest."),
    images_features: str = Opt(None, help="Retrieval: held-out images' feature set (by id)."),
    captions: str = Opt(None, help="Retrieval: their caption corpus (--caption-policy all)."),
    head: str = Opt(None, help="Retrieval: which loss term's heads [default: first]."),
) -> None:  # fmt: skip
    """SentEval STS (Spearman x 100, 'all'), transfer tasks and cross-modal retrieval; a run
    directory keeps every result beside its earlier ones, per task and protocol."""
    from mmcse.evaluation.evaluate import evaluate_model

    show(evaluate_model(
        model, tasks=tasks, data=data, out=out, mode=mode, pooler=pooler, batch_size=batch_size,
        device=device, align_uniform=align_uniform, transfer_mode=transfer_mode,
        images_features=images_features, captions=captions, head=head,
    ))  # fmt: skip


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
