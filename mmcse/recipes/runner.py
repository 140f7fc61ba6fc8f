"""Rows × seeds: the one runner of ``mmcse recipes run`` (a recipe, a paper's table) and
``mmcse ablate``.

A *row* is one setting trained over seeds into its own folder (:class:`SeedsDir`): a recipe of
a table, or an ablation row (the recipe with some loss terms at zero). :func:`plan_row` says,
before anything trains, what every seed folder holds (:func:`~mmcse.recipes.runs.seed_state`:
finished seeds are skipped, stopped or killed ones resume from their ``last/``) and which cache
sets are missing; :meth:`RunPlan.describe` adds the disk the checkpoints will take and, from a
step time some run of the plan measured on a GPU, how long the rest will take (an estimate).
:meth:`RunPlan.run` checks every row, then trains the rest row by row, one log line per run; a
stop signal stops the current run (its ``last/`` saved) and the plan with it, and the same
command continues. Rows are compared by one test, :func:`welch` (a two-sided Welch t-test of
their per-seed STS Avg.), written one way by :func:`mmcse.reports.tables.welch_text`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmcse.cache.layout import MANIFEST_NAME
from mmcse.errors import MmcseError
from mmcse.files import read_json
from mmcse.recipes.layout import SeedsDir
from mmcse.recipes.recipe import Recipe, RecipeRunSpec
from mmcse.recipes.runs import (
    FINISHED,
    NEW,
    REFUSED,
    RESTART,
    RESUME,
    SeedRuns,
    check_method,
    check_students,
    departure_note,
    departures,
    pooling_hint,
    run_seeds,
    seed_configs,
    seed_state,
)
from mmcse.recipes.summary import welch_p
from mmcse.rundir import RunDir
from mmcse.training.checkpoint_writer import checkpoint_estimate, format_bytes
from mmcse.training.config import TrainConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WelchTest:
    """A row's per-seed Avg. against the row named ``against``: the seeds on each side and the
    two-sided Welch p (None: fewer than 2 seeds a side, or no variance)."""

    against: str
    n: int
    others: int
    p: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"against": self.against, "n": self.n, "others": self.others, "p": self.p}


def welch(against: str, avgs: Sequence[float], other: Sequence[float]) -> WelchTest:
    return WelchTest(against, len(avgs), len(other), welch_p(avgs, other))


# ---- the plan ------------------------------------------------------------------------------


@dataclass
class PlannedRow:
    """One row's seeds and what their folders hold, before anything trains."""

    label: str
    recipe: Recipe
    spec: RecipeRunSpec  # the recipe's, with the row's overrides
    seeds_dir: SeedsDir
    seeds: list[tuple[TrainConfig, str]]  # (config, state) per seed
    missing: list[Any] = field(default_factory=list)  # cache Needs not there
    refused: list[str] = field(default_factory=list)  # a dry run: why a seed's run would refuse

    def finished(self) -> list[TrainConfig]:
        """The seeds whose folders hold a finished run of this row (refused ones: of others)."""
        return [
            cfg
            for cfg, state in self.seeds
            if state != REFUSED and RunDir(cfg.output_dir).finished()
        ]


def plan_row(
    label: str, recipe: Recipe, spec: RecipeRunSpec, seeds_dir: SeedsDir, dry_run: bool = False
) -> PlannedRow:
    """The row's seeds and their states, and the cache sets missing. A folder that cannot be
    its seed's run is refused here, before anything trains; a dry run lists it instead."""
    spec = spec.for_recipe(recipe)
    seeds, refused = [], []
    for cfg in seed_configs(recipe, spec, seeds_dir.path):
        try:
            seeds.append((cfg, seed_state(cfg)))
        except MmcseError as exc:
            if not dry_run:
                raise
            seeds.append((cfg, REFUSED))
            refused.append(str(exc))
    given = set(spec.overrides)
    missing = [
        n
        for n in recipe.needs(spec.cache_root)
        if not _overridden(n.key, given) and not (n.path / MANIFEST_NAME).is_file()
    ]
    return PlannedRow(label, recipe, spec, seeds_dir, seeds, missing, refused)


def _overridden(key: str, given: set[str]) -> bool:
    """A cache set the run's ``--set`` replaces (as :meth:`Recipe.check_cache` skips it)."""
    return key in given or (key.startswith("features.") and "features" in given)


#: told after each row has run: the row and its seeds' runs (a table writes the recipe record)
AfterRow = Callable[[PlannedRow, SeedRuns], None]


