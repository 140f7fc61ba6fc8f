"""The layout of a training run directory: one owner for every name in it.

::

    RUN/                     a training run (mmcse train --output-dir RUN)
      config.json            the resolved TrainConfig
      plan.json              what the run will do (printed at start)
      metrics.jsonl          one record per log window and per dev evaluation (append-only)
      tensorboard/           the same scalars for TensorBoard (--report-to tensorboard)
      best/                  a checkpoint: the best one by STS-B dev
      last/                  a checkpoint: the resumable one (adds trainer_state.pt)
      results.json           STS test scores of best/ (end of training, with final_eval)
      transfer.json          SentEval transfer results (mmcse eval --tasks transfer)
      retrieval.json         cross-modal retrieval results (mmcse eval --tasks retrieval)
      align_uniform.json     alignment and uniformity on STS-B (mmcse plot --align-uniform)
      training_curves.png    loss terms, lr and STS-B dev against the step (mmcse plot)

    CHECKPOINT/              best/ or last/: an ordinary HF model directory (save_pretrained) plus
      mmcse_heads.safetensors  the loss heads (training-only)
      mmcse_run.json           run info: config, method, step, STS-B dev, pooler, fingerprints of
                               every set it trained on, and "finished" (false until the run ends)
      trainer_state.pt         last/ only: optimizer, scheduler, RNG states, data position
      mmcse_integrity.json     last/ only, written last: the size and sha256 of every other file,
                               the settings and the fingerprints it was saved with (checked
                               before a resume: :mod:`mmcse.training.checkpoint`)

    SEEDS/                   mmcse recipes run (mmcse ablate: one per row, named by the row)
      seed<k>/               one RUN per seed
      results.json           the recipe record: overrides, per-seed scores, comparison rows
      results.md .csv .tex   its table

    ABLATION/                mmcse ablate: one SEEDS folder per row, and
      ablation.md .json      the table and the full record (by default; --out moves them)
      ablation.png           its bar chart (mmcse plot)

Nothing is ever half-written: a checkpoint is written in a hidden ``.tmp-<name>-*`` directory
beside it and renamed into place (:func:`atomic_dir`; a kill between the two renames leaves the
previous save as ``.old-<name>``, which :meth:`RunDir.recover` puts back), and every JSON file is
written to a hidden temp file, fsynced and renamed over the old one (:func:`write_json`). Readers
never look at hidden names. ``metrics.jsonl`` is appended to, so its readers skip a torn last line.

Everything else reads and writes a run through :class:`RunDir`, :class:`Checkpoint` and
:class:`SeedsDir`; a new record (say, the run's environment) is one more name and property here.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmcse.errors import MmcseError

# ---- names ------------------------------------------------------------------------------------

CONFIG_FILE = "config.json"
PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.jsonl"
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

#: an HF model directory is one holding this (a checkpoint is one too)
MODEL_CONFIG_FILE = "config.json"
RUN_INFO_FILE = "mmcse_run.json"
HEADS_FILE = "mmcse_heads.safetensors"
TRAINER_STATE_FILE = "trainer_state.pt"
INTEGRITY_FILE = "mmcse_integrity.json"

SEED_PREFIX = "seed"
RESULT_TABLES = "results"  # + .md/.csv/.tex
ABLATION_TABLE = "ablation.md"
ABLATION_RECORD = "ablation.json"
ABLATION_PLOT = "ablation.png"

#: where each evaluation suite's results of a run's best/ are kept
RESULT_FILES = {"sts": RESULTS_FILE, "transfer": TRANSFER_FILE, "retrieval": RETRIEVAL_FILE}
#: what a training run writes, every record added to the layout included (``--overwrite``
#: removes these and nothing else: a stale record would pass for the new run's)
RUN_ENTRIES = (
    METRICS_FILE, CONFIG_FILE, PLAN_FILE, RESULTS_FILE, BEST_DIR, LAST_DIR, TENSORBOARD_DIR,
    TRANSFER_FILE, RETRIEVAL_FILE, ALIGN_UNIFORM_FILE, CURVES_PLOT,
)  # fmt: skip
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
    """A run directory resolves to its best checkpoint; an HF model directory or a hub id is
    returned as is; an existing folder that is neither is refused."""
    run = RunDir(path_or_id)
    if run.best.saved():
        return str(run.best.path)
    if run.path.exists() and not is_model_dir(run.path):
        raise MmcseError(
            f"{path_or_id} is neither an HF model directory (no {MODEL_CONFIG_FILE}) nor a "
            f"training run (no {BEST_DIR}/{MODEL_CONFIG_FILE})"
        )
    return str(path_or_id)


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
        """Its run completed (run info from before the flag existed counts as finished); False
        without run info."""
        info = self.read_info()
        return info is not None and info.get("finished", True) is not False

    def unfinished(self) -> bool:
        """Its run info says the run has not completed (killed, or still running)."""
        info = self.read_info()
        return info is not None and info.get("finished", True) is False

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
    def read_results(self, suite: str) -> dict[str, Any] | None:
        """The recorded results of ``suite`` (sts, transfer, retrieval); None when not run."""
        return read_json(self.result_file(suite))

    def write_results(self, suite: str, results: dict[str, Any]) -> Path:
        """Record ``suite``'s results of best/, replacing earlier ones (atomically)."""
        return write_json(self.result_file(suite), results)

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
            if isinstance(record, dict) and _finite_number(record.get("step")):
                records.append(record)
        return records

    def recover(self) -> None:
        """Undo what a kill during a checkpoint save left (see :func:`recover_dir`)."""
        for name in CHECKPOINTS:
            recover_dir(self.path / name)

    def clear(self) -> None:
        """Remove what an earlier run wrote here (:data:`RUN_ENTRIES` and checkpoint litter);
        anything else in the folder is left alone."""
        litter = [p for name in CHECKPOINTS for p in _checkpoint_litter(self.path / name)]
        for path in [*(self.path / name for name in RUN_ENTRIES), *litter]:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()


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

    def recipe_name(self) -> str | None:
        """The recipe these seeds ran, when ``recipes run`` wrote them."""
        recipe = (read_json(self.results) or {}).get("recipe")
        return recipe.get("name") if isinstance(recipe, dict) else None


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


