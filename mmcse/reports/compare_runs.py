"""``mmcse compare RUN...``: STS (+ transfer, + retrieval when recorded) of runs in one table.

Each argument is a run or a folder of seed runs (:mod:`mmcse.reports.runs`; a folder mixing
settings is one row per setting); its row is the mean ± sample std over the seeds that recorded
a number. Arguments whose runs differ only in seed and output folder (sibling folders trained by
hand) are one row (:func:`mmcse.reports.runs.group_seeds`; ``group=False``, ``mmcse compare
--no-group-seeds``: a row per argument), and a note says what separates the rows. Each protocol
has its own columns (STS test and dev, transfer test and fasttest, a
pooler other than the run's, an average over fewer tasks), named in the header and explained in
the legend under the table, and the best mark compares within one column only; a column whose
numbers were measured on different data (or retrieval folders, or heads) is not marked at all.
A group that ``recipes run`` wrote is followed by the recipe's published rows (STS test; the
papers' rows from :mod:`mmcse.recipes.published`); one that overrode the recipe is marked. Under
the table: the legend, what the marked rows changed, and where the runs' environments differ
(:func:`mmcse.environment.differences`; nothing when they match).

A best mark needs support (:data:`mmcse.reports.tables.BEST_RULE`: two seeds a side and a Welch
test) and shows it (seeds a side, p; "low power" under three seeds a side); a row of one seed says
"1 seed: not compared". The ``caveats`` column says what makes a
row weaker evidence than its numbers look: runs that did not finish, features from teachers with
random weights, and for a multimodal run the batches of each kind it actually trained on. An
argument that is a model, not a run, is the base model's row (before fine-tuning)
(:mod:`mmcse.reports.base_model`), a reference that never competes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from mmcse.environment import differences
from mmcse.errors import MmcseError
from mmcse.recipes.published import PUBLISHED
from mmcse.recipes.summary import Row, departure_note, published_row
from mmcse.reports.base_model import BASE_LABEL, base_model_run, is_base_model
from mmcse.reports.runs import (
    Column,
    Group,
    Protocol,
    Run,
    column,
    find_groups,
    group_seeds,
    setting_of,
    short_value,
)
from mmcse.reports.tables import ALL_TITLES, BEST_RULE, render, summarize_columns
from mmcse.rundir import RESULT_FILES

CAVEATS = "caveats"
EXTRA = ("source", CAVEATS)
OVERRIDDEN = " [overridden]"
BEST = f"{BEST_RULE} Columns of different protocols are never compared."
CAVEATS_LEGEND = (
    f"- {CAVEATS}: what makes a row weaker evidence than its numbers look: runs that did not "
    "finish, features from teachers with random weights (they distil from noise), and the "
    "batches of each kind a multimodal run trained on (few caption batches: nearly SimCSE)."
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
        extra = [c for c in EXTRA if c != CAVEATS or any(r.extra.get(c) for r in self.rows)]
        return render(self.rows, self.columns, fmt, extra, self.measured, self.unranked, self.notes)


def comparison(arguments, data: str | None = None, *, group: bool = True) -> Comparison:
    """Every group's row (and its recipe's published rows), the columns present, the notes;
    a base-model argument is scored on ``data`` (None: the runs' STS data folder); ``group``:
    arguments of one setting are seeds of one row."""
    rows, measured, notes = [], [], []
    present: dict[str, Column] = {}
    signatures: dict[str, dict[str, list[str]]] = {}  # column -> signature -> run labels
    environments: dict[str, dict | None] = {}
    run_args = [a for a in arguments if not is_base_model(a)]
    groups = find_groups(run_args) if run_args else []
    groups = group_seeds(groups) if group else groups
    run_groups = list(groups)
    bases = [a for a in arguments if is_base_model(a)]
    data = data or _sts_data(groups)
    groups = [_base_group(a, data) for a in bases] + groups
    if not groups:
        raise MmcseError("give at least one run directory")
    for group in groups:
        scores = []
        for run in group.runs:
            label = run.label if group.joined else group.label
            label = label if len(group.runs) == 1 or group.joined else f"{label}/{run.label}"
            environments[label] = run.environment()
            cells = run.cells()
            for col, cell in cells.items():
                present[col.key] = col
                signatures.setdefault(col.key, {}).setdefault(cell.signature, []).append(label)
            if cells:
                scores.append({col.key: cell.value for col, cell in cells.items()})
        base = group.label.endswith(BASE_LABEL)
        if not base:
            measured.append(len(rows))
        row = summarize_columns(group.label, scores, [c for c in present])
        marked = row.label + (OVERRIDDEN if group.overrides else "")
        seeds = "reference" if base else f"{len(scores)} of {len(group.runs)} runs scored"
        extra = {"source": seeds, CAVEATS: "; ".join(caveats(group.runs))}
        n = None if base else row.n
        rows.append(replace(row, label=marked, n=n, extra=extra))
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
        _legend(ordered, columns),
        *dict.fromkeys(notes),
        *_separation_notes(run_groups, group),
        *_protocol_notes(unranked, signatures),
        *_environment_notes(environments),
    ]
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
    lines.append(CAVEATS_LEGEND)
    return "\n".join(["Columns:", *lines])


def caveats(runs: list[Run]) -> list[str]:
    """What makes these runs' numbers weaker than they look (see the module docstring)."""
    out = []
    unfinished = {run.label: run.unfinished() for run in runs if run.unfinished()}
    if len(runs) == 1 and unfinished:
        out.append(f"unfinished ({next(iter(unfinished.values()))})")
    elif unfinished:
        out.append(f"{len(unfinished)} of {len(runs)} runs unfinished ({', '.join(unfinished)})")
    random = sorted({key for run in runs for key in run.random_teachers()})
    if random:
        out.append(f"random-weight teacher: {', '.join(random)}")
    seen = [run.batches_seen() for run in runs]
    kinds = list(dict.fromkeys(kind for counts in seen for kind, n in counts.items() if n))
    if any(kind != "text" for kind in kinds):
        out.append("batches seen: " + " + ".join(f"{_spread(seen, k)} {k}" for k in kinds))
    return out


def _spread(seen: list[dict[str, int]], kind: str) -> str:
    counts = [counts.get(kind, 0) for counts in seen if counts]
    low, high = min(counts), max(counts)
    return str(low) if low == high else f"{low}-{high}"


def _base_group(argument: str, data: str | None) -> Group:
    run = base_model_run(argument, data)
    return Group(run.label, run.path, [run])


def _sts_data(groups: list[Group]) -> str | None:
    """The SentEval folder the runs' STS test scores were measured on, when they agree."""
    folders = {
        entry["protocol"].get("data")
        for group in groups
        for run in group.runs
        for entry in run.files.read_result_entries("sts")
        if isinstance(entry.get("protocol"), dict) and entry["protocol"].get("mode") == "test"
    }
    folders.discard(None)
    return next(iter(folders)) if len(folders) == 1 else None


def _group_notes(group: Group, marked: str) -> list[str]:
    notes = []
    if group.joined:
        notes.append(
            f"{marked}: {', '.join(group.joined)} differ only in seed and output folder: one "
            "setting, averaged as its seeds (--no-group-seeds keeps them apart)."
        )
    if group.split_from:
        notes.append(
            f"{group.split_from}: each setting is its own row (seeds of one setting are "
            "averaged, never runs of different ones)."
        )
    if group.overrides:
        notes.append(f"{marked}: {departure_note(group.overrides)}")
    return notes


def _separation_notes(groups: list[Group], grouped: bool) -> list[str]:
    """What separates the rows: the settings in which their recorded configs differ; and, for a
    row of one seed, how to give it seeds."""
    settings = {g.label: setting_of(g.runs[0]) for g in groups if g.runs}
    known = {label: s for label, s in settings.items() if s is not None}
    notes = []
    if len(known) > 1:
        keys = sorted({k for s in known.values() for k in s}, key=lambda k: (k != "method", k))
        differ = [k for k in keys if len({_as_json(s.get(k)) for s in known.values()}) > 1]
        if differ:
            shown = differ[:4]
            more = f" (and {len(differ) - 4} more)" if len(differ) > 4 else ""
            parts = [f"{label}: {_values(s, shown)}" for label, s in known.items()]
            notes.append(f"What separates the rows (recorded configs): {'; '.join(parts)}{more}.")
    if grouped and any(len(g.runs) == 1 for g in groups):
        notes.append(
            "A row of 1 seed gets seeds by training the same setting again with only --seed and "
            "--output-dir changed (e.g. runs/NAME-s1 beside runs/NAME-s0) and comparing them "
            "together: runs that differ only there are one row."
        )
    return notes


def _as_json(value) -> str:
    return json.dumps(value, default=str)


def _values(setting: dict, keys: list[str]) -> str:
    return ", ".join(f"{k}={short_value(setting.get(k))}" for k in keys)


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
        notes.append(
            f"{key}: not comparable, measured with different settings: {' vs '.join(parts)}; "
            "no best marked."
        )
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


def compare_table(
    arguments, fmt: str = "md", data: str | None = None, *, group: bool = True
) -> str:
    return comparison(arguments, data, group=group).render(fmt)


def compare_report(
    arguments,
    fmt: str = "md",
    out: str | Path | None = None,
    data: str | None = None,
    *,
    group: bool = True,
) -> Iterator[str]:
    """``mmcse compare``: the table, then (``out``) the file it was also written to."""
    table = compare_table(arguments, fmt, data, group=group)
    yield table
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(table + "\n")
        yield f"wrote {out}"
