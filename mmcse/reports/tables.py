"""One results table in three formats (markdown, CSV, LaTeX), best cells marked.

Rows are :class:`mmcse.recipes.summary.Row` (mean, sample std over seeds, ``n``, extra text
columns). The best mean of each column among *measured* rows (not published rows, not
differences) is marked -- bold in markdown and LaTeX, listed in CSV's ``best`` column -- only
when the difference is supported: among the rows with at least two seeds in the column, the best
beats each other one in a two-sided Welch t-test (:func:`mmcse.recipes.summary.welch_p`,
p < :data:`ALPHA`), and no row of one seed scores as high. One seed is never compared (noise
would read as a finding); :data:`BEST_RULE` says so. A mark never stands without its evidence:
beside it, the seeds on each side and the test's p (:class:`Evidence`), and with fewer than
:data:`FEW_SEEDS` seeds a side the plain words "low power" (Welch's test then rests on two-point
variance estimates and about one degree of freedom). A column whose numbers are not comparable
(``unranked``) marks none. A column compares one protocol only
(the callers give each protocol its own columns), so a mark never crosses protocols. A cell that
summarises fewer runs than its row says so (``(1 of 2)``). Notes (a legend, what a run changed,
where environments differ) follow the table in markdown and are ``%`` comments in LaTeX. Every
metric here is higher-is-better (Spearman, accuracy, recall). ``mmcse compare``, ``recipes run``
and ``ablate`` all write through :func:`render` / :func:`write_tables`, and every Welch test
they show — a best mark's evidence, a table's or an ablation's p column — through
:func:`welch_text`.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mmcse.errors import MmcseError
from mmcse.evaluation.transfer import TRANSFER_TITLES
from mmcse.recipes.summary import Row, welch_p
from mmcse.reports.compare import TITLES

if TYPE_CHECKING:  # the runner loads training's settings; a table needs only the test's numbers
    from mmcse.recipes.runner import WelchTest

FORMATS = {"md": ".md", "csv": ".csv", "latex": ".tex"}
ALL_TITLES = {**TITLES, **TRANSFER_TITLES, "transfer avg": "Transfer Avg."}
#: the significance level a best mark needs against every other measured row
ALPHA = 0.05
MIN_SEEDS = 2
#: below this many seeds a side the test has little power, and the mark says so
FEW_SEEDS = 3
BEST_RULE = (
    f"Bold: the best mean of a column among the rows of at least {MIN_SEEDS} seeds, only where "
    f"it beats each of them in a two-sided Welch t-test (p < {ALPHA}) and no row of 1 seed "
    "scores as high; a row of 1 seed is not compared (its differences may be noise), and "
    "published rows do not compete. Beside a mark: (n=a vs b, p=...): its row's seeds, the "
    "fewest seeds of a row it beat, and the largest p against them; 'low power': fewer than "
    f"{FEW_SEEDS} seeds a side, where Welch's test has about one degree of freedom and its "
    "variances rest on two numbers, so read the mark as tentative."
)


@dataclass(frozen=True)
class Evidence:
    """What a best mark rests on: its row's seeds, the fewest seeds of a row it beat, and the
    largest Welch p against those rows."""

    n: int
    others: int
    p: float

    def text(self) -> str:
        return welch_text(self.n, self.others, self.p)


def welch_text(n: int, others: int, p: float | None) -> str:
    """The one way a Welch test is written, beside a best mark and in a table's p column:
    ``n=3 vs 2, p=0.012`` (the row's seeds, the other side's, the two-sided p; ``p<0.001``),
    ``, low power`` under :data:`FEW_SEEDS` seeds a side; without a p, why there is none."""
    seeds = f"n={n} vs {others}"
    if min(n, others) < MIN_SEEDS:
        return f"{seeds}, no test (needs {MIN_SEEDS} seeds a side)"
    if p is None:
        return f"{seeds}, no test (no variance)"
    text = "p<0.001" if p < 0.001 else f"p={p:.3f}"
    return f"{seeds}, {text}" + (", low power" if min(n, others) < FEW_SEEDS else "")


def with_tests(
    rows: Sequence[Row], tests: Mapping[int, WelchTest], column: str, named: bool = False
) -> list[Row]:
    """``rows`` with each tested row's ``column`` written by :func:`welch_text` (``named``:
    after the row it was tested against, ``vs NAME: ...``)."""
    out = list(rows)
    for index, test in tests.items():
        text = welch_text(test.n, test.others, test.p)
        text = f"vs {test.against}: {text}" if named else text
        row = out[index]
        out[index] = replace(row, extra={**row.extra, column: text})
    return out


def summarize_columns(label: str, scores: Sequence[dict[str, float]], columns) -> Row:
    """Mean and sample std (ddof 1) per column, over the runs that have the column."""
    mean, std, counts, seeds = {}, {}, {}, {}
    for column in columns:
        values = np.array([s[column] for s in scores if column in s], dtype=np.float64)
        if values.size:
            mean[column] = float(values.mean())
            seeds[column] = tuple(map(float, values))
            if values.size > 1:
                std[column] = float(values.std(ddof=1))
            if values.size < len(scores):
                counts[column] = int(values.size)
    return Row(label, mean, std, len(scores), counts=counts, values=seeds)


def best_evidence(
    rows: Sequence[Row], columns: Sequence[str], measured, unranked: Collection[str] = ()
) -> dict[tuple[int, str], Evidence]:
    """Each column's best cell, ``(row index, column)``, with the :class:`Evidence` its mark
    rests on: the highest mean among ``measured`` row indices where the difference to every other
    measured row is supported (:func:`supported`; none in an ``unranked`` column)."""
    out = {}
    for column in columns:
        if column in unranked:
            continue
        candidates = [i for i in measured if column in rows[i].mean]
        compared = [i for i in candidates if len(rows[i].values.get(column, ())) >= MIN_SEEDS]
        if len(compared) < 2:
            continue
        top = max(compared, key=lambda i: rows[i].mean[column])
        best = rows[top].mean[column]
        if any(rows[i].mean[column] >= best for i in candidates if i not in compared):
            continue  # a row of one seed scores as high: no row can be called the best
        others = [i for i in compared if i != top]
        if all(supported(rows[top], rows[i], column) for i in others):
            values = rows[top].values[column]
            p = max(welch_p(values, rows[i].values[column]) for i in others)
            fewest = min(len(rows[i].values[column]) for i in others)
            out[(top, column)] = Evidence(len(values), fewest, p)
    return out


def supported(best: Row, other: Row, column: str) -> bool:
    """``best`` is higher than ``other`` in ``column`` beyond seed noise: both have
    :data:`MIN_SEEDS` values there and Welch's test gives p < :data:`ALPHA`."""
    a, b = best.values.get(column, ()), other.values.get(column, ())
    if min(len(a), len(b)) < MIN_SEEDS or best.mean[column] <= other.mean[column]:
        return False
    p = welch_p(a, b)
    return p is not None and p < ALPHA


