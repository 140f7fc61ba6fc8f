"""Finding training runs on disk and reading what they recorded (for ``compare`` and ``plot``).

A *run* is a training output directory; a *group* is what one command-line argument names: a run,
or a directory of seed runs (``recipes run`` writes ``seed<k>/``; ``ablate`` writes one such
directory per row). The layout, and how runs are found, is :mod:`mmcse.rundir`'s; here the
recorded results become table columns. A group made by ``recipes run`` has the recipe's name and
its overrides in its record, so its published numbers can be shown beside it, honestly.

Only like is compared with like. Every number belongs to a :class:`Protocol` — the suite, its
split or mode (STS ``test``/``dev``, transfer ``test``/``fasttest``) and the pooler when it is not
the run's own — and each protocol has its own columns: the papers' ones (STS test, transfer
test, retrieval) keep their plain titles, every other protocol's titles carry a tag
(``STS-B [dev]``, ``MR [fasttest]``, ``Avg. [test, pooler avg]``). An average covers a task
set: one over a subset of the tasks is a column of its own (``Transfer Avg. (MR, CR)``). The
remaining settings of a protocol (data folder, retrieval head and folders) travel with each
number as its *signature*, so a table can refuse to rank numbers measured on different data.

A folder holding runs of different settings (another method, another learning rate) is split
into one group per setting (:func:`find_groups`): seeds of one setting are averaged, never runs
of two. Runs of one setting given as separate arguments (``runs/simcse-s0 runs/simcse-s1``,
trained by hand with ``--seed`` and ``--output-dir``) join into one group
(:func:`group_seeds`): their recorded configs differ only in
:data:`~mmcse.training.config.PER_RUN_SETTINGS` (the seed, and how each run was carried out).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmcse.errors import MmcseError
from mmcse.evaluation.report import COLUMN_TITLES
from mmcse.evaluation.sts import TASKS_BY_MODE
from mmcse.evaluation.suites import SUITES
from mmcse.evaluation.transfer import TRANSFER_TASKS, TRANSFER_TITLES
from mmcse.files import finite_number, read_json
from mmcse.recipes.layout import SeedsDir
from mmcse.recipes.published import COLUMNS as STS_COLUMNS
from mmcse.reports.model_card import random_teachers
from mmcse.reports.results import merge_results, source_rank
from mmcse.rundir import RunDir, find_runs, is_run_dir
from mmcse.training.config import PER_RUN_SETTINGS

logger = logging.getLogger(__name__)

RETRIEVAL_COLUMNS = tuple(
    f"{d} R@{k}" for d in ("t2i", "i2t") for k in (1, 5, 10)
)  # grounded space
#: the protocol of the papers' tables, whose columns keep their plain titles
STANDARD_MODE = {"sts": "test", "transfer": "test", "retrieval": None}
#: the tasks an average of the standard set covers, per (suite, mode)
FULL_TASKS = {
    ("sts", "test"): TASKS_BY_MODE["test"],
    ("sts", "dev"): TASKS_BY_MODE["dev"],
    ("transfer", "test"): TRANSFER_TASKS,
    ("transfer", "fasttest"): TRANSFER_TASKS,
}
TASK_TITLES = {**COLUMN_TITLES, **TRANSFER_TITLES}
AVG_KEY = {"sts": "avg", "transfer": "transfer avg"}
AVG_TITLE = {"sts": "Avg.", "transfer": "Transfer Avg."}
#: protocol settings that make two numbers incomparable without changing their column
SIGNATURE_KEYS = ("data", "max_length", "head", "images_features", "captions_dir")


@dataclass(frozen=True)
class Protocol:
    """What makes numbers comparable: the suite, its mode, and a pooler other than the run's."""

    suite: str
    mode: str | None
    pooler: str | None = None  # None: each run's own pooler

    @property
    def tag(self) -> str:
        """Empty for the papers' protocol, else what differs (``dev``, ``pooler avg``, ...)."""
        parts = [] if self.mode == STANDARD_MODE[self.suite] else [self.mode or "mode unknown"]
        return ", ".join(parts + ([f"pooler {self.pooler}"] if self.pooler else []))

    def order(self) -> tuple:
        return SUITES.index(self.suite), bool(self.tag), self.tag

    def describe(self) -> str:
        """What this protocol's numbers are (the legend's line)."""
        what = {
            ("sts", "test"): "SentEval STS test sets, Spearman x 100 ('all'); Avg. of the 7 "
            "tasks as the papers' Table 1",
            ("sts", "dev"): "STS-B dev and SICK-R trial, Spearman x 100: the split training "
            "selects checkpoints on, not test scores",
            ("transfer", "test"): "SentEval transfer, test accuracy x 100, logistic-regression "
            "probe, 10-fold, Adam (the papers' protocol)",
            ("transfer", "fasttest"): "SentEval transfer, test accuracy x 100, 5-fold RMSprop "
            "probe (SimCSE's fasttest, not the papers' protocol)",
            ("retrieval", None): "cross-modal retrieval in the grounding heads' space, recall@k %",
        }.get((self.suite, self.mode), f"{self.suite}, mode {self.mode or 'not recorded'}")
        pooler = f"pooled with {self.pooler}" if self.pooler else "each run's own pooler"
        return f"{what}; {pooler}."


