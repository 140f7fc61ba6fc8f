"""A paper's table in one command: several recipes × seeds, resumable, one table at the end.

``mmcse recipes run`` takes recipe names, patterns (``'mcse/wiki+*/bert'``) and the names of
the catalogue's tables (``mcse:table1``, :data:`~mmcse.recipes.published.PAPER_TABLES`);
:func:`select` turns them into recipes in the paper's order. :func:`plan_table` says, before
anything trains, what every (recipe, seed) folder holds (:func:`mmcse.recipes.runs.seed_state`:
finished seeds are skipped, stopped or killed ones resume from their ``last/``), which cache sets
are missing (with the commands that write them), the disk the checkpoints will take and, from a
step time some run of the table measured on a GPU, how long the rest will take (an estimate).
:func:`run_table` trains the rest recipe by recipe (each recipe's record and tables as a one-
recipe ``recipes run`` writes them), logging one line for the table before each run; a stop
signal stops the current run (its ``last/`` saved) and the table with it, and the same command
continues. :func:`table_rows` reads what the seed folders hold — at the end, and on any later
call — as rows in the paper's order (the rendering is :mod:`mmcse.reports.recipes`').

Layout: ``<root>/<recipe name>/seed<k>`` (``root``: ``--output-dir``, default ``runs``), the
table as ``<root>/tables/<selection>.md|.csv|.tex`` and its record ``.json``.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmcse.cache.layout import MANIFEST_NAME
from mmcse.errors import MmcseError
from mmcse.files import read_json
from mmcse.recipes import RECIPES, get_recipe  # the catalogue registered
from mmcse.recipes.layout import SeedsDir
from mmcse.recipes.published import PAPER_TABLES, PUBLISHED, PaperTable
from mmcse.recipes.recipe import Recipe, RecipeRunSpec
from mmcse.recipes.runs import (
    FINISHED,
    NEW,
    REFUSED,
    RESTART,
    RESUME,
    check_method,
    check_students,
    departure_note,
    departures,
    pooling_hint,
    recorded_scores,
    run_recipe,
    seed_configs,
    seed_state,
)
from mmcse.recipes.summary import Row, published_row, summarize, welch_p
from mmcse.rundir import RunDir
from mmcse.training.checkpoint_writer import checkpoint_estimate, format_bytes
from mmcse.training.config import TrainConfig

logger = logging.getLogger(__name__)

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


@dataclass
class RecipePlan:
    recipe: Recipe
    spec: RecipeRunSpec
    seeds_dir: SeedsDir
    seeds: list[tuple[TrainConfig, str]]  # (config, state) per seed
    missing: list[Any] = field(default_factory=list)  # cache Needs not there
    refused: list[str] = field(default_factory=list)  # a dry run: why a seed's run would refuse


@dataclass
class TablePlan:
    """Every (recipe, seed) of a table run and what its folder holds, before anything trains."""

    selection: Selection
    root: Path
    recipes: list[RecipePlan]

    def states(self) -> list[str]:
        return [state for r in self.recipes for _, state in r.seeds]

    @property
    def total(self) -> int:
        return len(self.states())

    def count(self, *states: str) -> int:
        return sum(state in states for state in self.states())

    @property
    def table_stem(self) -> Path:
        return self.root / TABLES_DIR / self.selection.stem

    def describe(self) -> str:
        """Runs, cache sets (with the commands for the missing ones), disk, time estimate."""
        seeds = sorted({cfg.seed for r in self.recipes for cfg, _ in r.seeds})
        label, single = (
            self.selection.label,
            self.selection.table is None and len(self.recipes) == 1,
        )
        head = (
            f"recipe {label}: seeds"
            if single
            else f"table {label}: {len(self.recipes)} recipe(s) x seeds"
        )
        where = self.recipes[0].seeds_dir.path if single else self.root
        lines = [
            f"{head} {','.join(map(str, seeds))} = {self.total} run(s): {self.count(FINISHED)} "
            f"finished (skipped), {self.count(RESUME)} to resume, {self.count(NEW, RESTART)} to "
            f"train; under {where}",
        ]
        refused = [why for r in self.recipes for why in r.refused]
        if refused:
            lines.append(f"{len(refused)} seed folder(s) the run would refuse:")
            lines += [f"  {why}" for why in refused]
        if not single:  # what a one-recipe dry run says of its recipe, for each
            lines += self._setting_lines()
        lines += self._cache_lines()
        lines += disk_lines(self)
        lines.append(time_estimate(self))
        return "\n".join(lines)

    def _setting_lines(self) -> list[str]:
        """Each recipe's departures from its own setting and its pooling note (a student that
        ships its own pooling trained with the recipe's)."""
        lines = []
        for plan in self.recipes:
            note = departure_note(departures(plan.recipe, plan.spec))
            hint = pooling_hint(plan.recipe, plan.spec)
            lines += [f"  {plan.recipe.name}: {text}" for text in (note, hint) if text]
        if not lines:
            return ["settings: every recipe's own (no overrides)"]
        return ["settings:", *lines]

    def _cache_lines(self) -> list[str]:
        missing = [(r.recipe.name, n) for r in self.recipes for n in r.missing]
        if not missing:
            return [f"cache under {self.recipes[0].spec.cache_root}: every set is there"]
        lines = [f"cache: {len({n.path for _, n in missing})} set(s) missing (UPPERCASE = yours):"]
        for recipe in self.recipes:
            if recipe.missing:
                lines.append(f"  {recipe.recipe.name}: {', '.join(n.what for n in recipe.missing)}")
        commands = dict.fromkeys(n.command for _, n in missing)
        return lines + ["  run first:", *(f"    {c}" for c in commands)]


