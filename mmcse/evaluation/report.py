"""Show and save :func:`mmcse.evaluation.sts.evaluate_sts` results.

The terminal table has the columns of the papers' Table 1 (``STS12 ... STS-B SICK-R Avg.``); the
JSON keeps SentEval's task names so results from other toolkits line up key by key.
"""

from __future__ import annotations

from pathlib import Path

from mmcse.files import write_json

#: SentEval task name -> the column title the papers print
COLUMN_TITLES = {
    "STS12": "STS12",
    "STS13": "STS13",
    "STS14": "STS14",
    "STS15": "STS15",
    "STS16": "STS16",
    "STSBenchmark": "STS-B",
    "SICKRelatedness": "SICK-R",
}


def _render(header: list[str], rows: list[list[str]]) -> list[str]:
    """A bordered plain-text table, cells right-aligned."""
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    border = "+" + "+".join("-" * (width + 2) for width in widths) + "+"

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return [border, line(header), border, *(line(r) for r in rows), border]


def _task_columns(results: dict) -> tuple[list[str], list[str]]:
    tasks = [task for task in COLUMN_TITLES if task in results]
    titles = [COLUMN_TITLES[task] for task in tasks] + ["Avg."]
    return tasks, titles


def _values(results: dict, tasks: list[str]) -> list[str]:
    return [f"{results[task]:.2f}" for task in tasks] + [f"{results['avg']:.2f}"]


def format_table(results: dict) -> str:
    """One run: the Table-1 columns and their average, plus a one-line summary."""
    tasks, titles = _task_columns(results)
    lines = _render(titles, [_values(results, tasks)])
    details = results["details"]
    lines.append(
        f"{details['mode']} | model {details['model']} | pooler {details['pooler']} | "
        f"{details['sentences_encoded']} sentences | {details['seconds']:.1f} s"
    )
    if "align_uniform" in results:
        au = results["align_uniform"]
        lines.append(
            f"alignment {au['alignment']:.4f} | uniformity {au['uniformity']:.4f} "
            f"({au['positive_pairs']} STS-B pairs > 4.0, {au['sentences']} sentences)"
        )
    return "\n".join(lines)


def format_rows(rows: dict[str, dict]) -> str:
    """Several labelled runs (same mode) as rows of one table, label first."""
    tasks, titles = _task_columns(next(iter(rows.values())))
    width = max(len("Model"), *(len(label) for label in rows))  # labels read left-aligned
    body = [[label.ljust(width), *_values(results, tasks)] for label, results in rows.items()]
    return "\n".join(_render(["Model".ljust(width), *titles], body))


def write_report(results: dict, path: str | Path) -> Path:
    """Write ``results`` as indented, strict JSON (NaN becomes null; parent folders created),
    atomically (:func:`mmcse.files.write_json`)."""
    return write_json(path, results)
