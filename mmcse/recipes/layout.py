"""The folders of several runs: what ``mmcse recipes run`` and ``mmcse ablate`` write.

::

    SEEDS/                   mmcse recipes run (mmcse ablate: one per row, named by the row)
      seed<k>/               one run per seed (its layout: :mod:`mmcse.rundir`)
      results.json           the recipe record: overrides, per-seed scores, comparison rows
      results.md .csv .tex   its table

    ROOT/                    mmcse recipes run with several recipes or a table (mcse:table1)
      <recipe name>/         one SEEDS folder per recipe
      tables/<selection>.md .csv .tex .json   the table, and every seed's numbers

    ABLATION/                mmcse ablate: one SEEDS folder per row, and
      ablation.md .json      the table and the full record (by default; --out moves them)
      ablation.png           its bar chart (mmcse plot)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mmcse.rundir import RESULTS_FILE, RunDir

SEED_PREFIX = "seed"
RESULT_TABLES = "results"  # + .md/.csv/.tex
ABLATION_TABLE = "ablation.md"
ABLATION_RECORD = "ablation.json"
ABLATION_PLOT = "ablation.png"


@dataclass(frozen=True)
class SeedsDir:
    """What ``mmcse recipes run`` writes (``mmcse ablate``: one per row): a run per seed and the
    recipe record with its tables."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    def seed(self, seed: int) -> RunDir:
        return RunDir(self.path / f"{SEED_PREFIX}{seed}")

    @property
    def results(self) -> Path:
        """The recipe record (``recipe``, ``overrides``, ``runs``, ``comparison``)."""
        return self.path / RESULTS_FILE

    @property
    def tables(self) -> Path:
        """The stem of the record's tables (``.md``, ``.csv``, ``.tex`` are added)."""
        return self.path / RESULT_TABLES


@dataclass(frozen=True)
class AblationDir:
    """What ``mmcse ablate`` writes: a :class:`SeedsDir` per row, the table and the record."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    def row(self, name: str) -> SeedsDir:
        return SeedsDir(self.path / name)

    @property
    def table(self) -> Path:
        return self.path / ABLATION_TABLE

    @property
    def record(self) -> Path:
        return self.path / ABLATION_RECORD

    @property
    def plot(self) -> Path:
        return self.path / ABLATION_PLOT

    def is_ablation(self) -> bool:
        return self.record.is_file()
