"""Checkpoints marked unfinished until their run completes, and resumable.

Where each file lives and how a checkpoint is written without ever being half-written is
:mod:`mmcse.rundir`'s (:func:`~mmcse.rundir.atomic_dir`, :meth:`~mmcse.rundir.RunDir.recover`).
The run info of ``best/`` and ``last/`` says ``"finished": false`` until the run completes.
``last/`` also holds the trainer state — optimizer, scheduler, RNG states, data position,
logging window, best-dev bookkeeping, the auxiliary task's state — from which
``mmcse train --resume RUN_DIR`` continues exactly where the save was taken.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmcse.errors import MmcseError
from mmcse.rundir import Checkpoint, RunDir

#: settings a resumed run may change; any other difference from the run's config is refused
RESUMABLE_CHANGES = ("device", "report_to", "save_every", "output_dir", "final_eval", "eval_data")




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
    torch.save(state, Checkpoint(checkpoint).trainer_state)


def load_trainer_state(run_dir: Path) -> dict[str, Any]:
    run = RunDir(run_dir)
    run.recover()  # a kill mid-save left the previous save aside
    path = run.last.trainer_state
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
    saved_path = RunDir(run_dir).config
    if not saved_path.is_file():
        raise MmcseError(
            f"--resume {run_dir}: no {saved_path.name} there; is it a training run directory?"
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