@dataclass(frozen=True)
class Column:
    """A table column: its key (a Row's), its protocol and its place."""

    key: str
    protocol: Protocol
    position: int  # within the protocol: tasks, then averages

    def order(self) -> tuple:
        return *self.protocol.order(), self.position, self.key


def column(protocol: Protocol, name: str, subset: tuple[str, ...] | None = None) -> Column:
    """The column of task ``name`` (or ``"avg"`` of the tasks ``subset``, None: the full set)
    measured by ``protocol``."""
    suite = protocol.suite
    if name == "avg":
        base, title = AVG_KEY[suite], AVG_TITLE[suite]
        if subset is not None:
            title += f" ({', '.join(TASK_TITLES.get(t, t) for t in subset)})"
            base = title
        position = 1000 + (len(subset) if subset else 0)
    else:
        base, title = name, TASK_TITLES.get(name, name)
        order = (*STS_COLUMNS, *TRANSFER_TASKS, *RETRIEVAL_COLUMNS)
        position = order.index(name) if name in order else 999
    key = f"{title} [{protocol.tag}]" if protocol.tag else base
    return Column(key, protocol, position)


@dataclass(frozen=True)
class Cell:
    """One number of a run and the settings it was measured with beyond its protocol."""

    value: float
    signature: str  # canonical JSON of the SIGNATURE_KEYS it recorded ("{}": none recorded)