def single_seed(row: Row) -> bool:
    """A measured row of one run: :func:`best_evidence` never compares it."""
    return row.n is not None and row.n < MIN_SEEDS


def _cell(row: Row, column: str, fmt: str) -> str:
    if column not in row.mean:
        return "" if fmt == "csv" else "–"
    value = row.mean[column]
    text = f"{value:+.2f}" if row.signed else f"{value:.2f}"
    if column in row.std:
        text += r" $\pm$ " if fmt == "latex" else " ± "
        text += f"{row.std[column]:.2f}"
    if column in row.counts and fmt != "csv":
        text += f" ({row.counts[column]} of {row.n})"
    return text


def _label(row: Row, measured: bool) -> str:
    if row.n is None or row.n == 0:
        return row.label
    if measured and single_seed(row):
        return f"{row.label} (1 seed: not compared)"
    return f"{row.label} (n={row.n})" if row.n > 1 else row.label


def _latex_escape(text: str) -> str:
    for char in ("\\", "&", "%", "_", "#", "$"):
        text = text.replace(char, "\\" + char)
    return text


def render(
    rows: Sequence[Row],
    columns: Sequence[str],
    fmt: str = "md",
    extra_columns: Sequence[str] = (),
    measured: Sequence[int] | None = None,
    unranked: Collection[str] = (),
    notes: Sequence[str] = (),
) -> str:
    """The table as ``md``, ``csv`` or ``latex`` text; ``measured`` rows compete for best in
    every column but the ``unranked`` ones; ``notes`` follow (md, latex)."""
    if fmt not in FORMATS:
        raise MmcseError(f"unknown table format {fmt!r}; choose md, csv or latex")
    measured = range(len(rows)) if measured is None else measured
    best = best_evidence(rows, columns, measured, unranked)
    titles = [ALL_TITLES.get(c, c) for c in columns]
    if fmt == "csv":
        return _csv(rows, columns, extra_columns, best)
    lines = []
    for index, row in enumerate(rows):
        cells = []
        for column in columns:
            text = _cell(row, column, fmt)
            if (index, column) in best:
                text = f"**{text}**" if fmt == "md" else f"\\textbf{{{text}}}"
                text += f" ({best[index, column].text()})"
            cells.append(text)
        label = _label(row, index in measured)
        extras = [row.extra.get(c, "") for c in extra_columns]
        if fmt == "latex":
            label, extras = _latex_escape(label), [_latex_escape(e) for e in extras]
        lines.append([label, *cells, *extras])
    header = ["", *titles, *extra_columns]
    if fmt == "md":
        rule = ["---", *("---:" for _ in columns), *("---" for _ in extra_columns)]
        table = "\n".join("| " + " | ".join(c) + " |" for c in [header, rule, *lines])
        return "\n\n".join([table, *notes])
    spec = "l" + "r" * len(columns) + "l" * len(extra_columns)
    body = [" & ".join(_latex_escape(h) for h in header) + r" \\", r"\midrule"]
    body += [" & ".join(cells) + r" \\" for cells in lines]
    comments = [f"% {line}" for note in notes for line in note.splitlines()]
    return "\n".join(
        [
            rf"\begin{{tabular}}{{{spec}}}",
            r"\toprule",
            *body,
            r"\bottomrule",
            r"\end{tabular}",
            *comments,
        ]
    )


