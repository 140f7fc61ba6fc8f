"""Checkpoints marked unfinished until their run completes, resumable, and checked before resuming.

Where each file lives and how a checkpoint is written without ever being half-written is
:mod:`mmcse.rundir`'s (:func:`~mmcse.files.atomic_dir`, :meth:`~mmcse.rundir.RunDir.recover`).
The run info of ``best/`` and ``last/`` says ``"finished": false`` until the run completes.
``last/`` also holds the trainer state — optimizer, scheduler, RNG states, data position,
logging window, best-dev bookkeeping, the auxiliary task's state — from which
``mmcse train --resume RUN_DIR`` continues exactly where the save was taken.

**Integrity record.** A resume trusts ``last/`` completely: a truncated file, an edited optimizer
or RNG state, another run's ``last/`` copied in, or feature sets re-extracted since would each
continue silently into a run that no uninterrupted run equals. So ``last/`` carries its own
record, ``mmcse_integrity.json`` (:attr:`mmcse.rundir.Checkpoint.integrity`), written last
inside the same temp folder as the checkpoint and renamed into place with it::

    {"format": 1,
     "step": 8,                                   the step the checkpoint was saved after
     "files": {"model.safetensors": {"bytes": 123, "sha256": "…"}, …},
                                                  every other file of last/ (hidden names aside)
     "settings": {…},                             the run's resolved TrainConfig
     "fingerprints": {"corpus:text": {"path": "…", "fingerprint": "…"}, "feature:image": …}}

Before a resume (:func:`check_resumable`, from preflight: nothing is loaded or written before
it) every file must be there with its size and sha256, nothing else may have been added, the
settings must be the run's (those in :data:`RESUMABLE_CHANGES` aside), and every corpus and
feature set must still have the fingerprint the run trained on. A ``last/`` without a record
(saved by an older mmcse) is refused: it cannot be checked.

**Finished runs.** Resuming a run that finished does nothing (:func:`finished_note`), unless a
larger ``--max-steps`` or ``--epochs`` asks to *extend* it: training continues from ``last/``
with the linear schedule recomputed for the new total (it had decayed to 0 at the old end, so
the lr rises again; the run then equals no uninterrupted run, which the plan and a warning say).
Marking ``last/`` finished saves it anew (:func:`mark_finished`), so its record stays true.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmcse.errors import MmcseError
from mmcse.files import atomic_dir, read_json, sha256_file, write_json
from mmcse.rundir import INTEGRITY_FILE, Checkpoint, RunDir, run_finished
from mmcse.training.config import (
    RESUMABLE_CHANGES,
    GivenSettings,
    read_config_file,
    resolve_config,
)
from mmcse.training.run_state import RunState

logger = logging.getLogger(__name__)

#: settings that, made larger, extend a finished run (refused on an unfinished one)
EXTENDING = ("max_steps", "epochs")
INTEGRITY_FORMAT = 1
FRESH_START = "resume from an intact copy of the run, or start a new run in another --output-dir"


# ---- trainer state ---------------------------------------------------------------------------


def rng_states() -> dict[str, Any]:
    states = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()  # pragma: cuda
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        cuda = states["cuda"][: torch.cuda.device_count()]  # pragma: cuda
        torch.cuda.set_rng_state_all(cuda)  # pragma: cuda


def trainer_state(state: RunState, updates: dict[str, Any], window: dict[str, Any]) -> dict:
    """What last/'s ``trainer_state.pt`` holds after ``state``'s step (keys in the order runs
    before issue 30 wrote them: old last/ folders resume): the updates' state (``updates``:
    ``optimizer``, ``scheduler``, ``grad_scaler``, ``aux``), the RNG states now, the loss
    window's state (``window``)."""
    return {
        "step": state.step,
        "epoch": state.epoch,
        "next_index": state.next_index,  # position in the epoch's batch order
        **{key: updates[key] for key in ("optimizer", "scheduler", "grad_scaler")},
        "rng": rng_states(),
        "window": window,
        "best_dev": state.best_dev,
        "best_step": state.best_step,
        "aux": updates["aux"],
        "eval_pending": state.eval_pending,
    }


def saved_run_state(saved: dict[str, Any]) -> RunState:
    """The run's progress a trainer state (:func:`trainer_state`) holds."""
    return RunState(
        step=saved["step"],
        epoch=saved["epoch"],
        next_index=saved["next_index"],
        best_dev=saved["best_dev"],
        best_step=saved["best_step"],
        eval_pending=saved.get("eval_pending", False),  # absent from last/ before issue 41
    )