@dataclass
class Run:
    path: Path
    label: str = ""
    # the run info and config, read once (compare asks for them per column and per setting)
    _info: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)
    _config: tuple[dict[str, Any] | None] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.label = self.label or self.path.name

    @property
    def files(self) -> RunDir:
        return RunDir(self.path)

    def info(self) -> dict[str, Any]:
        """The run info of best/ (else last/); empty when neither was saved."""
        if self._info is None:
            infos = (c.read_info() for c in (self.files.best, self.files.last))
            self._info = next((info for info in infos if info), {})
        return self._info

    def config(self) -> dict[str, Any] | None:
        if self._config is None:
            self._config = (read_json(self.files.config),)
        return self._config[0]

    def environment(self) -> dict[str, Any] | None:
        return self.info().get("environment")

    def own_pooler(self) -> str | None:
        return self.info().get("pooler") or (self.config() or {}).get("pooler")

    def cells(self) -> dict[Column, Cell]:
        """Every number this run recorded, in its column (see the module docstring)."""
        own = self.own_pooler()
        out: dict[Column, Cell] = {}
        for suite in SUITES:
            by_protocol: dict[Protocol, list[tuple[tuple, dict]]] = {}
            for index, result in enumerate(merge_results(self.files.read_result_entries(suite))):
                protocol = self._protocol(suite, result, own)
                rank = (source_rank(suite, result["details"]["source"]), -index)
                by_protocol.setdefault(protocol, []).append((rank, result))
            for protocol, results in by_protocol.items():
                out.update(_protocol_cells(protocol, [r for _, r in sorted(results)]))
        return out

    def scores(self) -> dict[str, float]:
        """``{column key: value}`` of :meth:`cells`."""
        return {c.key: cell.value for c, cell in self.cells().items()}

    @staticmethod
    def _protocol(suite: str, result: dict, own: str | None) -> Protocol:
        protocol = result["details"].get("protocol") or {}
        mode = protocol.get("mode")
        if suite == "sts" and mode is None and all(t in result for t in TASKS_BY_MODE["test"]):
            mode = "test"  # an old hand-made file: the 7 test tasks are the test split
        pooler = protocol.get("pooler")
        return Protocol(suite, mode, pooler if own and pooler and pooler != own else None)

    def align_uniform(self) -> dict | None:
        """From the STS results (``mmcse eval --align-uniform``), else from ``mmcse plot``'s."""
        results = merge_results(self.files.read_result_entries("sts"))
        for data in [*reversed(results), read_json(self.files.align_uniform) or {}]:
            au = data.get("align_uniform", data if "alignment" in data else None)
            if au and finite_number(au.get("alignment")) and finite_number(au.get("uniformity")):
                return au
        return None

    def metrics(self) -> list[dict]:
        """The training/eval records (:meth:`mmcse.rundir.RunDir.read_metrics`)."""
        return self.files.read_metrics()

    def unfinished(self) -> str | None:
        """``"step s of N"`` when the run info says the run did not finish, else None."""
        info = self.info()
        if info.get("finished", True) is not False:
            return None
        total = f" of {info['total_steps']}" if info.get("total_steps") else ""
        return f"step {info.get('step', '?')}{total}"

    def random_teachers(self) -> list[str]:
        """The feature sets this run read that came from teachers with random weights."""
        return [key for key, _ in random_teachers(self.info())]

    def batches_seen(self) -> dict[str, int]:
        """Batches of each kind the run trained on (``text``, ``caption``, ...): the sum of its
        training records' ``<kind>_batches``, else what ``plan.json`` planned; empty if neither."""
        seen: dict[str, int] = {}
        for record in self.metrics():
            for key, value in record.items():
                if key.endswith("_batches") and isinstance(value, int):
                    kind = key.removesuffix("_batches")
                    seen[kind] = seen.get(kind, 0) + value
        if seen:
            return seen
        planned = (read_json(self.files.plan) or {}).get("batches_in_run")
        return dict(planned) if isinstance(planned, dict) else {}


def _protocol_cells(protocol: Protocol, results: list[dict]) -> dict[Column, Cell]:
    """The cells of one protocol: each task from the most preferred result that has it
    (:func:`mmcse.reports.results.source_rank`, then the latest), and the average of those tasks."""
    values: dict[str, float] = {}
    signatures: dict[str, str] = {}
    for result in results:
        signature = _signature(result["details"].get("protocol") or {})
        for task, value in _task_values(protocol.suite, result).items():
            if task not in values:
                values[task], signatures[task] = value, signature
    out = {column(protocol, t): Cell(v, signatures[t]) for t, v in values.items()}
    if protocol.suite in AVG_KEY and values:
        tasks = tuple(t for t in (*TASKS_BY_MODE["test"], *TRANSFER_TASKS) if t in values)
        full = FULL_TASKS.get((protocol.suite, protocol.mode))
        own = [r for r in results if _task_values(protocol.suite, r) == values]
        if own and finite_number(own[0].get("avg")):
            avg = float(own[0]["avg"])
        else:  # as the evaluators print it: the mean of the 2-decimal scores
            avg = sum(round(values[t], 2) for t in tasks) / len(tasks)
        subset = None if full is not None and set(tasks) == set(full) else tasks
        mixed = {signatures[t] for t in tasks}
        signature = next(iter(mixed)) if len(mixed) == 1 else json.dumps(sorted(mixed))
        out[column(protocol, "avg", subset)] = Cell(avg, signature)
    return out


