"""Loss ablations like DALR's Table 3: rerun a recipe with some term weights at zero.

``mmcse ablate --recipe R --drop a,b+c`` trains the full recipe and one row per comma-separated
item — ``w/o a``, ``w/o b & c`` — off the *same* cache and seeds, then reports each row's STS
numbers as mean ± std over seeds and a Welch t-test (unequal variances,
``scipy.stats.ttest_ind(equal_var=False)``) of its per-seed averages against the full method's.

A term name ``t`` sets the method's field ``t_weight`` to zero, or the field named exactly ``t``;
anything else is refused with the method's weight fields listed. Zero-weight terms are not even
computed (:meth:`mmcse.methods.base.Method.active_terms`), so a row is the reduced method, not the
full one with a muted gradient. Where the paper printed the same ablation
(:data:`mmcse.recipes.published.PUBLISHED_ABLATIONS`), its avg ± std is shown beside each row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmcse.errors import MmcseError
from mmcse.methods import Method, build_method
from mmcse.recipes.layout import AblationDir
from mmcse.recipes.published import PUBLISHED_ABLATIONS
from mmcse.recipes.recipe import Recipe, RecipeRunSpec
from mmcse.recipes.runs import (
    SeedRuns,
    check_method,
    departure_note,
    departures,
    environment_notes,
    environment_record,
    missing_p_reason,
    run_seeds,
    seed_plan,
)
from mmcse.recipes.summary import Row, welch_p

#: the extra columns of an ablation's rows
P_COLUMN, PUBLISHED_COLUMN = "p (Welch vs full)", "published avg"

logger = logging.getLogger(__name__)


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
    p_value: float | None = None

    @property
    def avgs(self) -> list[float]:
        return [r["avg"] for r in self.runs.results if r is not None and "avg" in r]


@dataclass
class Ablation:
    recipe: Recipe
    seeds: tuple[int, ...]
    rows: list[AblationRow]  # the full method first
    overrides: dict[str, Any] = field(default_factory=dict)  # departures from the recipe

    def notes(self) -> list[str]:
        """Why p-values are missing, how the run differs from the recipe (if it does), and which
        environment made it."""

        full = self.rows[0].avgs
        out = sorted({missing_p_reason(r.avgs, full) for r in self.rows[1:] if r.p_value is None})
        note = departure_note(self.overrides)
        return out + ([note] if note else []) + environment_notes([r.runs for r in self.rows])

    def table_rows(self) -> list[Row]:
        published = PUBLISHED_ABLATIONS.get(self.recipe.name, {})
        by_terms = {frozenset(spec.split("+")) - {""}: rows for spec, rows in published.items()}
        out = []
        for row in self.rows:
            summary = row.runs.summary()
            extra = {P_COLUMN: _p_text(row.p_value) if row.terms else ""}
            paper = by_terms.get(frozenset(row.terms))
            if paper:
                first = paper[0]
                std = f" ± {first.std['avg']:.2f}" if "avg" in first.std else ""
                extra[PUBLISHED_COLUMN] = f"{first.mean['avg']:.2f}{std} ({first.source})"
            out.append(Row(summary.label, summary.mean, summary.std, summary.n, extra,
                           values=summary.values))  # fmt: skip
        return out

    def to_dict(self) -> dict[str, Any]:
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
                for row, table_row in zip(self.rows, self.table_rows(), strict=True)
            ],
        }


def _p_text(p: float | None) -> str:
    if p is None:
        return "–"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def ablate(
    recipe: Recipe, drops: list[tuple[str, ...]], spec: RecipeRunSpec, output_dir: str | Path
) -> Ablation:
    """Train the full recipe and every ``w/o`` row over the spec's seeds; p-values against the
    full."""
    spec = spec.for_recipe(recipe)
    changes = departures(recipe, spec)
    plan = ablation_plan(recipe, drops, output_dir, spec.overrides)
    for terms, _fields, row_out, row_overrides in plan:  # every row checked before one trains
        row = recipe.config(spec.with_overrides(row_overrides), seed=spec.seeds[0],
                            output_dir=row_out)  # fmt: skip
        check_method(row, label_of(terms))  # e.g. every term dropped, as the dry run says
        seed_plan(recipe, spec.with_overrides(row_overrides), row_out)  # used folders refused
    rows = []
    for i, (terms, fields, row_out, row_overrides) in enumerate(plan, start=1):
        logger.info(
            f"ablation row {i} of {len(plan)}: {label_of(terms)} "
            f"(seeds {','.join(map(str, spec.seeds))})"
        )
        runs = run_seeds(recipe, spec.with_overrides(row_overrides), row_out, label_of(terms))
        rows.append(AblationRow(terms, fields, runs))
    full = rows[0].avgs
    for row in rows[1:]:
        row.p_value = welch_p(row.avgs, full)
    return Ablation(recipe, tuple(spec.seeds), rows, changes)


def ablation_plan(
    recipe: Recipe,
    drops: list[tuple[str, ...]],
    output_dir: str | Path,
    overrides: dict[str, Any] | None = None,
) -> list[tuple[tuple[str, ...], tuple[str, ...], Path, dict[str, Any]]]:
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