def _csv(rows, columns, extra_columns, best) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    header = ["label", "n"]
    for column in columns:
        header += [f"{column} mean", f"{column} std"]
    writer.writerow([*header, *extra_columns, "best", "best evidence"])
    for index, row in enumerate(rows):
        cells = [row.label, "" if row.n is None else row.n]
        for column in columns:
            mean, std = row.mean.get(column), row.std.get(column)
            cells += ["" if mean is None else f"{mean:.4f}", "" if std is None else f"{std:.4f}"]
        marked = [c for c in columns if (index, c) in best]
        evidence = ";".join(f"{c}: {best[index, c].text()}" for c in marked)
        extras = [row.extra.get(c, "") for c in extra_columns]
        writer.writerow([*cells, *extras, ";".join(marked), evidence])
    return buffer.getvalue()


def write_tables(
    rows: Sequence[Row],
    columns: Sequence[str],
    stem: str | Path,
    extra_columns: Sequence[str] = (),
    measured: Sequence[int] | None = None,
    formats: Sequence[str] = tuple(FORMATS),
    notes: Sequence[str] = (),
) -> list[Path]:
    """``<stem>.md``, ``<stem>.csv`` and ``<stem>.tex`` of the same table (those in ``formats``);
    ``notes`` under the markdown and LaTeX ones."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = stem.with_suffix(FORMATS[fmt])
        text = render(rows, columns, fmt, extra_columns, measured, notes=notes)
        path.write_text(text + "\n")
        paths.append(path)
    return paths
