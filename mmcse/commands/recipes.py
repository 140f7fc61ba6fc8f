"""``mmcse recipes list|show|run`` and ``mmcse ablate``: the papers' settings, run over seeds."""

from __future__ import annotations

import typer

from mmcse.commands import show
from mmcse.commands.flags import with_flags
from mmcse.recipes.layout import ABLATION_TABLE
from mmcse.recipes.recipe import RecipeRunSpec

app = typer.Typer()  # ablate
recipes_app = typer.Typer(help="Paper settings as named recipes.", no_args_is_help=True)
Opt = typer.Option

_NAME = typer.Argument(..., help="recipe name (mmcse recipes list)")
_CACHE_ROOT = Opt(
    "cache", "--cache-root", help="Stage-1 cache root: the folder holding <dataset>/<split>/<set>"
)
_DRY_RUN = Opt(False, "--dry-run", help="print every run it would train, then stop")
_RECIPES_HELP = "recipes, quoted patterns ('mcse/wiki+*/bert') or a table (mcse:table1)"
_OUTPUT_HELP = "one recipe: its folder (default runs/<name>), seeds in seed<k>/; several: the root (default runs), <root>/<recipe>/seed<k>/ and the table in <root>/tables/"


@recipes_app.command("list")
def recipes_list(
    tables: bool = Opt(False, "--tables", help="the papers' tables recipes run can train whole"),
) -> None:
    """Every recipe, its data setting and the published STS avg it should reproduce."""
    from mmcse.recipes.catalogue import listing, table_listing

    show(table_listing() if tables else listing())


@recipes_app.command("show")
def recipes_show(name: str = _NAME, cache_root: str = _CACHE_ROOT) -> None:
    """A recipe's settings, the cache sets it reads and its published numbers."""
    from mmcse.recipes import get_recipe
    from mmcse.reports.recipes import recipe_card

    show(recipe_card(get_recipe(name), cache_root))


@recipes_app.command("run")
@with_flags(RecipeRunSpec, "spec", build=True)
def recipes_run(
    spec: RecipeRunSpec,
    names: list[str] = typer.Argument(..., metavar="RECIPE", help=_RECIPES_HELP),
    output_dir: str = Opt(None, help=_OUTPUT_HELP),
    dry_run: bool = _DRY_RUN,
) -> None:
    """Train recipes over seeds and print them next to the published numbers. Finished seeds
    are skipped and stopped ones resume: rerun the same command to continue."""
    from mmcse.reports.recipes import recipes_run as run

    show(run(names, spec, output_dir, dry_run))


@app.command()
@with_flags(RecipeRunSpec, "spec", build=True)
def ablate(
    spec: RecipeRunSpec,
    recipe: str = Opt(..., "--recipe", help="recipe name (mmcse recipes list)"),
    drop: str = Opt(..., help="terms to zero: a,b+c gives rows 'w/o a' and 'w/o b & c'"),
    output_dir: str = Opt(None, help="run directories (default: runs/ablate/<recipe>)"),
    out: str = Opt(None, help=f"markdown table (default: <output-dir>/{ABLATION_TABLE}; + .json)"),
    dry_run: bool = _DRY_RUN,
) -> None:
    """Rerun a recipe with loss terms switched off; mean ± std and Welch p-values per row."""
    from mmcse.reports.recipes import ablate_run

    show(ablate_run(recipe, drop, spec, output_dir, out, dry_run))
