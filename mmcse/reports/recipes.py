"""What recipes produce, rendered: a recipe's card, a recipe run's tables, an ablation's table;
and ``mmcse recipes run`` / ``mmcse ablate``, which run a recipe and render what it produced.

Recipes compute (runs, rows, notes, records) and import no report; this module prints and
writes their tables (:mod:`mmcse.reports.compare` for markdown, :mod:`mmcse.reports.tables` for
.csv/.tex).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from mmcse.files import write_json
from mmcse.recipes import get_recipe
from mmcse.recipes.ablate import (
    P_COLUMN,
    PUBLISHED_COLUMN,
    Ablation,
    ablate,
    ablation_plan,
    label_of,
    parse_drops,
)
from mmcse.recipes.layout import AblationDir, SeedsDir
from mmcse.recipes.published import COLUMNS, PUBLISHED_ABLATIONS
from mmcse.recipes.recipe import Recipe
from mmcse.recipes.runs import (
    RecipeOutcome,
    describe_plan,
    parse_seeds,
    run_recipe,
    set_overrides,
)
from mmcse.recipes.summary import published_row
from mmcse.reports.compare import markdown_table
from mmcse.reports.tables import write_tables


def recipe_card(recipe: Recipe, cache_root: str = "cache") -> str:
    """``mmcse recipes show``: a recipe's settings, the cache sets it reads, its published rows."""
    if not recipe.published:
        return recipe.describe(cache_root)
    rows = [published_row(p, p.label) for p in recipe.published]
    return recipe.describe(cache_root) + "\n\n" + markdown_table(rows, extra_columns=("source",))


def recipe_tables(outcome: RecipeOutcome) -> str:
    """Write a recipe run's tables (results.md/.csv/.tex, as ``mmcse compare``) beside its
    record; return the markdown table with its notes."""
    rows, notes = outcome.rows, outcome.notes
    this_run = [i for i, r in enumerate(rows) if r.label.startswith("this run")]
    write_tables(rows, COLUMNS, outcome.seeds_dir.tables, ("source",), this_run, notes=notes)
    table = markdown_table(rows, extra_columns=("source",))
    return table + "".join(f"\n\n{n}" for n in notes)


def ablation_markdown(ablation: Ablation) -> str:
    title = (
        f"Ablation of {ablation.recipe.name} ({ablation.recipe.method}), "
        f"mean ± std over seeds {','.join(map(str, ablation.seeds))}"
    )
    extra = [P_COLUMN]
    if ablation.recipe.name in PUBLISHED_ABLATIONS:
        extra.append(PUBLISHED_COLUMN)
    notes = "".join(f"\n{note}\n" for note in ablation.notes())
    return f"{title}\n\n{markdown_table(ablation.table_rows(), extra_columns=extra)}\n{notes}"


def write_ablation(ablation: Ablation, path: str | Path) -> tuple[Path, Path]:
    """The markdown table at ``path``, .csv/.tex beside it (as ``mmcse compare``) and the full
    record as ``.json``."""
    md = Path(path)
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(ablation_markdown(ablation))
    extra = [P_COLUMN, PUBLISHED_COLUMN]
    write_tables(
        ablation.table_rows(), COLUMNS, md.with_suffix(""), extra, formats=("csv", "latex"),
        notes=ablation.notes(),
    )  # fmt: skip
    return md, write_json(md.with_suffix(".json"), ablation.to_dict())


def recipe_run(
    name: str,
    *,
    cache_root: str | Path = "cache",
    seeds: str | None = None,
    model: str | None = None,
    max_steps: int | None = None,
    output_dir: str | Path | None = None,
    sets: list[str] | None = None,
    dry_run: bool = False,
    overwrite: bool = False,
) -> Iterator[str]:
    """``mmcse recipes run``: train recipe ``name`` over ``seeds`` into ``output_dir`` (default
    runs/<name>) and yield the table beside the published numbers; ``dry_run`` yields the plan."""
    recipe = get_recipe(name)
    out, chosen = Path(output_dir or f"runs/{name}"), parse_seeds(recipe, seeds)
    given = dict(cache_root=cache_root, seeds=chosen, model=model, max_steps=max_steps)
    if dry_run:
        overrides = set_overrides(sets)
        yield describe_plan(recipe, [(name, out, overrides)], **given, user_overrides=overrides)
        return
    outcome = run_recipe(recipe, output_dir=out, **given, overrides=set_overrides(sets, overwrite))
    yield recipe_tables(outcome)
    yield f"results: {SeedsDir(out).results}"


def ablate_run(
    recipe: str,
    drop: str,
    *,
    cache_root: str | Path = "cache",
    seeds: str | None = None,
    model: str | None = None,
    max_steps: int | None = None,
    output_dir: str | Path | None = None,
    out: str | Path | None = None,
    sets: list[str] | None = None,
    dry_run: bool = False,
    overwrite: bool = False,
) -> Iterator[str]:
    """``mmcse ablate``: ablate the recipe named ``recipe`` with the rows ``drop``
    (:func:`mmcse.recipes.ablate.parse_drops`) into ``output_dir`` (default
    runs/ablate/<recipe>); write the table to ``out`` (default <output-dir>/ablation.md, + .json)
    and yield it; ``dry_run`` yields the plan."""
    chosen = get_recipe(recipe)
    runs_dir = Path(output_dir or f"runs/ablate/{recipe}")
    given = dict(cache_root=cache_root, seeds=parse_seeds(chosen, seeds), model=model,
                 max_steps=max_steps)  # fmt: skip
    if dry_run:
        overrides = set_overrides(sets)
        plan = ablation_plan(chosen, parse_drops(drop), runs_dir, overrides)
        rows = [(label_of(terms), d, over) for terms, _, d, over in plan]
        yield describe_plan(chosen, rows, **given, user_overrides=overrides)
        return
    overrides = set_overrides(sets, overwrite)
    result = ablate(chosen, parse_drops(drop), output_dir=runs_dir, **given, overrides=overrides)
    md, js = write_ablation(result, out or AblationDir(runs_dir).table)
    yield ablation_markdown(result)
    yield f"wrote {md} and {js}"
