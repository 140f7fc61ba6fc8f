"""``mmcse compare RUN...``: STS (+ transfer, + retrieval when recorded) of runs in one table.

Each argument is a run or a folder of seed runs (:mod:`mmcse.reports.runs`); its row is the
mean ± sample std over the seeds that recorded a number. A group that ``recipes run`` wrote is
followed by the recipe's published rows (STS; the papers' rows from :mod:`mmcse.reports.published`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.reports.compare import Row, published_row
from mmcse.reports.published import COLUMNS as STS_COLUMNS
from mmcse.reports.published import PUBLISHED
from mmcse.reports.runs import RETRIEVAL_COLUMNS, TRANSFER_COLUMNS, find_groups
from mmcse.reports.tables import present_columns, render, summarize_columns
from mmcse.rundir import RESULT_FILES

ALL_COLUMNS = (*STS_COLUMNS, *TRANSFER_COLUMNS, *RETRIEVAL_COLUMNS)
EXTRA = ("source",)


def comparison(arguments) -> tuple[list[Row], list[str], list[int]]:
    """Rows (runs and published), the columns anything has, the indices of measured rows."""
    rows, measured = [], []
    for group in find_groups(arguments):
        scores = [run.scores() for run in group.runs]
        scores = [s for s in scores if s]
        measured.append(len(rows))
        row = summarize_columns(group.label, scores, ALL_COLUMNS)
        seeds = f"{len(scores)} of {len(group.runs)} runs scored"
        rows.append(Row(row.label, row.mean, row.std, row.n, {"source": seeds}))
        if group.recipe:
            for published in PUBLISHED.get(group.recipe, ()):
                rows.append(published_row(published))
    columns = present_columns(rows, ALL_COLUMNS)
    if not any(rows[i].mean for i in measured):
        raise MmcseError(
            f"none of these runs has results ({' / '.join(RESULT_FILES.values())}); "
            "train with final evaluation or run mmcse eval --model RUN first"
        )
    return rows, columns, measured


def compare_table(arguments, fmt: str = "md") -> str:
    rows, columns, measured = comparison(arguments)
    return render(rows, columns, fmt, EXTRA, measured)


def compare_report(arguments, fmt: str = "md", out: str | Path | None = None) -> Iterator[str]:
    """``mmcse compare``: the table, then (``out``) the file it was also written to."""
    table = compare_table(arguments, fmt)
    yield table
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(table + "\n")
        yield f"wrote {out}"
