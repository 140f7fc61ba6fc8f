"""Several results side by side, like the papers' Table 1, as markdown.

:func:`markdown_table` prints :class:`~mmcse.recipes.summary.Row` s (a summary of seeds, a
published row, a difference) with the columns ``STS12 ... SICK-R Avg.`` plus any extra columns
(a p-value, the source). Rows keep their per-seed values (:func:`~mmcse.recipes.summary.welch_p`
tests a difference on them, :mod:`mmcse.reports.tables` marks only a supported best).
"""

from __future__ import annotations

from collections.abc import Sequence

from mmcse.evaluation.report import COLUMN_TITLES
from mmcse.recipes.published import COLUMNS
from mmcse.recipes.summary import Row

TITLES = {**COLUMN_TITLES, "avg": "Avg."}


def _cell(row: Row, column: str) -> str:
    if column not in row.mean:
        return "–"
    value = row.mean[column]
    text = f"{value:+.2f}" if row.signed else f"{value:.2f}"
    if column in row.std:
        text += f" ± {row.std[column]:.2f}"
    return text


def markdown_table(
    rows: Sequence[Row], columns: Sequence[str] = COLUMNS, extra_columns: Sequence[str] = ()
) -> str:
    """A GitHub-markdown table: one line per row, ``mean ± std`` cells, ``–`` where absent."""
    header = ["", *(TITLES.get(c, c) for c in columns), *extra_columns]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", *("---:" for _ in columns), *("---" for _ in extra_columns)]) + "|",
    ]
    for row in rows:
        cells = [row.label, *(_cell(row, c) for c in columns)]
        cells += [row.extra.get(c, "") for c in extra_columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
