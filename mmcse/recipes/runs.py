"""Honest recipe runs: what a run changed from the recipe, said beside the published numbers.

A recipe is a paper's setting. ``mmcse recipes run``/``mmcse ablate`` accept overrides (another
student, fewer steps, ``--set batch_size=...``, fewer seeds); a run with any of them is not the
published setting, so :func:`departures` compares the TrainConfig each seed would get with and
without them (field by field, so nothing slips through) and the tables and the recipe record
(:class:`mmcse.recipes.layout.SeedsDir`) state the difference. :func:`describe_plan` is ``--dry-run``:
what would run, where, with which changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mmcse.environment import differences, record_notes
from mmcse.errors import MmcseError
from mmcse.files import atomic_dir_litter, read_json, write_json
from mmcse.pooling import student_pooling
from mmcse.precision import describe_precision
from mmcse.recipes.layout import SeedsDir
from mmcse.recipes.recipe import Recipe, RecipeRunSpec, check_unique_seeds
from mmcse.recipes.summary import Row, delta, departure_note, published_row, scores_of, summarize
from mmcse.rundir import FINAL, RunDir
from mmcse.training.config import (
    PER_RUN_SETTINGS,
    RESUMABLE_CHANGES,
    GivenSettings,
    TrainConfig,
    same_setting,
)
from mmcse.training.preflight import check_model, check_output_path, check_terms, checked_method

logger = logging.getLogger(__name__)


def departures(recipe: Recipe, spec: RecipeRunSpec) -> dict[str, dict[str, Any]]:
    """``{setting: {"recipe": value, "run": value}}`` for every way this run leaves the recipe."""
    spec = spec.for_recipe(recipe)
    seed = spec.seeds[0] if spec.seeds else (recipe.seeds[0] if recipe.seeds else 0)
    paper = recipe.config(spec.cache_root, seed=seed, output_dir="-").to_dict()
    ours = recipe.config(spec, seed=seed, output_dir="-").to_dict()
    out = {
        key: {"recipe": paper[key], "run": ours[key]}
        for key in ours
        if key not in PER_RUN_SETTINGS and ours[key] != paper[key]
    }
    if tuple(spec.seeds) != tuple(recipe.seeds):
        out["seeds"] = {"recipe": list(recipe.seeds), "run": list(spec.seeds)}
    return out


def pooling_hint(recipe: Recipe, spec: RecipeRunSpec) -> str:
    """A warning when the (overriding) student ships its own pooling but the run pools otherwise."""
    spec = spec.for_recipe(recipe)
    cfg = recipe.config(spec, seed=spec.seeds[0] if spec.seeds else 0, output_dir="-")
    if cfg.pooler == "auto" or not Path(cfg.model).is_dir():
        return ""
    try:
        own = student_pooling(cfg.model)
    except MmcseError as exc:
        return f"Note: {exc}"
    if own is None or own == cfg.pooler:
        return ""
    origin = "given with --set" if "pooler" in spec.overrides else "the recipe's"
    return (
        f"Note: student {cfg.model} ships its own pooling ({own}) but this run pools with "
        f"{cfg.pooler} ({origin}); --set pooler=auto trains and evaluates with the student's."
    )


def describe_plan(
    recipe: Recipe, rows: list[tuple[str, Path, dict[str, Any]]], spec: RecipeRunSpec
) -> str:
    """``--dry-run``: every (row, seed) run with its directory and config changes (the seeds'
    states, the cache, disk and time follow from the runner's plan,
    :meth:`mmcse.recipes.runner.RunPlan.describe`). ``rows``: (label, folder, that row's
    overrides)."""
    spec = spec.for_recipe(recipe)
    seeds, changes = spec.seeds, departures(recipe, spec)
    total = len(rows) * len(seeds)
    lines = [
        f"dry run: {recipe.name} ({recipe.method}), {total} training run(s): "
        f"{len(rows)} row(s) x seeds {','.join(map(str, seeds))}",
        departure_note(changes) or "The recipe's own setting (no overrides).",
    ]
    hint = pooling_hint(recipe, spec)
    lines += [hint] if hint else []
    base = recipe.config(spec.cache_root, seed=seeds[0], output_dir="-").to_dict() if seeds else {}
    students = []
    if base:  # which arithmetic a run will use (TF32 on CUDA: docs/fidelity.md)
        lines.append(f"precision: {describe_precision(base['precision'], base['tf32'])}")
    for label, out, row_overrides in rows:
        row_spec = spec.with_overrides(row_overrides)
        row_only = RecipeRunSpec(spec.cache_root, overrides=row_overrides)
        row = recipe.config(row_only, seed=0, output_dir="-")
        check_method(row, label)  # what the real run refuses, the dry run refuses
        named = label if label == recipe.name else f"{recipe.name} {label}"  # an ablation row
        students.append((named, recipe.config(row_spec, seed=0, output_dir="-")))
        for seed in seeds:
            cfg = recipe.config(row_spec, seed=seed, output_dir=SeedsDir(out).seed(seed).path)
            cfg = cfg.to_dict()
            diff = {k: v for k, v in cfg.items() if k not in PER_RUN_SETTINGS and base.get(k) != v}
            shown = ", ".join(f"{k}={v}" for k, v in diff.items()) or "recipe config"
            lines.append(f"  {label} seed {seed} -> {cfg['output_dir']}: {shown}")
    check_students(students)
    return "\n".join(lines)


def check_students(runs: list[tuple[str, TrainConfig]]) -> None:
    """Every student these runs train loads — its config and tokenizer on disk (room for
    ``max_seq_length``), or a hub id cached or reachable now — checked once per distinct
    student, as ``train --dry-run`` checks its one (:func:`mmcse.training.preflight.check_model`):
    a dry run does not plan runs that would each fail at their start. ``runs``: (label, config);
    the error names the labels of the runs that student would have trained."""
    users: dict[tuple[str, int], list[str]] = {}
    for label, cfg in runs:
        users.setdefault((cfg.model, cfg.max_seq_length), []).append(label)
    for (model, max_seq_length), labels in users.items():
        try:
            check_model(model, max_seq_length)
        except MmcseError as exc:
            names = list(dict.fromkeys(labels))
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise MmcseError(f"{shown}: {exc}") from None


def check_method(cfg: TrainConfig, label: str) -> None:
    """The run's method builds with its overrides and has a term for every batch kind it
    trains on, as preflight checks before a run's first step; here before the first seed (or
    ablation row) trains, and in the dry run alike. The error names ``label`` (recipe or row)."""

    try:
        check_terms(cfg, checked_method(cfg.method, cfg.method_args))
    except MmcseError as exc:
        raise MmcseError(f"{label}: {exc}") from None


# ---- running over seeds ----------------------------------------------------------------------


def train_one(cfg: TrainConfig, resume: bool = False) -> dict | None:
    """Train one seed (``resume``: continue it from its last/, as ``mmcse train --resume``); its
    STS test numbers (``None`` when no SentEval data was found)."""
    # imported here: torch and transformers load only to train
    from mmcse.training.checkpoint import resume_config
    from mmcse.training.loop import train

    if resume:  # the run's own saved config: what setup resolved (pooler, padding) included
        given = {key: getattr(cfg, key) for key in RESUMABLE_CHANGES if key != "output_dir"}
        cfg = resume_config(cfg.output_dir, None, GivenSettings(given))
    result = train(cfg, resume=resume)
    if result.test is None:
        return None
    logger.info(result.table())
    return scores_of(result.test)


# ---- what a seed folder holds: train, resume or skip it --------------------------------------

#: a seed folder's state, and what ``recipes run``/``ablate`` do with it
NEW, FINISHED, RESUME, RESTART = "new", "finished", "resume", "restart"
REFUSED = "refused"  # a dry run's word for a folder the run would refuse
SEED_ACTIONS = {
    NEW: "train",
    FINISHED: "finished: skipped",
    RESUME: "resume from last/",
    RESTART: "started, nothing saved yet: train again",
    REFUSED: "refused",
}


def seed_state(cfg: TrainConfig) -> str:
    """What ``cfg.output_dir`` holds (:data:`SEED_ACTIONS`). A folder holding anything else (a
    run of other settings, files of no run) is refused, naming why, before any seed trains."""
    run = RunDir(cfg.output_dir)
    if cfg.overwrite or not run.path.is_dir() or not any(run.path.iterdir()):
        check_output_path(run.path, overwrite=cfg.overwrite)
        return NEW
    saved = read_json(run.config)
    if not isinstance(saved, dict):
        check_output_path(run.path)  # not a run of ours: "not empty", --overwrite
    changed = setting_changes(saved, cfg.to_dict())
    if changed:
        detail = ", ".join(f"{k}={saved.get(k)!r} (now: {v!r})" for k, v in changed.items())
        raise MmcseError(
            f"{run.path} is not empty: it holds a run of other settings ({detail}); rerun with "
            "the settings it was trained with, choose another --output-dir, or pass --overwrite "
            "to replace it"
        )
    if run.finished():
        return FINISHED
    if run.last.trainer_state.is_file() or atomic_dir_litter(run.last.path):
        return RESUME
    return RESTART


def setting_changes(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """``{setting: value now}`` where a seed's saved config is not this run's: any setting but
    what a resume may change (:data:`~mmcse.training.config.RESUMABLE_CHANGES`), the seed
    included. A setting setup resolves (a pooler ``auto``; dynamic padding, off under capture)
    matches the value it was resolved to (:func:`~mmcse.training.config.same_setting`)."""
    keys = sorted((set(saved) | set(now)) - set(RESUMABLE_CHANGES))
    return {k: now.get(k) for k in keys if not same_setting(k, saved.get(k), now.get(k))}


def recorded_scores(run: RunDir) -> dict | None:
    """A finished seed's STS test numbers, as its final evaluation recorded them (None: none)."""
    finals = [e for e in run.read_result_entries("sts") if e.get("source") == FINAL]
    if not finals:
        return None
    entry = finals[-1]
    return scores_of({**entry["scores"], "avg": entry.get("avg")})


