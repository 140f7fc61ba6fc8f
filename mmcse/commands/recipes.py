"""``mmcse recipes list|show|run`` and ``mmcse ablate``: the papers' settings, run over seeds."""

from __future__ import annotations

import typer

from mmcse.commands import show
from mmcse.recipes.layout import ABLATION_TABLE

app = typer.Typer()  # ablate
recipes_app = typer.Typer(help="Paper settings as named recipes.", no_args_is_help=True)
Opt = typer.Option

_NAME = typer.Argument(..., help="recipe name (mmcse recipes list)")
_CACHE_ROOT = Opt("cache", "--cache-root", help="Stage-1 cache root (layout: mmcse.recipes.recipe)")
_SEEDS = Opt(None, help="comma-separated seeds (default: the recipe's, e.g. 0,1,2,3,4)")
_MODEL = Opt(None, help="student override: local HF dir or hub id")
_MAX_STEPS = Opt(None, help="stop each run after N steps (smoke runs)")
_SET = Opt(None, "--set", help="TrainConfig override KEY=VALUE (repeatable)")
_DRY_RUN = Opt(False, "--dry-run", help="print every run it would train, then stop")
_OVERWRITE = Opt(False, "--overwrite", help="replace runs already in the seed folders")


@recipes_app.command("list")
def recipes_list() -> None:
    """Every recipe, its data setting and the published STS avg it should reproduce."""
    from mmcse.recipes.catalogue import listing

    show(listing())


@recipes_app.command("show")
def recipes_show(name: str = _NAME, cache_root: str = _CACHE_ROOT) -> None:
    """A recipe's settings, the cache sets it reads and its published numbers."""
    from mmcse.recipes import get_recipe
    from mmcse.reports.recipes import recipe_card

    show(recipe_card(get_recipe(name), cache_root))


@recipes_app.command("run")
def recipes_run(
    name: str = _NAME,
    cache_root: str = _CACHE_ROOT,
    seeds: str = _SEEDS,
    model: str = _MODEL,
    max_steps: int = _MAX_STEPS,
    output_dir: str = Opt(None, help="run directory (default: runs/<name>); seeds in seed<k>/"),
    set_: list[str] = _SET,
    dry_run: bool = _DRY_RUN,
    overwrite: bool = _OVERWRITE,
) -> None:
    """Train a recipe over seeds and print it next to the published numbers."""
    from mmcse.reports.recipes import recipe_run

    show(recipe_run(name, cache_root=cache_root, seeds=seeds, model=model, max_steps=max_steps,
                    output_dir=output_dir, sets=set_, dry_run=dry_run, overwrite=overwrite))  # fmt: skip


@app.command()
def ablate(
    recipe: str = Opt(..., "--recipe", help="recipe name (mmcse recipes list)"),
    drop: str = Opt(..., help="terms to zero: a,b+c gives rows 'w/o a' and 'w/o b & c'"),
    cache_root: str = _CACHE_ROOT,
    seeds: str = _SEEDS,
    model: str = _MODEL,
    max_steps: int = _MAX_STEPS,
    output_dir: str = Opt(None, help="run directories (default: runs/ablate/<recipe>)"),
    out: str = Opt(None, help=f"markdown table (default: <output-dir>/{ABLATION_TABLE}; + .json)"),
    set_: list[str] = _SET,
    dry_run: bool = _DRY_RUN,
    overwrite: bool = _OVERWRITE,
) -> None:
    """Rerun a recipe with loss terms switched off; mean ± std and Welch p-values per row."""
    from mmcse.reports.recipes import ablate_run

    show(ablate_run(recipe, drop, cache_root=cache_root, seeds=seeds, model=model,
                    max_steps=max_steps, output_dir=output_dir, out=out, sets=set_,
                    dry_run=dry_run, overwrite=overwrite))  # fmt: skip
