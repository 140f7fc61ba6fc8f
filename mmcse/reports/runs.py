"""Finding training runs on disk and reading what they recorded (for ``compare`` and ``plot``).

A *run* is a training output directory (``metrics.jsonl``, ``best/``, ``results.json`` = STS test
of the best checkpoint; ``mmcse eval --tasks transfer,retrieval`` adds ``transfer.json`` and
``retrieval.json``). A *group* is what one command-line argument names: a run, or a directory
of seed runs (``recipes run`` writes ``seed<k>/``; ``ablate`` writes one such directory per row).
A group made by ``recipes run`` has ``results.json`` with the recipe's name, so its published
numbers can be shown beside it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.evaluation.transfer import TRANSFER_TASKS
from mmcse.reports.published import COLUMNS as STS_COLUMNS
from mmcse.rundir import METRICS_FILE

RETRIEVAL_COLUMNS = tuple(
    f"{d} R@{k}" for d in ("t2i", "i2t") for k in (1, 5, 10)
)  # grounded space
TRANSFER_COLUMNS = (*TRANSFER_TASKS, "transfer avg")


def is_run(path: Path) -> bool:
    return (path / METRICS_FILE).is_file() or (path / "best").is_dir()


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise MmcseError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None


@dataclass
class Run:
    path: Path

    @property
    def label(self) -> str:
        return self.path.name

    def sts(self) -> dict[str, float]:
        data = _read_json(self.path / "results.json") or {}
        return {c: float(data[c]) for c in STS_COLUMNS if _number(data.get(c))}

    def transfer(self) -> dict[str, float]:
        data = _read_json(self.path / "transfer.json") or {}
        out = {t: float(data[t]) for t in TRANSFER_TASKS if _number(data.get(t))}
        if _number(data.get("avg")):
            out["transfer avg"] = float(data["avg"])
        return out

    def retrieval(self) -> dict[str, float]:
        data = (_read_json(self.path / "retrieval.json") or {}).get("grounded")
        if not isinstance(data, dict):
            return {}
        return {
            f"{d} R@{k}": float(data[d][f"R@{k}"])
            for d in ("t2i", "i2t")
            for k in (1, 5, 10)
            if d in data
        }

    def scores(self) -> dict[str, float]:
        return {**self.sts(), **self.transfer(), **self.retrieval()}

    def align_uniform(self) -> dict | None:
        for name in ("results.json", "align_uniform.json"):
            data = _read_json(self.path / name) or {}
            au = data.get("align_uniform", data if "alignment" in data else None)
            if au and _number(au.get("alignment")) and _number(au.get("uniformity")):
                return au
        return None

    def metrics(self) -> list[dict]:
        """The training/eval records of ``metrics.jsonl`` (lines without a step are skipped;
        a torn last line — a run still writing — is ignored)."""
        path = self.path / METRICS_FILE
        if not path.is_file():
            return []
        records = []
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):
                    break
                raise MmcseError(f"{path}:{number}: not a JSON object") from None
            if isinstance(record, dict) and _number(record.get("step")):
                records.append(record)
        return records


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class Group:
    """Runs of one argument (seeds), and the recipe they came from if any."""

    label: str
    path: Path
    runs: list[Run] = field(default_factory=list)
    recipe: str | None = None


def _recipe_name(path: Path) -> str | None:
    data = _read_json(path / "results.json") or {}
    recipe = data.get("recipe")
    return recipe.get("name") if isinstance(recipe, dict) else None


def find_group(argument: str | Path) -> Group:
    path = Path(argument)
    if not path.is_dir():
        raise MmcseError(f"{path} is not a directory (expected a run or a folder of seed runs)")
    if is_run(path):
        return Group(path.name, path, [Run(path)], _recipe_name(path.parent))
    seeds = sorted(p for p in path.iterdir() if p.is_dir() and is_run(p))
    if not seeds:
        raise MmcseError(
            f"{path} holds no training run ({METRICS_FILE} or best/) and no seed runs inside it"
        )
    return Group(path.name, path, [Run(p) for p in seeds], _recipe_name(path))


def find_groups(arguments) -> list[Group]:
    if not arguments:
        raise MmcseError("give at least one run directory")
    groups = [find_group(a) for a in arguments]
    labels = [g.label for g in groups]
    for g in groups:  # same folder name twice (e.g. two seed0): use the parent too
        if labels.count(g.label) > 1:
            g.label = f"{g.path.parent.name}/{g.label}"
    return groups