def train_seed(cfg: TrainConfig, state: str) -> dict | None:
    """Train, resume or read back one seed, as its ``state`` says."""
    if state == FINISHED:
        return recorded_scores(RunDir(cfg.output_dir))
    if state == RESUME:
        return train_one(cfg, resume=True)
    if state == RESTART:
        cfg = replace(cfg, overwrite=True)  # the folder of this very run, started and killed
    return train_one(cfg)


@dataclass
class SeedRuns:
    """The runs of one recipe (or one ablation row) over seeds."""

    label: str
    output_dir: Path
    seeds: tuple[int, ...]
    results: list[dict | None]  # per seed: STS test numbers, or None without eval data
    environments: list[dict | None] = field(default_factory=list)  # per seed, as recorded

    def summary(self) -> Row:
        return summarize(self.label, [r for r in self.results if r is not None])

    def labelled_environments(self) -> dict[str, dict | None]:
        """``{"<label> seed <k>": environment record}`` of the seeds that recorded one."""
        seeds = [f"{self.label} seed {s}" for s in self.seeds]
        return dict(zip(seeds, self.environments, strict=False))

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "output_dir": str(self.output_dir),
            "seeds": list(self.seeds),
            "per_seed": dict(zip(map(str, self.seeds), self.results, strict=True)),
            "summary": self.summary().to_dict(),
        }


