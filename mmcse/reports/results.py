"""How the recorded evaluations of a run read as results: one per protocol, and the one that
speaks for the run (the entries and how they are written: :mod:`mmcse.rundir`)."""

from __future__ import annotations

from typing import Any

from mmcse.files import finite_number
from mmcse.rundir import EVAL, FINAL, LEGACY, RunDir, canonical


def run_result(run: RunDir, suite: str) -> dict[str, Any] | None:
    """The run's own result of ``suite`` (sts, transfer, retrieval) as one evaluator-style
    dict (``{task: score, "avg", "details"}``): the end-of-training evaluation when there is
    one, else an old-format file's, else the latest ``mmcse eval`` (test mode first).
    None when ``suite`` was never run; every result is :meth:`RunDir.read_result_entries`."""
    merged = merge_results(run.read_result_entries(suite))
    if not merged:
        return None

    def preference(item: tuple[int, dict]) -> tuple:
        index, result = item
        details = result["details"]
        mode = details.get("protocol", {}).get("mode", "test")
        return source_rank(suite, details.get("source")), mode != "test", -index

    return min(enumerate(merged), key=preference)[1]


def merge_results(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One evaluator-style result per (source, protocol), in order of first appearance: every
    task its entries measured, ``avg`` (the entry's own when one entry holds all the tasks, else
    the mean of the scores as printed, 2 decimals), and ``details`` with ``source``,
    ``protocol``, ``recorded`` and ``environment`` of the latest entry and the per-task
    ``tasks``."""
    groups: dict[str, list[dict]] = {}
    for entry in entries:
        key = canonical({"source": entry["source"], "protocol": entry["protocol"]})
        groups.setdefault(key, []).append(entry)
    out = []
    for group in groups.values():
        latest = group[-1]
        scores = {task: s for entry in group for task, s in entry["scores"].items()}
        per_task = {task: d for entry in group for task, d in entry.get("tasks", {}).items()}
        whole = [e for e in group if set(e["scores"]) == set(scores) and e.get("avg") is not None]
        if whole:
            avg = whole[-1]["avg"]
        elif scores and all(finite_number(v) for v in scores.values()):
            avg = sum(round(float(v), 2) for v in scores.values()) / len(scores)
        else:
            avg = None
        details = {
            **latest.get("details", {}),
            "tasks": per_task,
            "source": latest["source"],
            "protocol": latest["protocol"],
            "recorded": latest.get("recorded"),
            "environment": latest.get("environment"),
        }
        result = {**scores, **({"avg": avg} if avg is not None else {})}
        out.append({**result, **latest.get("extra", {}), "details": details})
    return out


def source_rank(suite: str, source: str | None) -> int:
    """Which of a run's results speaks for it (lowest first): its end-of-training evaluation;
    for STS an old-format file (only the trainer wrote one); the ``mmcse eval`` ones; an
    old-format transfer/retrieval file (an older ``mmcse eval``)."""
    if source == LEGACY:
        return 1 if suite == "sts" else 3
    return {FINAL: 0, EVAL: 2}.get(source, 4)
