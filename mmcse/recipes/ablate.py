"""Loss ablations like DALR's Table 3: rerun a recipe with some term weights at zero.

``mmcse ablate --recipe R --drop a,b+c`` trains the full recipe and one row per comma-separated
item — ``w/o a``, ``w/o b & c`` — off the *same* cache and seeds, through the one rows × seeds
runner (:mod:`mmcse.recipes.runner`: finished seeds skipped, stopped ones resumed, disk and time
said before it starts), then reports each row's STS numbers as mean ± std over seeds and a Welch
t-test (unequal variances, ``scipy.stats.ttest_ind(equal_var=False)``) of its per-seed averages
against the full method's (:func:`~mmcse.recipes.runner.welch`).

A term name ``t`` sets the method's field ``t_weight`` to zero, or the field named exactly ``t``;
anything else is refused with the method's weight fields listed. Zero-weight terms are not even
computed (:meth:`mmcse.methods.base.Method.active_terms`), so a row is the reduced method, not the
full one with a muted gradient. Where the paper printed the same ablation
(:data:`mmcse.recipes.published.PUBLISHED_ABLATIONS`), its avg ± std is shown beside each row.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mmcse.errors import MmcseError
from mmcse.methods import Method, build_method
from mmcse.recipes.layout import AblationDir, SeedsDir
from mmcse.recipes.published import PUBLISHED_ABLATIONS
from mmcse.recipes.recipe import Recipe, RecipeRunSpec
from mmcse.recipes.runner import RunPlan, WelchTest, plan_row, welch
from mmcse.recipes.runs import (
    SeedRuns,
    departure_note,
    departures,
    environment_notes,
    environment_record,
)
from mmcse.recipes.summary import Row
from mmcse.recipes.summary import welch_p as welch_p  # the test ablation rows rest on

#: the extra columns of an ablation's rows
P_COLUMN, PUBLISHED_COLUMN = "p (Welch vs full)", "published avg"


def parse_drops(text: str) -> list[tuple[str, ...]]:
    """``"a,b+c"`` → ``[("a",), ("b", "c")]``: one ablation row per comma-separated item."""
    rows = [tuple(t.strip() for t in item.split("+") if t.strip()) for item in text.split(",")]
    if not rows or any(not terms for terms in rows):
        raise MmcseError(f"--drop expects term[,term+term...], got {text!r}")
    return rows


def resolve_term(method: Method, term: str) -> str:
    """The weight field ``--drop term`` zeroes: ``term_weight``, else ``term`` itself."""
    fields = method.weight_fields()
    for candidate in (f"{term}_weight", term):
        if candidate in fields:
            return candidate
    raise MmcseError(
        f"method {method.name!r} has no loss term {term!r}; its weight fields: {', '.join(fields)} "
        "(drop a term by its name without _weight, e.g. "
        f"--drop {fields[-1].removesuffix('_weight')})"
    )


def spec_of(terms: tuple[str, ...]) -> str:
    return "+".join(terms)


def row_dir(terms: tuple[str, ...]) -> str:
    return "full" if not terms else "wo-" + spec_of(terms)


def label_of(terms: tuple[str, ...]) -> str:
    return "w/o " + " & ".join(terms) if terms else "full"


@dataclass
class AblationRow:
    terms: tuple[str, ...]
    fields: tuple[str, ...]
    runs: SeedRuns
    test: WelchTest | None = None  # against the full method (None: the full method itself)

    @property
    def avgs(self) -> list[float]:
        return [r["avg"] for r in self.runs.results if r is not None and "avg" in r]

    @property
    def p_value(self) -> float | None:
        return self.test.p if self.test else None


@dataclass
class Ablation:
    recipe: Recipe
    seeds: tuple[int, ...]
    rows: list[AblationRow]  # the full method first
    overrides: dict[str, Any] = field(default_factory=dict)  # departures from the recipe

    def notes(self) -> list[str]:
        """Why p-values are missing, how the run differs from the recipe (if it does), and which
        environment made it."""
        missing = {missing_p_reason(r.test) for r in self.rows[1:] if r.test and r.test.p is None}
        note = departure_note(self.overrides)
        runs = [r.runs for r in self.rows]
        return sorted(missing) + ([note] if note else []) + environment_notes(runs)

    def tests(self) -> dict[int, WelchTest]:
        """Row index → its test against the full method (the report writes the p column)."""
        return {i: row.test for i, row in enumerate(self.rows) if row.test}

    def table_rows(self) -> list[Row]:
        """Each row's mean ± std over seeds and, where the paper printed it, its published avg."""
        published = PUBLISHED_ABLATIONS.get(self.recipe.name, {})
        by_terms = {frozenset(spec.split("+")) - {""}: rows for spec, rows in published.items()}
        out = []
        for row in self.rows:
            extra = {P_COLUMN: ""}  # the report writes each test (the full row has none)
            paper = by_terms.get(frozenset(row.terms))
            if paper:
                first = paper[0]
                std = f" ± {first.std['avg']:.2f}" if "avg" in first.std else ""
                extra[PUBLISHED_COLUMN] = f"{first.mean['avg']:.2f}{std} ({first.source})"
            out.append(replace(row.runs.summary(), extra=extra))
        return out

    def to_dict(self, table: list[Row] | None = None) -> dict[str, Any]:
        """The record; ``table``: the rows as the report wrote them (default
        :meth:`table_rows`)."""
        table = self.table_rows() if table is None else table
        return {
            "recipe": self.recipe.name,
            "method": self.recipe.method,
            "seeds": list(self.seeds),
            "test": "Welch two-sided t-test of per-seed STS avg vs the full method",
            "overrides": self.overrides,  # {} = the recipe's own setting
            "notes": self.notes(),
            **environment_record([r.runs for r in self.rows]),
            "rows": [
                {
                    "drop": list(row.terms),
                    "zeroed_fields": list(row.fields),
                    "p_value": row.p_value,
                    **row.runs.to_dict(),
                    "table": table_row.to_dict(),
                }
                for row, table_row in zip(self.rows, table, strict=True)
            ],
        }