# ---- atomic writes ----------------------------------------------------------------------------


def read_json(path: str | Path) -> dict[str, Any] | None:
    """A JSON object file, or None when absent; invalid JSON is one error line naming the file."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise MmcseError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except UnicodeDecodeError as exc:
        raise MmcseError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if not isinstance(data, dict):
        raise MmcseError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def write_json(path: str | Path, payload: Any, *, default=None) -> Path:
    """``payload`` as indented, strict JSON (NaN and infinities, which JSON lacks, become null),
    written atomically; parent folders are created. ``default``: as :func:`json.dumps`'s."""
    text = json.dumps(finite_or_none(payload), indent=2, allow_nan=False, default=default)
    return write_text_atomically(path, text + "\n")


def write_text_atomically(path: str | Path, text: str) -> Path:
    """Write a hidden temp file beside ``path``, fsync it, rename it over ``path``: a kill leaves
    the old content or the new, never part of either."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return path


def finite_or_none(value: Any) -> Any:
    """A correlation that is undefined (constant scores) is NaN, which JSON has no word for."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(item) for item in value]
    return value


@contextmanager
def atomic_dir(target: str | Path) -> Iterator[Path]:
    """Yield a fresh hidden temp dir beside ``target``; when the block succeeds it replaces
    ``target`` (a failure removes it and leaves ``target`` as it was)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would make the checkpoint private
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = _old_dir(target)
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.rename(target, old)
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def recover_dir(target: str | Path) -> None:
    """Undo what a kill during :func:`atomic_dir` left: the previous save back, temps removed."""
    target = Path(target)
    old = _old_dir(target)
    if old.is_dir() and not target.exists():
        os.rename(old, target)
    for litter in _checkpoint_litter(target):
        shutil.rmtree(litter, ignore_errors=True)


def _old_dir(target: Path) -> Path:
    return target.parent / f".old-{target.name}"


def _checkpoint_litter(target: Path) -> list[Path]:
    """The previous save moved aside and the temp dirs of unfinished saves of ``target``."""
    if not target.parent.is_dir():
        return []
    return [_old_dir(target), *target.parent.glob(f".tmp-{target.name}-*")]


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
