"""The layout of a training run directory: one owner for every name in it.

::

    RUN/                     a training run (mmcse train --output-dir RUN)
      config.json            the resolved TrainConfig
      plan.json              what the run will do (printed at start)
      metrics.jsonl          one record per log window and per dev evaluation (append-only)
      left_out.jsonl         every corpus row the read policy left out (only when one was):
                             corpus, file, line or row, why; plan.json's left_out counts them
      tensorboard/           the same scalars for TensorBoard (--report-to tensorboard)
      best/                  a checkpoint: the best one by STS-B dev
      last/                  a checkpoint: the resumable one (adds trainer_state.pt)
      results.json           STS results of best/: the end-of-training test scores (final_eval)
                             and every mmcse eval since (see "Recorded results" below)
      transfer.json          SentEval transfer results (mmcse eval --tasks transfer), the same way
      retrieval.json         cross-modal retrieval results (mmcse eval --tasks retrieval), same
      align_uniform.json     alignment and uniformity on STS-B (mmcse plot --align-uniform)
      training_curves.png    loss terms, lr and STS-B dev against the step (mmcse plot)

    CHECKPOINT/              best/ or last/: an ordinary HF model directory (save_pretrained) plus
      mmcse_heads.safetensors  the loss heads (training-only)
      mmcse_run.json           run info (keys below)
      trainer_state.pt         last/ only: optimizer, scheduler, RNG states, data position
      mmcse_integrity.json     last/ only, written last: the size and sha256 of every other file,
                               the settings and the fingerprints it was saved with (checked
                               before a resume: :mod:`mmcse.training.checkpoint`)

    The folders of several runs (``mmcse recipes run``, ``mmcse ablate``) are the recipes'
    (:mod:`mmcse.recipes.layout`).

Run info (``mmcse_run.json``, :meth:`Checkpoint.read_info`), one JSON object:

* ``config`` (the resolved TrainConfig), ``method`` (its weights), ``step``, ``total_steps``,
  ``finished`` (false until the run completes), ``stsb_dev``, ``pooler``, ``pooler_source``,
  ``term_heads`` (which heads each loss term used);
* ``fingerprints``: ``{key: {"path", "fingerprint"}}`` of every corpus (``corpus:text``,
  ``corpus:caption``) and feature set (``feature:<role>``, ``feature:<role>[i]`` when a role
  has several sets) it trained on;
* ``teachers``: ``{key: provenance}`` for every feature set, keyed as in ``fingerprints``; the
  provenance is what the set's manifest says produced it
  (:meth:`mmcse.cache.manifest.Manifest.provenance`): ``teacher``, ``weights`` (``default``,
  ``random``, ``path``), ``weights_source``, ``weights_sha256``, ``revision``, ``dtype`` (the
  teacher's compute dtype), ``stored_dtype``, ``kind``, ``dataset``, ``split``,
  ``fingerprint`` and the whole ``producer``; a value the manifest lacks is null;
* ``environment``: the process that wrote the checkpoint (:mod:`mmcse.environment` lists the
  keys: mmcse version and git commit, Python and library versions, CUDA/cuDNN, device,
  precision and determinism settings, OS/CPU). A resumed run's checkpoints carry the resuming
  process's environment.

Recorded results (``results.json``, ``transfer.json``, ``retrieval.json``; :meth:`RunDir.
write_results` / :meth:`RunDir.read_result_entries`) accumulate, one entry per evaluation::

    {"format": "mmcse.results/2", "suite": "transfer", "entries": [
      {"source": "eval",                  final: the training run's own end-of-training
                                          evaluation; eval: mmcse eval; legacy: a file from
                                          before this format (read, never rewritten away)
       "protocol": {"mode": "test", "pooler": "cls", "data": "/.../downstream"},
       "scores": {"CR": 85.1, ...},       per task (retrieval: per space, an object)
       "avg": 85.1,                       the evaluation's own average of its tasks
       "tasks": {"CR": {...}, ...},       per-task details (folds, subsets, ...)
       "details": {...},                  the evaluation's other details (model, seconds, ...)
       "extra": {...},                    anything else it returned (STS: align_uniform)
       "environment": {...},              :mod:`mmcse.environment`'s record of the evaluation
       "recorded": "2025-01-01T12:00:00+00:00"}]}

A new entry replaces, task by task, what an entry of the same source and protocol holds
(logged); every other result stays. A file in the old flat format is read as one ``legacy``
entry. How entries merge into one result per protocol, and which speaks for the run, is the
reports' (:mod:`mmcse.reports.results`).

Nothing is ever half-written: a checkpoint is written in a hidden ``.tmp-<name>-*`` directory
beside it and renamed into place (:func:`mmcse.files.atomic_dir`; a kill between the two
renames leaves the previous save as ``.old-<name>``, which :meth:`RunDir.recover` puts back),
and every JSON file is written to a hidden temp file, fsynced, renamed over the old one and the
folder fsynced (:func:`mmcse.files.write_json`). Readers never look at hidden names. ``metrics.jsonl`` is appended to, so its readers skip a torn last line.

Everything else reads and writes a run through :class:`RunDir`, :class:`Checkpoint` and
:class:`~mmcse.recipes.layout.SeedsDir`; a new record (say, the run's environment) is one
more name and property here.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

from mmcse.errors import MmcseError
from mmcse.files import (
    atomic_dir_litter,
    finite_number,
    finite_or_none,
    read_json,
    recover_dir,
    write_json,
)

logger = logging.getLogger(__name__)

# ---- names ------------------------------------------------------------------------------------

CONFIG_FILE = "config.json"
PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.jsonl"
LEFT_OUT_FILE = "left_out.jsonl"
TENSORBOARD_DIR = "tensorboard"
BEST_DIR = "best"
LAST_DIR = "last"
RESULTS_FILE = "results.json"
TRANSFER_FILE = "transfer.json"
RETRIEVAL_FILE = "retrieval.json"
ALIGN_UNIFORM_FILE = "align_uniform.json"
CURVES_PLOT = "training_curves.png"
#: the alignment–uniformity scatter of several runs (written where ``mmcse plot`` is told)
ALIGN_UNIFORM_PLOT = "align_uniform.png"
#: one metric of several runs overlaid (``mmcse plot RUN RUN...``, beside the scatter)
OVERLAY_PLOT = "curves-{metric}.png"

#: an HF model directory is one holding this (a checkpoint is one too)
MODEL_CONFIG_FILE = "config.json"
RUN_INFO_FILE = "mmcse_run.json"
HEADS_FILE = "mmcse_heads.safetensors"
TRAINER_STATE_FILE = "trainer_state.pt"
INTEGRITY_FILE = "mmcse_integrity.json"

RESULTS_FORMAT = "mmcse.results/2"
#: who recorded an entry (see "Recorded results" in the module docstring)
FINAL, EVAL, LEGACY = "final", "eval", "legacy"
#: where each evaluation suite's results of a run's best/ are kept
RESULT_FILES = {"sts": RESULTS_FILE, "transfer": TRANSFER_FILE, "retrieval": RETRIEVAL_FILE}
#: what a training run writes, every record added to the layout included (``--overwrite``
#: removes these and nothing else: a stale record would pass for the new run's)
RUN_ENTRIES = (
    METRICS_FILE,
    CONFIG_FILE,
    PLAN_FILE,
    RESULTS_FILE,
    BEST_DIR,
    LAST_DIR,
    TENSORBOARD_DIR,
    TRANSFER_FILE,
    RETRIEVAL_FILE,
    ALIGN_UNIFORM_FILE,
    CURVES_PLOT,
    LEFT_OUT_FILE,
)
CHECKPOINTS = (BEST_DIR, LAST_DIR)


# ---- recognising directories ------------------------------------------------------------------


def is_model_dir(path: str | Path) -> bool:
    """An HF model directory (what ``from_pretrained`` loads): a checkpoint is one too."""
    return (Path(path) / MODEL_CONFIG_FILE).is_file()


def is_checkpoint_dir(path: str | Path) -> bool:
    """An HF model directory that an mmcse run saved (it carries its run info)."""
    return is_model_dir(path) and (Path(path) / RUN_INFO_FILE).is_file()


def is_run_dir(path: str | Path) -> bool:
    """A training run: it has logged (``metrics.jsonl``) or saved a best checkpoint."""
    path = Path(path)
    return (path / METRICS_FILE).is_file() or (path / BEST_DIR).is_dir()


def resolve_model_dir(path_or_id: str | Path) -> str:
    """A run directory resolves to its best checkpoint; an HF model directory is returned as is,
    and so is a name that names nothing on disk (a hub id; :func:`mmcse.hub.local_or_hub_id`
    refuses one that reads as a local path). Refused at once, naming the folder: an existing
    folder that is neither a model nor a run, and a training run without a best checkpoint."""
    text = str(path_or_id)
    path = Path(text).expanduser()
    if not path.exists():
        return text
    run = RunDir(path)
    if run.best.saved():
        return str(run.best.path)
    if looks_like_run(path):
        raise MmcseError(no_best_message(run))
    if not is_model_dir(path):
        raise MmcseError(
            f"{text} is neither an HF model directory (no {MODEL_CONFIG_FILE}) nor a "
            f"training run (no {BEST_DIR}/{MODEL_CONFIG_FILE})"
        )
    return str(path)


def looks_like_run(path: str | Path) -> bool:
    """A training run, saved or not: it logged, planned, has a best/ or last/ folder, or its
    ``config.json`` is a run's settings (a ``method``, no HF ``model_type``), not a model's."""
    path = Path(path)
    run = RunDir(path)
    return is_run_dir(path) or run.plan.is_file() or run.last.path.is_dir() or _is_run_config(run)


def _is_run_config(run: RunDir) -> bool:
    try:
        config = json.loads(run.config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    hf_keys = ("model_type", "architectures")
    return isinstance(config, dict) and "method" in config and not any(k in config for k in hf_keys)


def no_best_message(run: RunDir) -> str:
    """What a run without a best checkpoint lacks, and what to load instead."""
    last = (
        f"; its latest checkpoint is {run.last.path} (not the best by STS-B dev)"
        if run.last.saved()
        else "; it has saved no checkpoint at all"
    )
    return (
        f"{run.path} is a training run without a best checkpoint (no {BEST_DIR}/"
        f"{MODEL_CONFIG_FILE}: it stopped before its first STS-B dev evaluation){last}"
    )


def run_of_model(path_or_id: str | Path) -> RunDir | None:
    """The run a ``--model`` argument names (one :func:`resolve_model_dir` turns into its best/)."""
    run = RunDir(path_or_id)
    return run if run.best.saved() else None


def run_of_checkpoint(model_dir: str | Path) -> RunDir | None:
    """The run whose best/ ``model_dir`` is (its scores are that run's ``results.json``)."""
    model_dir = Path(model_dir)
    return RunDir(model_dir.parent) if model_dir.name == BEST_DIR else None


def find_runs(path: str | Path) -> list[RunDir]:
    """The run ``path`` is, or the runs directly inside it (seeds), sorted; refused when neither."""
    path = Path(path)
    if not path.is_dir():
        raise MmcseError(f"{path} is not a directory (expected a run or a folder of seed runs)")
    if is_run_dir(path):
        return [RunDir(path)]
    runs = sorted(p for p in path.iterdir() if p.is_dir() and is_run_dir(p))
    if not runs:
        raise MmcseError(
            f"{path} holds no training run ({METRICS_FILE} or {BEST_DIR}/) and no seed runs "
            "inside it"
        )
    return [RunDir(p) for p in runs]


def run_finished(info: dict[str, Any] | None) -> bool | None:
    """Whether the run that saved a checkpoint with run info ``info`` completed (run info from
    before the flag existed counts as finished); None without run info. The one reading of
    ``finished``."""
    if info is None:
        return None
    return info.get("finished", True) is not False


# ---- the layout -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """``best/`` or ``last/`` of a run (or any directory a checkpoint is being written into)."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def heads(self) -> Path:
        return self.path / HEADS_FILE

    @property
    def run_info(self) -> Path:
        return self.path / RUN_INFO_FILE

    @property
    def trainer_state(self) -> Path:
        return self.path / TRAINER_STATE_FILE

    @property
    def integrity(self) -> Path:
        """last/ only: what every file of the checkpoint was when saved (its integrity record)."""
        return self.path / INTEGRITY_FILE

    def saved(self) -> bool:
        """A checkpoint is here (its model loads; renamed into place, so never half of one)."""
        return is_model_dir(self.path)

    def read_info(self) -> dict[str, Any] | None:
        """The run info, or None when the directory has none (a plain HF model)."""
        return read_json(self.run_info)

    def write_info(self, info: dict[str, Any]) -> None:
        write_json(self.run_info, info, default=str)  # the config may hold paths

    def finished(self) -> bool:
        """Its run completed (:func:`run_finished`); False without run info."""
        return run_finished(self.read_info()) is True

    def unfinished(self) -> bool:
        """Its run info says the run has not completed (killed, or still running)."""
        return run_finished(self.read_info()) is False

    def mark_finished(self) -> None:
        """Flip ``finished`` to true in the run info (one atomic file replace)."""
        info = self.read_info()
        if info is not None:
            self.write_info({**info, "finished": True})


@dataclass(frozen=True)
class RunDir:
    """Every path of one training run (see the module docstring); nothing is created here."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def plan(self) -> Path:
        return self.path / PLAN_FILE

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def left_out(self) -> Path:
        return self.path / LEFT_OUT_FILE

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD_DIR

    @property
    def best(self) -> Checkpoint:
        return Checkpoint(self.path / BEST_DIR)

    @property
    def last(self) -> Checkpoint:
        return Checkpoint(self.path / LAST_DIR)

    @property
    def results(self) -> Path:
        return self.result_file("sts")

    @property
    def transfer(self) -> Path:
        return self.result_file("transfer")

    @property
    def retrieval(self) -> Path:
        return self.result_file("retrieval")

    @property
    def align_uniform(self) -> Path:
        return self.path / ALIGN_UNIFORM_FILE

    @property
    def training_curves(self) -> Path:
        return self.path / CURVES_PLOT

    def result_file(self, suite: str) -> Path:
        return self.path / RESULT_FILES[suite]

    def finished(self) -> bool:
        """Training completed (best/ and last/ are marked together when it does)."""
        return self.best.finished()

    # -- reading and writing -------------------------------------------------------------------
    def read_result_entries(self, suite: str) -> list[dict[str, Any]]:
        """Every recorded evaluation of ``suite``, oldest first (an old flat file: one legacy
        entry); a malformed file is one error line naming it."""
        path = self.result_file(suite)
        data = read_json(path)
        if data is None:
            return []
        if "format" not in data:
            return [result_entry(data, LEGACY, recorded=None)]
        entries = data.get("entries")
        if data["format"] != RESULTS_FORMAT:
            raise MmcseError(
                f"{path}: results format {data['format']!r} is not {RESULTS_FORMAT!r} "
                "(written by another mmcse version)"
            )
        if not isinstance(entries, list) or not all(_is_entry(e) for e in entries):
            raise MmcseError(f"{path}: 'entries' must be a list of result entries")
        return entries

    def write_results(self, suite: str, results: dict[str, Any], source: str = EVAL) -> Path:
        """Add an evaluation of best/ to ``suite``'s record (atomically). Its tasks replace those
        of earlier entries with the same source and protocol (a log line says which); every
        other result is kept."""
        path = self.result_file(suite)
        new = result_entry(results, source)
        kept = []
        for entry in self.read_result_entries(suite):
            same = entry["source"] == source and _same(entry["protocol"], new["protocol"])
            replaced = [task for task in entry["scores"] if same and task in new["scores"]]
            if replaced:
                logger.info(
                    f"{path}: the new {', '.join(replaced)} ({describe_protocol(new['protocol'])},"
                    f" {source}) replaces the one recorded {entry.get('recorded') or 'earlier'}"
                )
                entry = _without_tasks(entry, replaced)
            if entry["scores"]:
                kept.append(entry)
        payload = {"format": RESULTS_FORMAT, "suite": suite, "entries": [*kept, new]}
        return write_json(path, payload, default=str)

    def read_metrics(self) -> list[dict[str, Any]]:
        """The training/eval records of ``metrics.jsonl``: records without a numeric step are
        skipped, a torn last line (a run still writing, or killed) is ignored."""
        path = self.metrics
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
            if isinstance(record, dict) and finite_number(record.get("step")):
                records.append(record)
        return records

    def recover(self) -> None:
        """Undo what a kill during a checkpoint save left (see :func:`recover_dir`)."""
        for name in CHECKPOINTS:
            recover_dir(self.path / name)

    def lock(self) -> RunLock:
        """Hold this folder as the one process training into it (:class:`RunLock`); creates
        the folder."""
        return RunLock(self.path)

    def clear(self) -> None:
        """Remove what an earlier run wrote here (:data:`RUN_ENTRIES` and checkpoint litter);
        anything else in the folder is left alone."""
        litter = [p for name in CHECKPOINTS for p in atomic_dir_litter(self.path / name)]
        for path in [*(self.path / name for name in RUN_ENTRIES), *litter]:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()


class RunLock:
    """One writer per run folder: an exclusive ``flock`` on the folder itself, held while a
    process trains into it. A second process that would train there (a second ``recipes run``
    of the same table, a ``--resume`` of a running run) is refused in one line. The kernel
    releases the lock when its holder exits however it exits (SIGKILL, a crash), so a killed
    run leaves nothing stuck, and nothing is written into the folder for it. Where ``flock``
    does not exist (Windows) nothing is locked."""

    def __init__(self, path: Path) -> None:
        self.path, self.fd = Path(path), None
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise MmcseError(
                f"{self.path} is in use: another process is training into it; wait for it to "
                "end (or stop it), or give another --output-dir"
            ) from None
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


# ---- recorded results -------------------------------------------------------------------------

#: what an old flat file's details say of how it was measured (it has no "protocol")
_LEGACY_PROTOCOL = ("mode", "pooler", "head", "images_features", "captions_dir")


def result_entry(results: dict[str, Any], source: str, recorded: str | None = "now") -> dict:
    """An evaluator's result (``{task: score, ..., "avg", "details"}``; its details may hold
    ``protocol``, ``environment`` and per-task ``tasks``) as one recorded entry."""
    from datetime import datetime

    details = dict(results.get("details") or {})
    per_task = details.pop("tasks", None)
    protocol = details.pop("protocol", None)
    if protocol is None:
        protocol = {key: details[key] for key in _LEGACY_PROTOCOL if key in details}
    environment = details.pop("environment", None)
    if isinstance(per_task, dict):
        tasks = [task for task in per_task if task in results]
    else:
        tasks = [key for key in results if key not in ("avg", "details")]
    others = [key for key in results if key not in (*tasks, "avg", "details")]
    if recorded == "now":
        recorded = datetime.now(UTC).isoformat(timespec="seconds")
    return {
        "source": source,
        "protocol": protocol,
        "scores": {task: results[task] for task in tasks},
        "avg": results.get("avg"),
        "tasks": {task: per_task[task] for task in tasks} if isinstance(per_task, dict) else {},
        "details": details,
        "extra": {key: results[key] for key in others},
        "environment": environment,
        "recorded": recorded,
    }


def describe_protocol(protocol: dict[str, Any]) -> str:
    """``mode test, pooler cls, data /x`` (unset settings left out)."""
    return ", ".join(f"{key} {value}" for key, value in protocol.items() if value is not None)


def _without_tasks(entry: dict[str, Any], tasks: list[str]) -> dict[str, Any]:
    """``entry`` less ``tasks`` (its own average no longer covers what it keeps)."""
    return {
        **entry,
        "scores": {t: v for t, v in entry["scores"].items() if t not in tasks},
        "tasks": {t: v for t, v in entry.get("tasks", {}).items() if t not in tasks},
        "avg": None,
    }


def _is_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("scores"), dict)
        and isinstance(entry.get("protocol"), dict)
        and isinstance(entry.get("source"), str)
    )


def canonical(value: Any) -> str:
    return json.dumps(finite_or_none(value), sort_keys=True, default=str)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return canonical(a) == canonical(b)
