"""What recipes produce, rendered: a recipe's card, a recipe run's tables, an ablation's table;
and ``mmcse recipes run`` / ``mmcse ablate``, which run a recipe and render what it produced.

Recipes compute (runs, rows, notes, records) and import no report; this module prints and
writes their tables (:mod:`mmcse.reports.compare` for markdown, :mod:`mmcse.reports.tables` for
.csv/.tex).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from mmcse.files import write_json
from mmcse.recipes import get_recipe
from mmcse.recipes.ablate import (
    P_COLUMN,
    PUBLISHED_COLUMN,
    Ablation,
    ablate,
    ablation_layout,
    label_of,
    parse_drops,
    plan_ablation,
)
from mmcse.recipes.layout import AblationDir, SeedsDir
from mmcse.recipes.published import COLUMNS, PUBLISHED_ABLATIONS
from mmcse.recipes.recipe import Recipe, RecipeRunSpec
from mmcse.recipes.runs import FINISHED, RecipeOutcome, describe_plan
from mmcse.recipes.summary import Row, published_row
from mmcse.recipes.table_run import (
    RANDOM_TEACHER,
    SOURCE_COLUMN,
    WELCH_COLUMN,
    TablePlan,
    plan_table,
    random_teacher_note,
    run_table,
    select,
    table_rows,
)
from mmcse.reports.compare import markdown_table
from mmcse.reports.runs import Run
from mmcse.reports.tables import BEST_RULE, render, with_tests, write_tables


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
    seeds = [outcome.seeds_dir.seed(seed).path for seed in outcome.runs.seeds]
    random = sorted({key for path in seeds for key in Run(path).random_teachers()})
    if random:  # flagged as mmcse compare and a table run flag it
        rows = [_random_flagged(row) for row in rows]
        notes = [*notes, random_teacher_note("this run", random)]
    this_run = [i for i, r in enumerate(rows) if r.label.startswith("this run")]
    write_tables(rows, COLUMNS, outcome.seeds_dir.tables, ("source",), this_run, notes=notes)
    table = markdown_table(rows, extra_columns=("source",))
    return table + "".join(f"\n\n{n}" for n in notes)


def _random_flagged(row):
    return (
        replace(row, label=row.label + RANDOM_TEACHER) if row.label.startswith("this run") else row
    )


def ablation_rows(ablation: Ablation) -> list[Row]:
    """The ablation's rows with each ``w/o`` row's Welch test against the full method."""
    return with_tests(ablation.table_rows(), ablation.tests(), P_COLUMN)


def ablation_markdown(ablation: Ablation) -> str:
    title = (
        f"Ablation of {ablation.recipe.name} ({ablation.recipe.method}), "
        f"mean ± std over seeds {','.join(map(str, ablation.seeds))}"
    )
    extra = [P_COLUMN]
    if ablation.recipe.name in PUBLISHED_ABLATIONS:
        extra.append(PUBLISHED_COLUMN)
    notes = "".join(f"\n{note}\n" for note in ablation.notes())
    return f"{title}\n\n{markdown_table(ablation_rows(ablation), extra_columns=extra)}\n{notes}"


def write_ablation(ablation: Ablation, path: str | Path) -> tuple[Path, Path]:
    """The markdown table at ``path``, .csv/.tex beside it (as ``mmcse compare``) and the full
    record as ``.json``."""
    md = Path(path)
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(ablation_markdown(ablation))
    extra, rows = [P_COLUMN, PUBLISHED_COLUMN], ablation_rows(ablation)
    write_tables(
        rows,
        COLUMNS,
        md.with_suffix(""),
        extra,
        formats=("csv", "latex"),
        notes=[BEST_RULE, *ablation.notes()],
    )
    return md, write_json(md.with_suffix(".json"), ablation.to_dict(rows))


def recipe_run(
    name: str, spec: RecipeRunSpec, output_dir: str | Path | None = None, dry_run: bool = False
) -> Iterator[str]:
    """``mmcse recipes run NAME``: train recipe ``name`` as ``spec`` says into ``output_dir``
    (default runs/<name>) and yield the table beside the published numbers; ``dry_run`` yields
    the plan. Before it starts: the seeds' states, disk and time (:class:`TablePlan`)."""
    recipe = get_recipe(name)
    spec, out = spec.for_recipe(recipe), Path(output_dir or f"runs/{name}")
    selection = select([name])
    if dry_run:
        yield describe_plan(recipe, [(name, out, spec.overrides)], spec)
        yield plan_table(selection, spec, out.parent, single=out, dry_run=True).describe()
        return
    plan = plan_table(selection, spec, out.parent, single=out)
    yield plan.describe()
    (outcome,) = run_table(plan)
    yield recipe_tables(outcome)
    yield f"results: {SeedsDir(out).results}"


