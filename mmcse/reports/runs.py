"""Finding training runs on disk and reading what they recorded (for ``compare`` and ``plot``).

A *run* is a training output directory; a *group* is what one command-line argument names: a run,
or a directory of seed runs (``recipes run`` writes ``seed<k>/``; ``ablate`` writes one such
directory per row). The layout, and how runs are found, is :mod:`mmcse.rundir`'s; here the
recorded results become table columns. A group made by ``recipes run`` has the recipe's name in
its record, so its published numbers can be shown beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.evaluation.transfer import TRANSFER_TASKS
from mmcse.reports.published import COLUMNS as STS_COLUMNS
from mmcse.rundir import RunDir, SeedsDir, find_runs, is_run_dir, read_json

RETRIEVAL_COLUMNS = tuple(
    f"{d} R@{k}" for d in ("t2i", "i2t") for k in (1, 5, 10)
)  # grounded space
TRANSFER_COLUMNS = (*TRANSFER_TASKS, "transfer avg")


@dataclass
class Run:
    path: Path

    @property
    def files(self) -> RunDir:
        return RunDir(self.path)

    @property
    def label(self) -> str:
        return self.path.name

    def sts(self) -> dict[str, float]:
        data = self.files.read_results("sts") or {}
        return {c: float(data[c]) for c in STS_COLUMNS if _number(data.get(c))}

    def transfer(self) -> dict[str, float]:
        data = self.files.read_results("transfer") or {}
        out = {t: float(data[t]) for t in TRANSFER_TASKS if _number(data.get(t))}
        if _number(data.get("avg")):
            out["transfer avg"] = float(data["avg"])
        return out

    def retrieval(self) -> dict[str, float]:
        data = (self.files.read_results("retrieval") or {}).get("grounded")
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
        """From the STS results (``mmcse eval --align-uniform``), else from ``mmcse plot``'s."""
        for path in (self.files.results, self.files.align_uniform):
            data = read_json(path) or {}
            au = data.get("align_uniform", data if "alignment" in data else None)
            if au and _number(au.get("alignment")) and _number(au.get("uniformity")):
                return au
        return None

    def metrics(self) -> list[dict]:
        """The training/eval records (:meth:`mmcse.rundir.RunDir.read_metrics`)."""
        return self.files.read_metrics()


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class Group:
    """Runs of one argument (seeds), and the recipe they came from if any."""

    label: str
    path: Path
    runs: list[Run] = field(default_factory=list)
    recipe: str | None = None


def find_group(argument: str | Path) -> Group:
    path = Path(argument)
    runs = [Run(run.path) for run in find_runs(path)]
    seeds_dir = path.parent if is_run_dir(path) else path  # a single run: its recipe folder
    return Group(path.name, path, runs, SeedsDir(seeds_dir).recipe_name())


def find_groups(arguments) -> list[Group]:
    if not arguments:
        raise MmcseError("give at least one run directory")
    groups = [find_group(a) for a in arguments]
    labels = [g.label for g in groups]
    for g in groups:  # same folder name twice (e.g. two seed0): use the parent too
        if labels.count(g.label) > 1:
            g.label = f"{g.path.parent.name}/{g.label}"
    return groups
