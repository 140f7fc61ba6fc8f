"""``mmcse train``, ``demo`` and ``methods`` (Stage 2). Train's setting flags are TrainConfig's
fields (:mod:`mmcse.commands.flags`); only the flags that are not settings are written here."""

from __future__ import annotations

import functools

import typer

from mmcse.commands import show
from mmcse.commands.flags import plain, with_flags
from mmcse.training.config import GivenSettings, TrainConfig

app = typer.Typer()
Opt = typer.Option
RunOpt = functools.partial(Opt, rich_help_panel="Run")  # the flags that are not settings


@app.command()
@with_flags(TrainConfig, into="settings", given=GivenSettings)
def train(
    config: str = RunOpt(
        None,
        "--config",
        metavar="FILE",
        help=plain("settings file: .json or .toml (top level, or one [train] table)"),
    ),
    dry_run: bool = RunOpt(
        False, help="check every input, print the config, method and batch plan; train nothing"
    ),
    resume: str = RunOpt(
        None,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its "
        "last/ checkpoint (checked first); a finished run is left as it is (exit 0) unless a "
        "larger --max-steps/--epochs extends it",
    ),
    settings: GivenSettings | None = None,
) -> None:
    """Fine-tune a student against cached features (``--method simcse|mcse|...``)."""
    from mmcse.training.launch import launch

    show(launch(config, settings, resume=resume, dry_run=dry_run))


@app.command()
def demo(
    out: str = Opt("runs/demo", help="where the generated world, cache and runs go"),
    steps: int = Opt(300, help="training steps per method"),
    device: str = Opt("auto", help="auto|cpu|cuda"),
) -> None:
    """Offline end-to-end demo: drawn images → Stage 1 → SimCSE vs MCSE → table and curves."""
    from mmcse.demo.run import run_demo

    show(run_demo(out, steps=steps, device=device))


@app.command()
def methods() -> None:
    """Registered methods: loss terms, feature roles, settings with defaults."""
    from mmcse.reports.overview import methods_overview

    show(methods_overview())
