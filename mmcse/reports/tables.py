"""One results table in three formats (markdown, CSV, LaTeX), best cells marked.

Rows are :class:`mmcse.recipes.summary.Row` (mean, sample std over seeds, ``n``, extra text
columns). The best mean of each column among *measured* rows (not published rows, not
differences) is marked -- bold in markdown and LaTeX, listed in CSV's ``best`` column -- only
when the difference is supported: among the rows with at least two seeds in the column, the best
beats each other one in a two-sided Welch t-test (:func:`mmcse.recipes.summary.welch_p`,
p < :data:`ALPHA`), and no row of one seed scores as high. One seed is never compared (noise
would read as a finding); :data:`BEST_RULE` says so. A column whose numbers are not comparable
(``unranked``) marks none. A column compares one protocol only
(the callers give each protocol its own columns), so a mark never crosses protocols. A cell that
summarises fewer runs than its row says so (``(1 of 2)``). Notes (a legend, what a run changed,
where environments differ) follow the table in markdown and are ``%`` comments in LaTeX. Every
metric here is higher-is-better (Spearman, accuracy, recall). ``mmcse compare``, ``recipes run``
and ``ablate`` all write through :func:`render` / :func:`write_tables`.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np

from mmcse.errors import MmcseError
from mmcse.evaluation.transfer import TRANSFER_TITLES
from mmcse.recipes.summary import Row, welch_p
from mmcse.reports.compare import TITLES

FORMATS = {"md": ".md", "csv": ".csv", "latex": ".tex"}
ALL_TITLES = {**TITLES, **TRANSFER_TITLES, "transfer avg": "Transfer Avg."}
#: the significance level a best mark needs against every other measured row
ALPHA = 0.05
MIN_SEEDS = 2
BEST_RULE = (
    f"Bold: the best mean of a column among the rows of at least {MIN_SEEDS} seeds, only where "
    f"it beats each of them in a two-sided Welch t-test (p < {ALPHA}) and no row of 1 seed "
    "scores as high; a row of 1 seed is not compared (its differences may be noise), and "
    "published rows do not compete."
)


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


def present_columns(rows: Sequence[Row], order: Sequence[str]) -> list[str]:
    return [c for c in order if any(c in r.mean for r in rows)]


def best_cells(
    rows: Sequence[Row], columns: Sequence[str], measured, unranked: Collection[str] = ()
) -> set[tuple[int, str]]:
    """``(row index, column)`` of each column's highest mean among ``measured`` row indices
    where the difference to every other measured row is supported (:func:`supported`; none in
    an ``unranked`` column)."""
    out = set()
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
        if all(supported(rows[top], rows[i], column) for i in compared if i != top):
            out.add((top, column))
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
    """A measured row of one run: :func:`best_cells` never compares it."""
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
    best = best_cells(rows, columns, measured, unranked)
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
        [rf"\begin{{tabular}}{{{spec}}}", r"\toprule", *body, r"\bottomrule", r"\end{tabular}",
         *comments]
    )  # fmt: skip


def _csv(rows, columns, extra_columns, best) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    header = ["label", "n"]
    for column in columns:
        header += [f"{column} mean", f"{column} std"]
    writer.writerow([*header, *extra_columns, "best"])
    for index, row in enumerate(rows):
        cells = [row.label, "" if row.n is None else row.n]
        for column in columns:
            mean, std = row.mean.get(column), row.std.get(column)
            cells += ["" if mean is None else f"{mean:.4f}", "" if std is None else f"{std:.4f}"]
        marked = ";".join(c for c in columns if (index, c) in best)
        writer.writerow([*cells, *(row.extra.get(c, "") for c in extra_columns), marked])
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