def seed_plan(
    recipe: Recipe, spec: RecipeRunSpec, output_dir: str | Path
) -> list[tuple[TrainConfig, str]]:
    """Each seed's config and what its folder holds (:func:`seed_state`); a folder that cannot
    be this seed's run is refused here, before any seed trains."""
    return [(cfg, seed_state(cfg)) for cfg in seed_configs(recipe, spec, output_dir)]


def seed_configs(recipe: Recipe, spec: RecipeRunSpec, output_dir: str | Path) -> list[TrainConfig]:
    """The config of each seed, into ``<output_dir>/seed<k>``."""
    spec = spec.for_recipe(recipe)
    check_unique_seeds(tuple(spec.seeds))
    out = SeedsDir(output_dir)
    return [recipe.config(spec, seed=s, output_dir=out.seed(s).path) for s in spec.seeds]


def run_seeds(
    recipe: Recipe,
    spec: RecipeRunSpec,
    output_dir: str | Path,
    label: str | None = None,
    on_run: Callable[[str, int, str], None] | None = None,
) -> SeedRuns:
    """Train ``recipe`` once per seed into ``<output_dir>/seed<k>`` (cache checked first): a
    finished seed is read back, not trained; a stopped or killed one resumes from its last/.
    ``on_run(label, seed, state)`` is told before each seed starts (a table's progress)."""
    spec = spec.for_recipe(recipe)
    seeds, label = spec.seeds, label or recipe.name
    recipe.check_cache(spec.cache_root, set(spec.overrides))
    out = SeedsDir(output_dir)
    first = recipe.config(spec, seed=seeds[0] if seeds else 0, output_dir=out.path)
    check_method(first, label)
    plan = seed_plan(recipe, spec, out.path)
    results, environments = [], []
    for i, (cfg, state) in enumerate(plan, start=1):
        run = Path(cfg.output_dir)
        if on_run is not None:
            on_run(label, cfg.seed, state)
        action = SEED_ACTIONS[state]
        logger.info(f"[{label}] seed {cfg.seed} ({i} of {len(seeds)}) -> {run}: {action}")
        results.append(train_seed(cfg, state))
        environments.append((RunDir(run).best.read_info() or {}).get("environment"))
    return SeedRuns(label, out.path, tuple(seeds), results, environments)


