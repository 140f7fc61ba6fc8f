"""A paper's table in one command: several recipes × seeds, resumable, one table at the end.

``mmcse recipes run`` takes recipe names, patterns (``'mcse/wiki+*/bert'``) and the names of
the catalogue's tables (``mcse:table1``, :data:`~mmcse.recipes.published.PAPER_TABLES`);
:func:`select` turns them into recipes in the paper's order. :func:`plan_table` plans them, a
row per recipe, and :func:`run_table` trains them, through the one rows × seeds runner
(:mod:`mmcse.recipes.runner`: finished seeds skipped, stopped ones resumed, disk and time said
before it starts), each recipe's record and tables written as a one-recipe ``recipes run``
writes them. :func:`table_rows` reads what the seed folders hold — at the end, and on any later
call — as rows in the paper's order, with a Welch test (:func:`~mmcse.recipes.runner.welch`)
of each row against the row its paper compares it to (the rendering is
:mod:`mmcse.reports.recipes`').

Layout: ``<root>/<recipe name>/seed<k>`` (``root``: ``--output-dir``, default ``runs``), the
table as ``<root>/tables/<selection>.md|.csv|.tex`` and its record ``.json``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mmcse.errors import MmcseError
from mmcse.recipes import RECIPES, get_recipe  # the catalogue registered
from mmcse.recipes.layout import SeedsDir
from mmcse.recipes.published import PAPER_TABLES, PUBLISHED, PaperTable
from mmcse.recipes.recipe import Recipe, RecipeRunSpec
from mmcse.recipes.runner import PlannedRow, RunPlan, WelchTest, plan_row, welch
from mmcse.recipes.runs import (
    RecipeOutcome,
    SeedRuns,
    departure_note,
    departures,
    record_recipe,
    recorded_scores,
)
from mmcse.recipes.summary import Row, published_row, summarize
from mmcse.rundir import RunDir

TABLES_DIR = "tables"
PATTERN_CHARS = "*?["
WELCH_COLUMN = "p (Welch, Avg.)"
SOURCE_COLUMN = "source"
MISSING, PARTIAL, OVERRIDDEN = " [missing]", " [partial]", " [overridden]"
#: a row trained on features of a teacher with random weights (it distils from noise)
RANDOM_TEACHER = " [random teacher]"


# ---- what to run -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """The recipes ``recipes run`` was given, in the paper's order, and the table it named."""

    arguments: tuple[str, ...]
    names: tuple[str, ...]
    table: PaperTable | None = None

    @property
    def label(self) -> str:
        return self.table.name if self.table else " ".join(self.arguments)

    @property
    def stem(self) -> str:
        """A file name for the table: the arguments, ``__`` between them, each with its other
        characters as ``_`` (``mcse/wiki+*/bert`` → ``mcse_wiki+_bert``)."""
        parts = [re.sub(r"[^A-Za-z0-9+.-]+", "_", a).strip("_") for a in self.arguments]
        return "__".join(p for p in parts if p) or "table"

    @property
    def against(self) -> dict[str, str]:
        """Row → the row it is tested against (a table's pairs; else MCSE-family defaults
        where both rows were selected)."""
        if self.table is not None:
            return self.table.against
        pairs = {}
        for table in PAPER_TABLES.values():
            pairs.update({r: a for r, a in table.against.items()})
        return {r: a for r, a in pairs.items() if r in self.names and a in self.names}


def select(arguments: Sequence[str]) -> Selection:
    """Recipe names, patterns (``fnmatch`` over the catalogue) and table names → the recipes,
    each once: a table's in its order, the others in the order the papers print them."""
    if not arguments:
        raise MmcseError("give a recipe, a pattern or a table (mmcse recipes list --tables)")
    names: list[str] = []
    for argument in arguments:
        if argument in PAPER_TABLES:
            names += PAPER_TABLES[argument].rows
        elif ":" in argument:  # a table's name (recipe names have none)
            raise MmcseError(unknown_table(argument))
        elif any(c in argument for c in PATTERN_CHARS):
            matched = [n for n in RECIPES.names() if fnmatch.fnmatchcase(n, argument)]
            if not matched:
                raise MmcseError(
                    f"pattern {argument!r} matches no recipe (mmcse recipes list); quote it so "
                    "the shell does not expand it"
                )
            names += sorted(matched, key=paper_order)
        else:
            names.append(get_recipe(argument).name)  # an unknown name: the registry's error
    table = PAPER_TABLES.get(arguments[0]) if len(arguments) == 1 else None
    return Selection(tuple(arguments), tuple(dict.fromkeys(names)), table)