def plan_table(
    selection: Selection,
    spec: RecipeRunSpec,
    root: str | Path,
    single: str | Path | None = None,
    dry_run: bool = False,
) -> TablePlan:
    """Each recipe's seeds and their states, and the cache sets missing. A folder that cannot
    be its seed's run is refused here, before anything trains; a dry run lists it instead, and
    refuses a student that does not load (:func:`~mmcse.recipes.runs.check_students`).
    ``single``: the one recipe's own folder (``recipes run NAME --output-dir DIR``)."""
    plans = []
    for name in selection.names:
        recipe = get_recipe(name)
        recipe_spec = spec.for_recipe(recipe)
        seeds_dir = SeedsDir(single) if single is not None else recipe_dir(root, name)
        seeds, refused = [], []
        for cfg in seed_configs(recipe, recipe_spec, seeds_dir.path):
            try:
                seeds.append((cfg, seed_state(cfg)))
            except MmcseError as exc:
                if not dry_run:
                    raise
                seeds.append((cfg, REFUSED))
                refused.append(str(exc))
        given = set(recipe_spec.overrides)
        needs = [
            n
            for n in recipe.needs(recipe_spec.cache_root)
            if not _overridden(n.key, given) and not (n.path / MANIFEST_NAME).is_file()
        ]
        plans.append(RecipePlan(recipe, recipe_spec, seeds_dir, seeds, needs, refused))
    if dry_run:  # what every seed's start checks, once per student
        check_students([(p.recipe.name, cfg) for p in plans for cfg, _ in p.seeds])
    return TablePlan(selection, Path(root), plans)


def _overridden(key: str, given: set[str]) -> bool:
    """A cache set the run's ``--set`` replaces (as :meth:`Recipe.check_cache` skips it)."""
    return key in given or (key.startswith("features.") and "features" in given)


# ---- disk and time, before it starts ---------------------------------------------------------


def disk_lines(plan: TablePlan) -> list[str]:
    """What the checkpoints of the runs still to train will take (best/ + last/ each; last/
    only while a run is unfinished with ``keep_last`` false)."""
    total, unknown, lines = 0, [], []
    for recipe in plan.recipes:
        todo = [cfg for cfg, state in recipe.seeds if state != FINISHED]
        if not todo:
            continue
        estimate = checkpoint_estimate(todo[0].model)
        if estimate is None:
            unknown.append(recipe.recipe.name)
            continue
        kept = estimate["best"] + (estimate["last"] if todo[0].keep_last_checkpoint else 0)
        total += kept * len(todo)
    where = (
        f" (not counted: {', '.join(unknown)}: its student's weights are not on disk)"
        if unknown
        else ""
    )
    if total or unknown:
        lines.append(
            f"disk: about {format_bytes(total)} of checkpoints for the runs still to train "
            f"(each keeps best/ and, unless --set keep_last_checkpoint=false, last/){where}"
        )
    return lines or ["disk: nothing more (every run has finished)"]


def time_estimate(plan: TablePlan) -> str:
    """From a step time measured on a GPU by a run of the same method and student in this
    table (its ``metrics.jsonl``), the time the runs still to train need: an estimate."""
    measured: dict[tuple[str, str], float] = {}
    totals: dict[str, int] = {}
    for recipe in plan.recipes:
        for cfg, _ in recipe.seeds:
            rate, total = measured_rate(RunDir(cfg.output_dir))
            if rate:
                measured.setdefault((cfg.method, cfg.model), rate)
            if total:
                totals.setdefault(recipe.recipe.name, total)
    seconds, covered, todo = 0.0, 0, 0
    for recipe in plan.recipes:
        for cfg, state in recipe.seeds:
            if state == FINISHED:
                continue
            todo += 1
            rate, total = measured.get((cfg.method, cfg.model)), totals.get(recipe.recipe.name)
            if rate and total:
                done = (RunDir(cfg.output_dir).last.read_info() or {}).get("step", 0)
                seconds += max(0, total - done) / rate
                covered += 1
    if not todo:
        return "time: nothing left to train"
    if not covered:
        return (
            "time: no estimate (no run of these methods has measured its step time on a GPU "
            "yet; --dry-run again after the first)"
        )
    took = f"{seconds / 3600:.1f} h" if seconds >= 7200 else f"{max(1, round(seconds / 60))} min"
    return (
        f"time: about {took} of training for {covered} of the {todo} runs left "
        "(an ESTIMATE from step times measured by earlier runs of the same method and student; "
        "evaluation not counted)"
    )