def missing_p_reason(test: WelchTest) -> str:
    """Why an ablation row has no p-value."""
    if min(test.n, test.others) < 2:
        return (
            f"no test: Welch's t-test needs at least 2 seeds with STS results on each side "
            f"(this row {test.n}, full {test.others}); pass more --seeds"
        )
    return "no test: every seed gave the same avg on both sides (no variance to test)"


def ablate(
    recipe: Recipe, drops: list[tuple[str, ...]], spec: RecipeRunSpec, output_dir: str | Path
) -> Ablation:
    """Train the full recipe and every ``w/o`` row over the spec's seeds (every row checked,
    and its folders, before one trains); p-values against the full."""
    spec = spec.for_recipe(recipe)
    layout = ablation_layout(recipe, drops, output_dir, spec.overrides)
    runs = plan_ablation(recipe, layout, spec, output_dir).run()
    rows = [AblationRow(t, f, r) for (t, f, _, _), r in zip(layout, runs, strict=True)]
    full = rows[0].avgs
    for row in rows[1:]:
        row.test = welch("full", row.avgs, full)
    return Ablation(recipe, tuple(spec.seeds), rows, departures(recipe, spec))


#: an ablation's rows: (terms, zeroed fields, row folder, row overrides), the full method first
Layout = list[tuple[tuple[str, ...], tuple[str, ...], Path, dict[str, Any]]]


def plan_ablation(
    recipe: Recipe,
    layout: Layout,
    spec: RecipeRunSpec,
    output_dir: str | Path,
    dry_run: bool = False,
) -> RunPlan:
    """The rows × seeds of an ablation (:mod:`mmcse.recipes.runner`): a folder that cannot be
    its seed's run is refused here (a dry run lists it)."""
    rows = [
        plan_row(label_of(terms), recipe, spec.with_overrides(overrides), SeedsDir(path), dry_run)
        for terms, _, path, overrides in layout
    ]
    return RunPlan("ablation", recipe.name, Path(output_dir), rows, unit="row")


def ablation_layout(
    recipe: Recipe,
    drops: list[tuple[str, ...]],
    output_dir: str | Path,
    overrides: dict[str, Any] | None = None,
) -> Layout:
    """``(terms, zeroed fields, row dir, row overrides)`` per row, the full method first."""
    method = build_method(recipe.method, **recipe.method_args)
    plan = [((), ())] + [(terms, tuple(resolve_term(method, t) for t in terms)) for terms in drops]
    base = dict(overrides or {})
    out = AblationDir(output_dir)
    rows = []
    for terms, fields in plan:
        zeroed = {f: 0.0 for f in fields}
        row_overrides = {**base, "method_args": {**base.get("method_args", {}), **zeroed}}
        rows.append((terms, fields, out.row(row_dir(terms)).path, row_overrides))
    return rows