def save_trainer_state(checkpoint: Path, state: dict[str, Any]) -> None:
    torch.save(state, Checkpoint(checkpoint).trainer_state)


def load_trainer_state(run_dir: Path) -> dict[str, Any]:
    run = RunDir(run_dir)
    run.recover()  # a kill mid-save left the previous save aside
    _require_last(run)
    return torch.load(run.last.trainer_state, map_location="cpu", weights_only=False)


def _require_last(run: RunDir) -> None:
    path = run.last.trainer_state
    if not path.is_file():
        raise MmcseError(
            f"--resume {run.path}: no resumable checkpoint ({path} is missing); the run saved "
            "none yet (see --save-every) or it is not a training run directory"
        )


# ---- the integrity record --------------------------------------------------------------------


def checkpoint_files(directory: Path) -> list[str]:
    """Every file of a checkpoint folder but its integrity record, as sorted relative POSIX
    paths; hidden names (an interrupted atomic write's temp files) are not part of it."""
    directory = Path(directory)
    names = []
    for path in directory.rglob("*"):
        relative = path.relative_to(directory)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        if relative.as_posix() != INTEGRITY_FILE:
            names.append(relative.as_posix())
    return sorted(names)


def _file_record(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def jsonable(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists, paths strings), to compare."""
    return json.loads(json.dumps(value, default=str))


def write_integrity(
    directory: Path, *, step: int, settings: dict[str, Any], fingerprints: dict[str, Any]
) -> None:
    """Record every file now in ``directory`` (call it last, inside the checkpoint's temp dir)."""
    directory = Path(directory)
    record = {
        "format": INTEGRITY_FORMAT,
        "step": step,
        "files": {name: _file_record(directory / name) for name in checkpoint_files(directory)},
        "settings": jsonable(settings),
        "fingerprints": jsonable(fingerprints),
    }
    write_json(Checkpoint(directory).integrity, record)


def read_integrity(run: RunDir) -> dict[str, Any]:
    """last/'s integrity record; refused when missing or not one."""
    path = run.last.integrity
    record = read_json(path)  # invalid JSON: one line naming the file
    if record is None:
        raise MmcseError(
            f"--resume {run.path}: {path} is missing, so last/ cannot be checked before resuming "
            "(saved by an mmcse older than integrity records, or its files were replaced); start "
            "a new run in another --output-dir (or --overwrite this one)"
        )
    parts = ("files", "settings", "fingerprints")
    if record.get("format") != INTEGRITY_FORMAT or not all(
        isinstance(record.get(k), dict) for k in parts
    ):
        raise MmcseError(
            f"{path}: not an integrity record of format {INTEGRITY_FORMAT} (an object with "
            f"'format', {', '.join(map(repr, parts))}); last/ cannot be checked; {FRESH_START}"
        )
    return record


def verify_files(checkpoint: Checkpoint, record: dict[str, Any]) -> None:
    """Every recorded file present with its size and sha256, and no file added."""
    recorded, present = record["files"], set(checkpoint_files(checkpoint.path))
    for name in sorted(set(recorded) - present):
        raise MmcseError(
            f"{checkpoint.path / name}: missing (the checkpoint wrote it); last/ is incomplete; "
            f"{FRESH_START}"
        )
    for name in sorted(present - set(recorded)):
        raise MmcseError(
            f"{checkpoint.path / name}: not part of the checkpoint (added after it was saved); "
            "remove it to resume"
        )
    for name in sorted(recorded):  # sizes first: a truncated file is found without hashing
        size, wrote = (checkpoint.path / name).stat().st_size, recorded[name].get("bytes")
        if size != wrote:
            raise MmcseError(
                f"{checkpoint.path / name}: {size} bytes, the checkpoint wrote {wrote} "
                f"(truncated or altered after the save); {FRESH_START}"
            )
    for name in sorted(recorded):
        digest, wrote = _file_record(checkpoint.path / name)["sha256"], recorded[name].get("sha256")
        if digest != wrote:
            raise MmcseError(
                f"{checkpoint.path / name}: its contents changed after the save (sha256 "
                f"{digest}, the checkpoint wrote {wrote}); resuming would not continue the run "
                f"as it was; {FRESH_START}"
            )


def verify_settings(run: RunDir, record: dict[str, Any], settings: dict[str, Any]) -> None:
    """last/ was saved by this run: its settings are the run's (resumable changes aside;
    ``max_steps``/``epochs`` too when a finished run is being extended)."""
    now, then = jsonable(settings), record["settings"]
    if now.get("pooler") == "auto":  # resolves from the same model to what the record holds
        now["pooler"] = then.get("pooler")
    if now.get("attn_implementation") == "auto":  # likewise (mmcse.students)
        now["attn_implementation"] = then.get("attn_implementation")
    if now.get("packing") is None:  # auto: resolves on the run's device to what the record holds
        now["packing"] = then.get("packing")
    skip = RESUMABLE_CHANGES + (EXTENDING if run.last.finished() else ())
    differ = sorted(k for k in set(now) | set(then) if k not in skip and now.get(k) != then.get(k))
    if differ:
        detail = ", ".join(f"{k}={then.get(k)!r} (run: {now.get(k)!r})" for k in differ)
        raise MmcseError(
            f"--resume {run.path}: {run.last.path} was saved by a run with other settings: "
            f"{detail}; it is not this run's checkpoint (copied from another run?); {FRESH_START}"
        )


def verify_fingerprints(run: RunDir, record: dict[str, Any], now: dict[str, Any]) -> None:
    """Every corpus and feature set still has the fingerprint the run trained on."""
    then = record["fingerprints"]
    for key in sorted(set(then) | set(now)):
        old = (then.get(key) or {}).get("fingerprint")
        new = (now.get(key) or {}).get("fingerprint")
        if old == new:
            continue
        path = (now.get(key) or then.get(key) or {}).get("path")
        where = f"{key} ({path})" if path else key
        if old is None or new is None:
            detail = "the run never read it" if old is None else "this resume does not read it"
            raise MmcseError(f"--resume {run.path}: {where}: {detail}; {FRESH_START}")
        raise MmcseError(
            f"--resume {run.path}: {where} changed since the run trained on it (re-extracted?): "
            f"fingerprint now {new}, the run trained on {old}; restore that set to resume, or "
            "train a new run on the new one"
        )


def check_resumable(settings: dict[str, Any], fingerprints: dict[str, Any]) -> None:
    """Refuse to resume ``settings["output_dir"]`` unless last/ is whole, this run's, and its
    corpora and feature sets are the ones it trained on (``fingerprints``: as now)."""
    run = RunDir(settings["output_dir"])
    run.recover()  # a kill mid-save left the previous save aside
    _require_last(run)
    record = read_integrity(run)
    verify_settings(run, record, settings)
    verify_files(run.last, record)
    verify_fingerprints(run, record, fingerprints)


def mark_finished(checkpoint: Checkpoint) -> None:
    """Flip ``finished`` in a checkpoint's run info. One with an integrity record is saved anew
    (its files linked into a fresh temp folder, run info and record rewritten there, renamed into
    place), so a kill leaves the old save or the new and the record always describes the files."""
    if not checkpoint.integrity.is_file():
        checkpoint.mark_finished()
        return
    record = read_json(checkpoint.integrity)
    with atomic_dir(checkpoint.path) as tmp:
        for name in checkpoint_files(checkpoint.path):
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(checkpoint.path / name, tmp / name)
        fresh = Checkpoint(tmp)
        fresh.mark_finished()  # replaces the link: the file in the old save is untouched
        run_info = fresh.run_info.relative_to(tmp).as_posix()
        record["files"][run_info] = _file_record(fresh.run_info)
        write_json(fresh.integrity, record)


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copy2(source, target)


# ---- resuming ----------------------------------------------------------------------------------


def _limit(value: int) -> float:
    """``max_steps``/``epochs`` as an upper bound (``max_steps`` 0 = no limit)."""
    return math.inf if value == 0 else value


def resume_config(run_dir: str | Path, config_file: str | None, settings: GivenSettings):
    """The run's saved config with the command's settings (``config_file`` < ``settings``, the
    flags given); a setting that changes the run (and so the resumed metrics) is refused, naming
    it. A finished run may be given a larger ``--max-steps``/``--epochs`` (see the module
    docstring)."""

    run_dir = Path(run_dir)
    run = RunDir(run_dir)
    saved_path = run.config
    if not saved_path.is_file():
        raise MmcseError(
            f"--resume {run_dir}: no {saved_path.name} there; is it a training run directory?"
        )
    if settings.values.get("overwrite"):
        raise MmcseError(
            f"--resume {run_dir} continues the run there and --overwrite would replace it: "
            "give one of them"
        )
    saved = read_config_file(saved_path)
    given = {**(read_config_file(config_file) if config_file else {}), **settings.values}
    changed = sorted(
        k for k, v in given.items() if k not in RESUMABLE_CHANGES and saved.get(k) != v
    )
    others = [k for k in changed if k not in EXTENDING]
    if others:
        detail = ", ".join(f"{k}={given[k]!r} (run: {saved.get(k)!r})" for k in others)
        raise MmcseError(
            f"--resume {run_dir}: the command changes the run's settings: {detail}; drop those "
            "flags to resume, or start a new run in another --output-dir"
        )
    if changed:
        _check_extension(run, {k: (saved.get(k), given[k]) for k in changed})
    given["output_dir"] = str(run_dir)
    return resolve_config(saved_path, GivenSettings(given))


def _check_extension(run: RunDir, changes: dict[str, tuple[Any, Any]]) -> None:
    detail = ", ".join(f"{k}={new!r} (run: {old!r})" for k, (old, new) in changes.items())
    if not run.last.finished():
        raise MmcseError(
            f"--resume {run.path}: {detail} would change the lr schedule of a run that has not "
            "finished; resume it as it is (a finished run can then be extended with a larger "
            "--max-steps or --epochs)"
        )
    smaller = [k for k, (old, new) in changes.items() if not _limit(new) > _limit(old or 0)]
    if smaller:
        raise MmcseError(
            f"--resume {run.path}: {detail} does not extend the finished run (only a larger "
            "--max-steps or --epochs does; max_steps 0 means no limit)"
        )


def aborted_note(run: RunDir, state: RunState, total: int) -> str:
    """What an interrupted exit that did not stop at a step boundary (``state``: where it
    was) leaves to resume from: the step last/ holds (none: say so)."""
    info = run.last.read_info()
    if not info:
        return (
            f"interrupted at step {state.step}; no last/ was saved, nothing to resume: "
            "start the run again (--overwrite)"
        )
    saved = info.get("step", "?")
    left = " (the final evaluation is left)" if saved == total else ""
    return (
        f"interrupted at step {state.step} of {total}; last/ holds step {saved}{left}. "
        f"Continue with: mmcse train --resume {run.path}"
    )


def interrupted_note(run: RunDir, state: RunState, total: int) -> str:
    """What a run stopped after ``state``'s step, last/ saved there, says."""
    redo = (
        "; its dev evaluation was cut short and --resume runs it first"
        if state.eval_pending
        else ""
    )
    return (
        f"interrupted after step {state.step} of {total}; last/ saved{redo}. "
        f"Continue with: mmcse train --resume {run.path}"
    )


def finished_note(settings: dict[str, Any]) -> str | None:
    """What to say instead of training when ``settings`` resume a finished run without
    extending it; None when there is training to do."""
    run = RunDir(settings["output_dir"])
    info = run.last.read_info() or run.best.read_info()  # last/ removed at the end: best/'s
    if not run_finished(info):
        return None
    ran = info.get("config") if isinstance(info.get("config"), dict) else {}
    if not run.last.saved() and any(
        settings.get(k) != ran.get(k, settings.get(k)) for k in EXTENDING
    ):
        raise MmcseError(
            f"--resume {run.path}: the run finished and its last/ was removed "
            "(--drop-last-dir): it cannot be extended; train a new run"
        )
    if any(settings.get(k) != ran.get(k, settings.get(k)) for k in EXTENDING):
        return None  # a larger --max-steps/--epochs: extend it
    results = run.results if run.results.is_file() else None
    where = f"; its STS test results are in {results}" if results else ""
    return (
        f"{run.path} finished at step {info.get('step')} of {info.get('total_steps')}{where}: "
        "nothing to resume (to train it longer, resume with a larger --max-steps or --epochs)"
    )


def extension_of(settings: dict[str, Any]) -> dict[str, Any] | None:
    """``{"step", "max_steps", "epochs"}`` of the finished run ``settings`` extend, else None."""
    run = RunDir(settings["output_dir"])
    info = run.last.read_info()
    if not run_finished(info):
        return None
    ran = info.get("config") or {}
    return {"step": info.get("step"), **{k: ran.get(k) for k in EXTENDING}}