@dataclass
class RunPlan:
    """Every (row, seed) run of a command and what its folder holds.

    ``kind`` and ``label`` name it in every line (``table mcse:table1``, ``ablation R``);
    ``unit`` is what a row is (``recipe``, ``row``; None: one recipe alone); ``root`` holds it.
    """

    kind: str
    label: str
    root: Path
    rows: list[PlannedRow]
    unit: str | None = "recipe"

    @property
    def name(self) -> str:
        return f"{self.kind} {self.label}"

    def states(self) -> list[str]:
        return [state for row in self.rows for _, state in row.seeds]

    @property
    def total(self) -> int:
        return len(self.states())

    def count(self, *states: str) -> int:
        return sum(state in states for state in self.states())

    def check_students(self) -> None:
        """What every seed's start checks, once per student (a dry run's refusal)."""
        check_students([(row.label, cfg) for row in self.rows for cfg, _ in row.seeds])

    # ---- said before it starts

    def describe(self) -> str:
        """Runs, refused folders, settings, cache sets (with the commands for the missing
        ones), disk, time estimate."""
        seeds = sorted({cfg.seed for row in self.rows for cfg, _ in row.seeds})
        rows = f" {len(self.rows)} {self.unit}(s) x" if self.unit else ""
        head = f"{self.name}:{rows} seeds"
        where = self.root if self.unit else self.rows[0].seeds_dir.path
        lines = [
            f"{head} {','.join(map(str, seeds))} = {self.total} run(s): {self.count(FINISHED)} "
            f"finished (skipped), {self.count(RESUME)} to resume, {self.count(NEW, RESTART)} to "
            f"train; under {where}",
        ]
        refused = [why for row in self.rows for why in row.refused]
        if refused:
            lines.append(f"{len(refused)} seed folder(s) the run would refuse:")
            lines += [f"  {why}" for why in refused]
        if self.unit == "recipe":  # what a one-recipe dry run says of its recipe, for each
            lines += self._setting_lines()
        lines += self._cache_lines()
        lines += disk_lines(self)
        lines.append(time_estimate(self))
        return "\n".join(lines)

    def _setting_lines(self) -> list[str]:
        """Each recipe's departures from its own setting and its pooling note (a student that
        ships its own pooling trained with the recipe's)."""
        lines = []
        for row in self.rows:
            note = departure_note(departures(row.recipe, row.spec))
            hint = pooling_hint(row.recipe, row.spec)
            lines += [f"  {row.label}: {text}" for text in (note, hint) if text]
        if not lines:
            return ["settings: every recipe's own (no overrides)"]
        return ["settings:", *lines]

    def _cache_lines(self) -> list[str]:
        missing = [(row.label, n) for row in self.rows for n in row.missing]
        if not missing:
            return [f"cache under {self.rows[0].spec.cache_root}: every set is there"]
        lines = [f"cache: {len({n.path for _, n in missing})} set(s) missing (UPPERCASE = yours):"]
        for row in self.rows:
            if row.missing:
                lines.append(f"  {row.label}: {', '.join(n.what for n in row.missing)}")
        commands = dict.fromkeys(n.command for _, n in missing)
        return lines + ["  run first:", *(f"    {c}" for c in commands)]

    # ---- running it

    def run(self, after_row: AfterRow | None = None) -> list[SeedRuns]:
        """Train every run still to train, row by row (every row's cache and method checked
        before the first trains); ``after_row`` is told after each row. A stop signal ends the
        current run with last/ saved and the plan with it: the same command continues."""
        for row in self.rows:
            row.recipe.check_cache(row.spec.cache_root, set(row.spec.overrides))
            if row.seeds:
                check_method(row.seeds[0][0], row.label)
        progress = Progress(self)
        out = []
        try:
            for i, row in enumerate(self.rows, start=1):
                seeds = ",".join(str(cfg.seed) for cfg, _ in row.seeds)
                logger.info(f"{self.kind} row {i} of {len(self.rows)}: {row.label} (seeds {seeds})")
                runs = run_seeds(row.recipe, row.spec, row.seeds_dir.path, row.label, progress)
                if after_row is not None:
                    after_row(row, runs)
                out.append(runs)
        except KeyboardInterrupt:
            logger.warning(
                f"{self.name} stopped with {progress.done - 1} of {self.total} runs done; rerun "
                "the same command to continue"
            )
            raise
        return out


class Progress:
    """One line for the plan before each run: runs done, this one, runs left."""

    def __init__(self, plan: RunPlan) -> None:
        self.name, self.total, self.done = plan.name, plan.total, 0

    def __call__(self, label: str, seed: int, state: str) -> None:
        if state == FINISHED:
            self.done += 1
            return
        left = self.total - self.done - 1
        logger.info(
            f"{self.name}: {self.done} of {self.total} runs done, running {label} seed {seed}, "
            f"{left} left"
        )
        self.done += 1  # told before it starts: done once the next one is told


# ---- disk and time, before it starts ---------------------------------------------------------


def disk_lines(plan: RunPlan) -> list[str]:
    """What the checkpoints of the runs still to train will take (best/ + last/ each; last/
    only while a run is unfinished with ``keep_last`` false)."""
    total, unknown = 0, []
    for row in plan.rows:
        todo = [cfg for cfg, state in row.seeds if state != FINISHED]
        if not todo:
            continue
        estimate = checkpoint_estimate(todo[0].model)
        if estimate is None:
            unknown.append(row.label)
            continue
        kept = estimate["best"] + (estimate["last"] if todo[0].keep_last_checkpoint else 0)
        total += kept * len(todo)
    if not total and not unknown:
        return ["disk: nothing more (every run has finished)"]
    where = f" (not counted: {', '.join(unknown)}: its student's weights are not on disk)"
    return [
        f"disk: about {format_bytes(total)} of checkpoints for the runs still to train "
        f"(each keeps best/ and, unless --set keep_last_checkpoint=false, last/)"
        + (where if unknown else "")
    ]


def time_estimate(plan: RunPlan) -> str:
    """From a step time measured on a GPU by a run of the same method and student in this
    plan (its ``metrics.jsonl``), the time the runs still to train need: an estimate."""
    measured: dict[tuple[str, str], float] = {}
    totals: dict[str, int] = {}
    for row in plan.rows:
        for cfg, _ in row.seeds:
            rate, total = measured_rate(RunDir(cfg.output_dir))
            if rate:
                measured.setdefault((cfg.method, cfg.model), rate)
            if total:
                totals.setdefault(row.label, total)
    seconds, covered, todo = 0.0, 0, 0
    for row in plan.rows:
        for cfg, state in row.seeds:
            if state == FINISHED:
                continue
            todo += 1
            rate, total = measured.get((cfg.method, cfg.model)), totals.get(row.label)
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
