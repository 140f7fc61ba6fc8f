"""What a recipe's runs come to, as rows of numbers: mean ± std over seeds, published rows,
differences (rendering them is the reports': :mod:`mmcse.reports.compare`).

A :class:`Row` is one line of a table — a summary of seeds (:func:`summarize`), a published row
(:func:`published_row`) or a difference (:func:`delta`). The standard deviation is the sample one
(``ddof=1``), the usual reading of "mean ± std over 5 seeds"; with one seed there is none. A row
keeps its per-seed values so a table can test a difference (:func:`welch_p`) before it calls one
row better than another.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmcse.recipes.published import COLUMNS, Published


@dataclass(frozen=True)
class Row:
    label: str
    mean: dict[str, float]
    std: dict[str, float] = field(default_factory=dict)
    n: int | None = None  # runs summarised (None: not a summary of runs)
    extra: dict[str, str] = field(default_factory=dict)  # extra column → cell text
    signed: bool = False  # a difference: cells print their sign
    counts: dict[str, int] = field(default_factory=dict)  # runs behind a cell, when fewer than n
    values: dict[str, tuple[float, ...]] = field(default_factory=dict)  # per-seed, for a test

    def to_dict(self) -> dict:
        counts = {"counts": self.counts} if self.counts else {}
        return {
            "label": self.label,
            "mean": self.mean,
            "std": self.std,
            "n": self.n,
            **counts,
            **self.extra,
        }


def scores_of(result: dict) -> dict[str, float]:
    """The numbers of an :func:`~mmcse.evaluation.sts.evaluate_sts` result (no ``details``)."""
    return {column: float(result[column]) for column in COLUMNS if column in result}


def summarize(label: str, results: Sequence[dict]) -> Row:
    """Mean and sample std per column over runs (columns every run has)."""
    scores = [scores_of(r) for r in results]
    if not scores:
        return Row(label, {}, {}, 0)
    columns = [c for c in COLUMNS if all(c in s for s in scores)]
    values = {c: np.array([s[c] for s in scores], dtype=np.float64) for c in columns}
    mean = {c: float(v.mean()) for c, v in values.items()}
    std = {c: float(v.std(ddof=1)) for c, v in values.items()} if len(scores) > 1 else {}
    seeds = {c: tuple(map(float, v)) for c, v in values.items()}
    return Row(label, mean, std, len(scores), values=seeds)


def welch_p(row: Sequence[float], other: Sequence[float]) -> float | None:
    """Two-sided Welch t-test p-value; None with fewer than two runs on a side or no variance."""
    from scipy import stats  # scipy loads only when a table tests a difference

    if len(row) < 2 or len(other) < 2 or (len(set(row)) == 1 and len(set(other)) == 1):
        return None
    p = float(stats.ttest_ind(list(row), list(other), equal_var=False).pvalue)
    return None if math.isnan(p) else p


def published_row(published: Published, label: str | None = None) -> Row:
    name = label or f"published: {published.label}"
    return Row(name, published.mean, published.std, published.seeds, {"source": published.source})


def delta(label: str, ours: Row, reference: Row) -> Row:
    """``ours − reference`` on the columns both have."""
    shared = [c for c in COLUMNS if c in ours.mean and c in reference.mean]
    return Row(label, {c: ours.mean[c] - reference.mean[c] for c in shared}, signed=True)


def departure_note(changes: dict[str, dict[str, Any]]) -> str:
    """One line for under a table saying how a run left its recipe (``{setting: {"recipe",
    "run"}}``, :func:`mmcse.recipes.runs.departures`); empty when it did not."""
    if not changes:
        return ""
    items = [
        f"{key}={_value(c['run'])} (recipe: {_value(c['recipe'])})" for key, c in changes.items()
    ]
    return "Not the published setting; this run overrides the recipe: " + "; ".join(items) + "."


def _value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)