def environment_record(runs: list[SeedRuns]) -> dict[str, Any]:
    """For a recipe or ablation record: the first seed's environment (``mmcse_run.json``'s
    ``environment``) and where any other seed's differs from it."""
    labelled = {k: v for r in runs for k, v in r.labelled_environments().items() if v}
    return {
        "environment": next(iter(labelled.values()), None),
        "environment_differences": differences(labelled),
    }


def environment_notes(runs: list[SeedRuns]) -> list[str]:
    """The table notes saying which environment made the runs (nothing when none recorded)."""
    return record_notes({k: v for r in runs for k, v in r.labelled_environments().items()})


def comparison_rows(recipe: Recipe, runs: SeedRuns, overridden: bool = False) -> list[Row]:
    """Published rows, this run (mean ± std over seeds), and its difference to the first.

    ``overridden``: the run left the recipe's setting, which its rows then say.
    """
    ours = runs.summary()
    setting = "; OVERRIDDEN setting, see below" if overridden else ""
    this = Row(
        f"this run ({ours.n} of {len(runs.seeds)} seeds{setting})", ours.mean, ours.std, ours.n
    )
    rows = [published_row(p) for p in recipe.published]
    rows.append(this)
    if recipe.published and ours.mean:
        label = "Δ vs published (not the same setting)" if overridden else "Δ vs published"
        rows.append(delta(label, this, rows[0]))
    return rows


@dataclass
class RecipeOutcome:
    """A finished ``recipes run``: the seeds' runs, the rows beside the published ones, the notes
    under the table, and where the record went (its tables: :mod:`mmcse.reports.recipes`)."""

    runs: SeedRuns
    rows: list[Row]
    notes: list[str]
    seeds_dir: SeedsDir


def record_recipe(
    recipe: Recipe, spec: RecipeRunSpec, output_dir: str | Path, runs: SeedRuns
) -> RecipeOutcome:
    """The recipe record of these seeds' runs, written into ``output_dir``
    (:class:`mmcse.recipes.layout.SeedsDir`), with the rows and notes of its table."""
    spec = spec.for_recipe(recipe)
    changes = departures(recipe, spec)
    rows = comparison_rows(recipe, runs, overridden=bool(changes))
    report = {
        "recipe": recipe.to_dict(),
        "overrides": changes,  # {} = the recipe's own setting
        "runs": runs.to_dict(),
        "comparison": [r.to_dict() for r in rows],
        **environment_record([runs]),
    }
    seeds_dir = SeedsDir(output_dir)
    write_json(seeds_dir.results, report)
    notes = [n for n in (departure_note(changes), pooling_hint(recipe, spec)) if n]
    notes += environment_notes([runs])
    return RecipeOutcome(runs, rows, notes, seeds_dir)
