"""Checkpoints that are never half-written, marked unfinished until their run completes, resumable.

Every checkpoint directory (``best/``, ``last/``) is written into a temp directory beside it and
renamed into place (:func:`atomic_dir`), so a kill leaves either the previous save or the new one,
never a mix. A kill between the two renames leaves the previous save as ``.old-<name>``;
:func:`recover_dir` puts it back. ``mmcse_run.json`` says ``"finished": false`` until the run
completes. ``last/`` also holds ``trainer_state.pt`` — optimizer, scheduler, RNG states, data
position, logging window, best-dev bookkeeping, the auxiliary task's state — from which
``mmcse train --resume RUN_DIR`` continues exactly where the save was taken.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmcse.errors import MmcseError
from mmcse.rundir import LAST_DIR, RUN_INFO_FILE, TRAINER_STATE_FILE

#: settings a resumed run may change; any other difference from the run's config.json is refused
RESUMABLE_CHANGES = ("device", "report_to", "save_every", "output_dir", "final_eval", "eval_data")


@contextmanager
def atomic_dir(target: str | Path) -> Iterator[Path]:
    """Yield a fresh temp dir beside ``target``; when the block succeeds it replaces ``target``."""
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
    old = target.parent / f".old-{target.name}"
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.rename(target, old)
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def recover_dir(target: str | Path) -> None:
    """Undo what a kill during :func:`atomic_dir` left: the previous save back, temps removed."""
    target = Path(target)
    old = target.parent / f".old-{target.name}"
    if old.is_dir() and not target.exists():
        os.rename(old, target)
    shutil.rmtree(old, ignore_errors=True)
    for tmp in target.parent.glob(f".tmp-{target.name}-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def mark_finished(checkpoint: Path) -> None:
    """Flip ``finished`` to true in a checkpoint's run info (one atomic file replace)."""
    info_path = checkpoint / RUN_INFO_FILE
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        write_json_atomic(info_path, {**info, "finished": True})


# ---- trainer state ---------------------------------------------------------------------------


def rng_states() -> dict[str, Any]:
    states = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        cuda = states["cuda"][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(cuda)


def save_trainer_state(checkpoint: Path, state: dict[str, Any]) -> None:
    torch.save(state, checkpoint / TRAINER_STATE_FILE)


def load_trainer_state(run_dir: Path) -> dict[str, Any]:
    from mmcse.rundir import BEST_DIR

    last = Path(run_dir) / LAST_DIR
    recover_dir(last)
    recover_dir(Path(run_dir) / BEST_DIR)
    path = last / TRAINER_STATE_FILE
    if not path.is_file():
        raise MmcseError(
            f"--resume {run_dir}: no resumable checkpoint ({path} is missing); the run saved none "
            "yet (see --save-every) or it is not a training run directory"
        )
    return torch.load(path, map_location="cpu", weights_only=False)


def resume_config(run_dir: str | Path, config_file: str | None, overrides: dict[str, Any]):
    """The run's saved config with the command's settings; a setting that changes the run (and
    so the resumed metrics) is refused, naming it."""
    from mmcse.training.config import read_config_file, resolve_config

    run_dir = Path(run_dir)
    saved_path = run_dir / "config.json"
    if not saved_path.is_file():
        raise MmcseError(
            f"--resume {run_dir}: no config.json there; is it a training run directory?"
        )
    saved = read_config_file(saved_path)
    given = {**(read_config_file(config_file) if config_file else {})}
    given.update({k: v for k, v in overrides.items() if v is not None})
    changed = sorted(
        k for k, v in given.items() if k not in RESUMABLE_CHANGES and saved.get(k) != v
    )
    if changed:
        detail = ", ".join(f"{k}={given[k]!r} (run: {saved.get(k)!r})" for k in changed)
        raise MmcseError(
            f"--resume {run_dir}: the command changes the run's settings: {detail}; drop those "
            "flags to resume, or start a new run in another --output-dir"
        )
    given["output_dir"] = str(run_dir)
    return resolve_config(saved_path, **given)