def unknown_table(name: str) -> str:
    """The refusal of a table name that is none: the tables, the closest first."""
    import difflib

    close = difflib.get_close_matches(name, list(PAPER_TABLES), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return (
        f"no table {name!r}; {hint}the tables: {', '.join(PAPER_TABLES)} "
        "(mmcse recipes list --tables)"
    )


def paper_order(name: str) -> tuple[int, str]:
    """Where a recipe's published row stands among the papers' rows (unpublished last)."""
    recipe = get_recipe(name)
    published = list(PUBLISHED)
    key = recipe.published_as or name
    return (published.index(key) if key in published else len(published), name)


def recipe_dir(root: str | Path, name: str) -> SeedsDir:
    return SeedsDir(Path(root) / name)


class TablePlan(RunPlan):
    """A table run's :class:`~mmcse.recipes.runner.RunPlan`: a row per selected recipe."""

    def __init__(self, selection: Selection, root: Path, rows: list[PlannedRow]):
        single = selection.table is None and len(rows) == 1  # one recipe: no table
        kind = "recipe" if single else "table"
        super().__init__(kind, selection.label, root, rows, None if single else "recipe")
        self.selection = selection

    @property
    def table_stem(self) -> Path:
        return self.root / TABLES_DIR / self.selection.stem


def plan_table(
    selection: Selection,
    spec: RecipeRunSpec,
    root: str | Path,
    single: str | Path | None = None,
    dry_run: bool = False,
) -> TablePlan:
    """Each recipe's seeds and their states, and the cache sets missing
    (:func:`~mmcse.recipes.runner.plan_row`); a dry run also refuses a student that does not
    load (:func:`~mmcse.recipes.runs.check_students`). ``single``: the one recipe's own folder
    (``recipes run NAME --output-dir DIR``)."""
    rows = []
    for name in selection.names:
        seeds_dir = SeedsDir(single) if single is not None else recipe_dir(root, name)
        rows.append(plan_row(name, get_recipe(name), spec, seeds_dir, dry_run))
    plan = TablePlan(selection, Path(root), rows)
    if dry_run:
        plan.check_students()
    return plan


def run_table(plan: TablePlan) -> list[RecipeOutcome]:
    """Train every run still to train (:meth:`~mmcse.recipes.runner.RunPlan.run`), writing
    each recipe's record as a one-recipe run writes it once its seeds have run."""
    outcomes = []

    def record(row: PlannedRow, runs: SeedRuns) -> None:
        outcomes.append(record_recipe(row.recipe, row.spec, row.seeds_dir.path, runs))

    plan.run(after_row=record)
    return outcomes


# ---- the table ---------------------------------------------------------------------------------


@dataclass
class TableRow:
    """One recipe's row: its finished seeds' numbers, the published rows beside it."""

    recipe: Recipe
    seeds: tuple[int, ...]
    per_seed: dict[int, dict | None]  # finished seeds only: their STS test numbers
    changes: dict[str, Any]
    #: feature sets of its finished seeds that came from teachers with random weights
    random_teachers: list[str] = field(default_factory=list)

    @property
    def scored(self) -> list[dict]:
        return [s for s in self.per_seed.values() if s]

    def label(self) -> str:
        name = self.recipe.name
        if not self.scored:
            return name + MISSING
        marks = PARTIAL if len(self.scored) < len(self.seeds) else ""
        marks += RANDOM_TEACHER if self.random_teachers else ""
        return name + marks + (OVERRIDDEN if self.changes else "")

    def row(self) -> Row:
        """Its mean ± std over the finished seeds; the p column is the report's to write."""
        summary = summarize(self.label(), self.scored)
        source = f"this run: {len(self.scored)} of {len(self.seeds)} seeds finished"
        return replace(summary, extra={SOURCE_COLUMN: source})

    def avgs(self) -> list[float]:
        return [s["avg"] for s in self.scored if "avg" in s]

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe.name,
            "seeds": list(self.seeds),
            "per_seed": {str(k): v for k, v in self.per_seed.items()},
            "overrides": self.changes,
        }


