"""``mmcse compare RUN...``: STS (+ transfer, + retrieval when recorded) of runs in one table.

Each argument is a run or a folder of seed runs (:mod:`mmcse.reports.runs`; a folder mixing
settings is one row per setting); its row is the mean ± sample std over the seeds that recorded
a number. Each protocol has its own columns (STS test and dev, transfer test and fasttest, a
pooler other than the run's, an average over fewer tasks), named in the header and explained in
the legend under the table, and the best mark compares within one column only; a column whose
numbers were measured on different data (or retrieval folders, or heads) is not marked at all.
A group that ``recipes run`` wrote is followed by the recipe's published rows (STS test; the
papers' rows from :mod:`mmcse.recipes.published`); one that overrode the recipe is marked. Under
the table: the legend, what the marked rows changed, and where the runs' environments differ
(:func:`mmcse.environment.differences`; nothing when they match).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mmcse.environment import differences
from mmcse.errors import MmcseError
from mmcse.recipes.published import PUBLISHED
from mmcse.recipes.summary import Row, departure_note, published_row
from mmcse.reports.runs import Column, Group, Protocol, column, find_groups
from mmcse.reports.tables import ALL_TITLES, render, summarize_columns
from mmcse.rundir import RESULT_FILES

EXTRA = ("source",)
OVERRIDDEN = " [overridden]"
BEST = (
    "Bold: the best measured mean of a column (published rows do not compete); columns of "
    "different protocols are never compared."
)


@dataclass
class Comparison:
    """The rows, their columns, which rows compete for best, and what goes under the table."""

    rows: list[Row]
    columns: list[str]
    measured: list[int]
    unranked: set[str]
    notes: list[str]

    def render(self, fmt: str = "md") -> str:
        return render(self.rows, self.columns, fmt, EXTRA, self.measured, self.unranked, self.notes)


def comparison(arguments) -> Comparison:
    """Every group's row (and its recipe's published rows), the columns present, the notes."""
    rows, measured, notes = [], [], []
    present: dict[str, Column] = {}
    signatures: dict[str, dict[str, list[str]]] = {}  # column -> signature -> run labels
    environments: dict[str, dict | None] = {}
    for group in find_groups(arguments):
        scores = []
        for run in group.runs:
            label = group.label if len(group.runs) == 1 else f"{group.label}/{run.label}"
            environments[label] = run.environment()
            cells = run.cells()
            for col, cell in cells.items():
                present[col.key] = col
                signatures.setdefault(col.key, {}).setdefault(cell.signature, []).append(label)
            if cells:
                scores.append({col.key: cell.value for col, cell in cells.items()})
        measured.append(len(rows))
        row = summarize_columns(group.label, scores, [c for c in present])
        marked = row.label + (OVERRIDDEN if group.overrides else "")
        seeds = f"{len(scores)} of {len(group.runs)} runs scored"
        rows.append(Row(marked, row.mean, row.std, row.n, {"source": seeds}, counts=row.counts))
        if group.recipe:
            for published in PUBLISHED.get(group.recipe, ()):
                rows.append(published_row(published))
                for key in published.mean:
                    present.setdefault(key, column(Protocol("sts", "test"), key))
        notes += _group_notes(group, marked)
    if not any(rows[i].mean for i in measured):
        raise MmcseError(
            f"none of these runs has results ({' / '.join(RESULT_FILES.values())}); "
            "train with final evaluation or run mmcse eval --model RUN first"
        )
    ordered = sorted(present.values(), key=Column.order)
    columns = [c.key for c in ordered if any(c.key in r.mean for r in rows)]
    unranked = {key for key in columns if len(_known(signatures.get(key, {}))) > 1}
    notes = [
        _legend(ordered, columns), *dict.fromkeys(notes), *_protocol_notes(unranked, signatures),
        *_environment_notes(environments),
    ]  # fmt: skip
    return Comparison(rows, columns, measured, unranked, [n for n in notes if n])


def _legend(ordered: list[Column], columns: list[str]) -> str:
    """A line per protocol shown (which columns, measured how), and what the marks mean."""
    shown = [c for c in ordered if c.key in columns]
    lines = []
    for protocol in dict.fromkeys(c.protocol for c in shown):
        keys = [c.key for c in shown if c.protocol == protocol]
        first, last = (ALL_TITLES.get(k, k) for k in (keys[0], keys[-1]))
        name = f"[{protocol.tag}]" if protocol.tag else f"{first} … {last}"
        lines.append(f"- {name}: {protocol.describe()}")
    subsets = [c for c in columns if "Avg. (" in c]
    if subsets:
        lines.append(
            f"- {', '.join(subsets)}: the average over the tasks named only, not comparable "
            "with an average over all of them."
        )
    lines.append(f"- {BEST} A cell marked (k of n) summarises k of its row's n runs.")
    return "\n".join(["Columns:", *lines])


def _group_notes(group: Group, marked: str) -> list[str]:
    notes = []
    if group.split_from:
        notes.append(
            f"{group.split_from}: each setting is its own row (seeds of one setting are "
            "averaged, never runs of different ones)."
        )
    if group.overrides:
        notes.append(f"{marked}: {departure_note(group.overrides)}")
    return notes


def _known(signatures: dict[str, list[str]]) -> list[str]:
    return [s for s in signatures if s != "{}"]


def _protocol_notes(unranked: set[str], signatures: dict[str, dict[str, list[str]]]) -> list[str]:
    """Columns whose numbers were measured on different data (or retrieval inputs)."""
    notes = []
    for key in sorted(unranked):
        parts = [
            f"{_settings(s)} ({', '.join(labels)})"
            for s, labels in signatures[key].items()
            if s != "{}"
        ]
        notes.append(f"{key}: not comparable, measured with different settings: "
                     f"{' vs '.join(parts)}; no best marked.")  # fmt: skip
    return notes


def _settings(signature: str) -> str:
    data = json.loads(signature)
    if isinstance(data, list):  # an average over tasks measured with different settings
        return " + ".join(_settings(s) for s in data)
    return ", ".join(f"{k} {v}" for k, v in data.items())


def _environment_notes(environments: dict[str, dict | None]) -> list[str]:
    """Where the runs' training environments differ (nothing when they match)."""
    found = differences(environments)
    missing = [label for label, env in environments.items() if not env]
    notes = ["Environments differ: " + "; ".join(found) + "."] if found else []
    if missing and len(missing) < len(environments):
        notes.append(
            f"No environment recorded for {', '.join(missing)} (trained before mmcse recorded "
            "it): their differences are unknown."
        )
    return notes


def compare_table(arguments, fmt: str = "md") -> str:
    return comparison(arguments).render(fmt)


def compare_report(arguments, fmt: str = "md", out: str | Path | None = None) -> Iterator[str]:
    """``mmcse compare``: the table, then (``out``) the file it was also written to."""
    table = compare_table(arguments, fmt)
    yield table
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(table + "\n")
        yield f"wrote {out}"