def _task_values(suite: str, result: dict) -> dict[str, float]:
    if suite == "retrieval":
        grounded = result.get("grounded")
        if not isinstance(grounded, dict):
            return {}
        return {
            f"{d} R@{k}": float(grounded[d][f"R@{k}"])
            for d in ("t2i", "i2t")
            for k in (1, 5, 10)
            if isinstance(grounded.get(d), dict) and finite_number(grounded[d].get(f"R@{k}"))
        }
    names = TASKS_BY_MODE["test"] if suite == "sts" else TRANSFER_TASKS
    return {t: float(result[t]) for t in names if finite_number(result.get(t))}


def _signature(protocol: dict) -> str:
    known = {k: protocol[k] for k in SIGNATURE_KEYS if protocol.get(k) is not None}
    return json.dumps(known, sort_keys=True)


@dataclass
class Group:
    """Runs of one argument (seeds of one setting), and the recipe they came from if any."""

    label: str
    path: Path
    runs: list[Run] = field(default_factory=list)
    recipe: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # the recipe run's departures
    split_from: str | None = None  # why this is one of several groups of its folder
    joined: list[str] = field(default_factory=list)  # the arguments' labels it joined as seeds


def find_group(argument: str | Path) -> Group:
    """Every run the argument names, whatever their settings (``plot`` draws each run)."""
    path = Path(argument)
    runs = [Run(run.path) for run in find_runs(path)]
    seeds_dir = path.parent if is_run_dir(path) else path  # a single run: its recipe folder
    record = read_json(SeedsDir(seeds_dir).results) or {}
    overrides = record.get("overrides") if isinstance(record.get("overrides"), dict) else {}
    recipe = record.get("recipe")  # what SeedsDir.recipe_name reads, from the record in hand
    name = recipe.get("name") if isinstance(recipe, dict) else None
    return Group(recipe_label(path, seeds_dir, name), path, runs, name, overrides)


def recipe_label(path: Path, seeds_dir: Path, recipe: str | None) -> str:
    """A group's label: its folder's name; for a ``recipes run`` folder the recipe's name, which
    says the method (SimCSE's and MCSE's ``<root>/<method>/wiki+coco/bert`` share the rest) —
    beside the folder's name where the user chose that folder."""
    if not recipe:
        return path.name
    where = seeds_dir.absolute().as_posix()
    own = recipe if where.endswith("/" + recipe) else f"{seeds_dir.name} ({recipe})"
    return own if path == seeds_dir else f"{own}/{path.name}"


def find_groups(arguments) -> list[Group]:
    """A group per argument, or per setting where an argument's folder mixes settings."""
    if not arguments:
        raise MmcseError("give at least one run directory")
    groups = [g for a in arguments for g in split_by_setting(find_group(a))]
    labels = [g.label for g in groups]
    for g in groups:  # same folder name twice (e.g. two seed0): use the parent too
        if labels.count(g.label) > 1:
            g.label = f"{g.path.parent.name}/{g.label}"
    return groups


def group_seeds(groups: list[Group]) -> list[Group]:
    """Groups of one setting (:func:`setting_of`, and the same recipe record) and different
    seeds joined into one, at the first one's place, labelled by what their labels share
    (``simcse-s{0,1}``); a group with a run of no recorded config never joins, nor one whose
    seed another already has (a rerun is not a second seed)."""
    buckets: list[tuple[str | None, list[Group]]] = []
    for group in groups:
        key = _setting_key(group)
        seeds = _seeds(group)
        bucket = next(
            (
                parts
                for k, parts in buckets
                if key is not None and k == key and not seeds & _seeds_of(parts)
            ),
            None,
        )
        if bucket is None:
            buckets.append((key, [group]))
        else:
            bucket.append(group)
    return [_join(parts) if len(parts) > 1 else parts[0] for _, parts in buckets]