def recipes_run(
    arguments: list[str],
    spec: RecipeRunSpec,
    output_dir: str | Path | None = None,
    dry_run: bool = False,
) -> Iterator[str]:
    """``mmcse recipes run NAME|PATTERN|TABLE...``: one recipe as :func:`recipe_run`; several
    (:func:`mmcse.recipes.table_run.select`) as a table run into ``output_dir`` (default runs),
    ``<output-dir>/<recipe>/seed<k>``: the plan first, then every run still to train, then the
    table (also on a dry run, when some seeds have finished)."""
    selection = select(arguments)
    if selection.table is None and len(selection.names) == 1:
        yield from recipe_run(selection.names[0], spec, output_dir, dry_run)
        return
    plan = plan_table(selection, spec, Path(output_dir or "runs"), dry_run=dry_run)
    yield plan.describe()
    if dry_run:  # the table so far, written nowhere
        if plan.count(FINISHED):
            yield paper_table(plan, write=False)
        return
    run_table(plan)
    yield paper_table(plan)


def paper_table(plan: TablePlan, fmt: str = "md", write: bool = True) -> str:
    """The table of a table run as the seed folders hold it now, returned in ``fmt`` with its
    title; ``write``: also as .md/.csv/.tex (as ``mmcse compare`` writes them) and .json (per
    seed) under ``<root>/tables/``, and where they went. No best is marked: rows of different
    settings and students do not compete; the p column tests the paper's pairs."""
    result = table_rows(plan, random_teachers=lambda path: Run(path).random_teachers())
    rows = with_tests(result.rows, result.tests, WELCH_COLUMN, named=True)
    extra = (SOURCE_COLUMN, WELCH_COLUMN)
    source = f" ({plan.selection.table.source})" if plan.selection.table else ""
    title = f"Table {plan.selection.label}{source}: mean ± std over the finished seeds"
    table = render(rows, COLUMNS, fmt, extra, measured=[], notes=result.notes)
    if not write:
        return f"{title}\n\n{table}"
    written = write_tables(rows, COLUMNS, plan.table_stem, extra, measured=[], notes=result.notes)
    record = write_json(plan.table_stem.with_suffix(".json"), result.record)
    where = ", ".join(str(p) for p in [*written, record])
    return f"{title}\n\n{table}\n\nwrote {where}"


def ablate_run(
    recipe: str,
    drop: str,
    spec: RecipeRunSpec,
    output_dir: str | Path | None = None,
    out: str | Path | None = None,
    dry_run: bool = False,
) -> Iterator[str]:
    """``mmcse ablate``: ablate the recipe named ``recipe`` with the rows ``drop``
    (:func:`mmcse.recipes.ablate.parse_drops`) as ``spec`` says into ``output_dir`` (default
    runs/ablate/<recipe>); write the table to ``out`` (default <output-dir>/ablation.md, +
    .json) and yield it; ``dry_run`` yields the plan."""
    chosen = get_recipe(recipe)
    spec, runs_dir = spec.for_recipe(chosen), Path(output_dir or f"runs/ablate/{recipe}")
    layout = ablation_layout(chosen, parse_drops(drop), runs_dir, spec.overrides)
    if dry_run:
        rows = [(label_of(terms), d, over) for terms, _, d, over in layout]
        yield describe_plan(chosen, rows, spec)
        yield plan_ablation(chosen, layout, spec, runs_dir, dry_run=True).describe()
        return
    yield plan_ablation(chosen, layout, spec, runs_dir).describe()
    result = ablate(chosen, parse_drops(drop), spec, runs_dir)
    md, js = write_ablation(result, out or AblationDir(runs_dir).table)
    yield ablation_markdown(result)
    yield f"wrote {md} and {js}"