def read_rows(plan: TablePlan, random_teachers: RandomTeachers | None = None) -> list[TableRow]:
    """What the seed folders hold now: each finished seed's recorded STS test numbers (and,
    ``random_teachers`` given, the feature sets of random-weight teachers it read)."""
    rows = []
    for planned in plan.rows:
        finished = planned.finished()
        per_seed = {cfg.seed: recorded_scores(RunDir(cfg.output_dir)) for cfg in finished}
        seeds = tuple(cfg.seed for cfg, _ in planned.seeds)
        random = []
        if random_teachers is not None:
            random = [key for cfg in finished for key in random_teachers(Path(cfg.output_dir))]
        changes = departures(planned.recipe, planned.spec)
        rows.append(
            TableRow(planned.recipe, seeds, per_seed, changes, sorted(dict.fromkeys(random)))
        )
    return rows


def random_teacher_note(label: str, keys: list[str]) -> str:
    return (
        f"{label}{RANDOM_TEACHER}: trained on features of teachers with random weights "
        f"({', '.join(keys)}): it distils from noise and reproduces no published number."
    )


#: a run folder → the feature sets it read that came from teachers with random weights
RandomTeachers = Callable[[Path], list[str]]


@dataclass
class PaperTableResult:
    """The rows (ours, each followed by its published ones), which are ours, the Welch test of
    each row the paper compares (by row index), and the notes."""

    rows: list[Row]
    measured: list[int]
    tests: dict[int, WelchTest]
    notes: list[str]
    record: dict[str, Any]


def table_rows(plan: TablePlan, random_teachers: RandomTeachers | None = None) -> PaperTableResult:
    """The table in the paper's order: each recipe's mean ± std over its finished seeds, a
    Welch p against the row the paper tests it against (only with ≥ 2 seeds a side), then its
    published rows; missing, partial, overridden rows and rows trained on random-weight
    teachers' features marked (``random_teachers``: a run folder's such feature sets)."""
    ours = read_rows(plan, random_teachers)
    by_name = {r.recipe.name: r for r in ours}
    against = plan.selection.against
    rows, measured, tests, notes = [], [], {}, []
    for row in ours:
        other = by_name.get(against.get(row.recipe.name, ""))
        if other is not None:
            tests[len(rows)] = welch(other.recipe.name, row.avgs(), other.avgs())
        measured.append(len(rows))
        rows.append(row.row())
        rows += [published_row(p) for p in row.recipe.published]
        if row.changes:
            notes.append(f"{row.recipe.name}: {departure_note(row.changes)}")
        if row.random_teachers:
            notes.append(random_teacher_note(row.recipe.name, row.random_teachers))
    missing = [r.recipe.name for r in ours if not r.scored]
    partial = [r.recipe.name for r in ours if r.scored and len(r.scored) < len(r.seeds)]
    if missing:
        notes.append(f"{MISSING.strip()}: no finished seed yet: {', '.join(missing)}.")
    if partial:
        notes.append(f"{PARTIAL.strip()}: fewer seeds finished than asked: {', '.join(partial)}.")
    notes.append(
        f"{WELCH_COLUMN}: two-sided Welch t-test of the row's Avg. over its seeds against the row "
        "named (the paper's comparison), only where each side has at least 2 finished seeds."
    )
    record = {
        "table": plan.selection.label,
        "source": plan.selection.table.source if plan.selection.table else None,
        "rows": [r.to_dict() for r in ours],
        "against": against,
        "tests": {ours[measured.index(i)].recipe.name: t.to_dict() for i, t in tests.items()},
    }
    return PaperTableResult(rows, measured, tests, notes, record)