def _seeds_of(groups: list[Group]) -> set[str]:
    return {seed for group in groups for seed in _seeds(group)}


def _seeds(group: Group) -> set[str]:
    return {json.dumps((run.config() or {}).get("seed")) for run in group.runs}


def _setting_key(group: Group) -> str | None:
    settings = [setting_of(run) for run in group.runs]
    if not settings or any(s is None for s in settings):
        return None
    texts = {json.dumps(s, sort_keys=True, default=str) for s in settings}
    record = json.dumps([group.recipe, group.overrides], sort_keys=True, default=str)
    return next(iter(texts)) + record if len(texts) == 1 else None


def _join(groups: list[Group]) -> Group:
    labels = [g.label for g in groups]
    runs = [
        Run(run.path, g.label if len(g.runs) == 1 else f"{g.label}/{run.label}")
        for g in groups
        for run in g.runs
    ]
    parent = Path(os.path.commonpath([str(g.path.absolute()) for g in groups]))
    first = groups[0]
    return Group(seeds_label(labels), parent, runs, first.recipe, first.overrides, joined=labels)


def seeds_label(labels: list[str]) -> str:
    """``simcse-s{0,1}`` for ``simcse-s0`` and ``simcse-s1``: the shared start and end around
    what differs; the labels joined with ``+`` when they share neither."""
    start = os.path.commonprefix(labels).rstrip("0123456789")  # s{9,10}, not s{9,1}0
    end = os.path.commonprefix([label[len(start) :][::-1] for label in labels])[::-1]
    end = end.lstrip("0123456789")
    if not start and not end:
        return " + ".join(labels)
    middles = [label[len(start) : len(label) - len(end)] for label in labels]
    return f"{start}{{{','.join(middles)}}}{end}"


def setting_of(run: Run) -> dict[str, Any] | None:
    """What a run trained with, less what differs between seeds by design (None: no config)."""
    config = run.config()
    if config is None:
        return None
    return {k: v for k, v in config.items() if k not in PER_RUN_SETTINGS}


def split_by_setting(group: Group) -> list[Group]:
    """``group`` itself when its runs share one setting, else one group per setting, labelled
    by what tells them apart (the method first)."""
    settings: dict[str, list[Run]] = {}
    known: dict[str, dict | None] = {}
    for run in group.runs:
        setting = setting_of(run)
        key = json.dumps(setting, sort_keys=True, default=str)
        settings.setdefault(key, []).append(run)
        known[key] = setting
    if len(settings) == 1:
        return [group]
    differing = _differing_keys([s for s in known.values() if s is not None])
    names = {key: _setting_name(setting, differing) for key, setting in known.items()}
    which = "; ".join(
        f"{', '.join(r.label for r in runs)}: {names[key]}" for key, runs in settings.items()
    )
    reason = f"{group.path} holds runs of {len(settings)} settings ({which})"
    logger.warning(f"{reason}: not averaged as seeds of one setting, one row per setting")
    label, path, recipe, overrides = group.label, group.path, group.recipe, group.overrides
    return [
        Group(f"{label} [{names[key]}]", path, runs, recipe, overrides, split_from=reason)
        for key, runs in settings.items()
    ]


def _setting_name(setting: dict | None, differing: list[str]) -> str:
    """What tells a setting's runs apart from the folder's others (the ``differing`` keys)."""
    if setting is None:
        return "setting not recorded"
    return ", ".join(f"{k}={short_value(setting.get(k))}" for k in differing)


def _differing_keys(settings: list[dict]) -> list[str]:
    keys = sorted({k for s in settings for k in s}, key=lambda k: (k != "method", k))
    differing = [k for k in keys if len({json.dumps(s.get(k), default=str) for s in settings}) > 1]
    return differing[:3] if differing else ["config"]


def short_value(value: Any) -> str:
    """A setting's value for a label or note: JSON, cut at 40 characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."