def measured_rate(run: RunDir) -> tuple[float | None, int | None]:
    """(steps per second a GPU run logged, its planned total steps); None where unknown."""
    plan = read_json(run.plan) or {}
    total = plan.get("total_steps") if isinstance(plan.get("total_steps"), int) else None
    if not str(plan.get("device", "")).startswith("cuda"):
        return None, total
    rates = [r["steps_per_s"] for r in run.read_metrics() if _positive(r.get("steps_per_s"))]
    return (sorted(rates)[len(rates) // 2] if rates else None), total


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


# ---- running it --------------------------------------------------------------------------------


class TableProgress:
    """One line for the table before each run: runs done, this one, runs left."""

    def __init__(self, plan: TablePlan) -> None:
        self.label, self.total, self.done = plan.selection.label, plan.total, 0

    def __call__(self, recipe: str, seed: int, state: str) -> None:
        if state == FINISHED:
            self.done += 1
            return
        left = self.total - self.done - 1
        logger.info(
            f"table {self.label}: {self.done} of {self.total} runs done, running {recipe} seed "
            f"{seed}, {left} left"
        )
        self.done += 1  # told before it starts: done once the next one is told


def run_table(plan: TablePlan) -> None:
    """Train every run still to train, recipe by recipe (each recipe's record written as a
    one-recipe run writes it). A stop signal ends the current run with last/ saved and the
    table with it: the same command continues."""
    for recipe in plan.recipes:  # every recipe checked before the first trains
        recipe.recipe.check_cache(recipe.spec.cache_root, set(recipe.spec.overrides))
        first = recipe.seeds[0][0] if recipe.seeds else None
        if first is not None:
            check_method(first, recipe.recipe.name)
    progress = TableProgress(plan)
    try:
        for recipe in plan.recipes:
            run_recipe(recipe.recipe, recipe.spec, recipe.seeds_dir.path, on_run=progress)
    except KeyboardInterrupt:
        logger.warning(
            f"table {plan.selection.label} stopped with {progress.done - 1} of {plan.total} runs "
            "done; rerun the same command to continue"
        )
        raise


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

    def row(self, p_text: str) -> Row:
        summary = summarize(self.label(), self.scored)
        source = f"this run: {len(self.scored)} of {len(self.seeds)} seeds finished"
        extra = {SOURCE_COLUMN: source, WELCH_COLUMN: p_text}
        return Row(summary.label, summary.mean, summary.std, summary.n, extra,
                   values=summary.values)  # fmt: skip

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
    for recipe in plan.recipes:
        finished = [
            cfg
            for cfg, state in recipe.seeds
            if state != REFUSED and RunDir(cfg.output_dir).finished()  # refused: other settings
        ]
        per_seed = {cfg.seed: recorded_scores(RunDir(cfg.output_dir)) for cfg in finished}
        seeds = tuple(cfg.seed for cfg, _ in recipe.seeds)
        random = [] if random_teachers is None else [
            key for cfg in finished for key in random_teachers(Path(cfg.output_dir))
        ]  # fmt: skip
        changes = departures(recipe.recipe, recipe.spec)
        rows.append(
            TableRow(recipe.recipe, seeds, per_seed, changes, sorted(dict.fromkeys(random)))
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
    """The rows (ours, each followed by its published ones), which are ours, and the notes."""

    rows: list[Row]
    measured: list[int]
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
    rows, measured, notes = [], [], []
    for row in ours:
        measured.append(len(rows))
        rows.append(row.row(p_value_text(row, by_name.get(against.get(row.recipe.name, "")))))
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
    }
    return PaperTableResult(rows, measured, notes, record)


def p_value_text(row: TableRow, other: TableRow | None) -> str:
    if other is None:
        return ""
    name = other.recipe.name
    a, b = row.avgs(), other.avgs()
    if len(a) < 2 or len(b) < 2:
        return f"– vs {name} (needs 2 seeds a side: {len(a)}, {len(b)})"
    p = welch_p(a, b)
    return f"{p:.3g} vs {name}" if p is not None else f"– vs {name} (no variance)"
