"""Loading Hugging Face models and tokenizers: local directories, run directories, hub ids.

A local directory (or a training run, which resolves to its ``best/`` checkpoint) always loads;
a hub id resolves when the machine is online or has it cached (``HF_HUB_OFFLINE=1`` keeps every
load local). Both stages load through here: Stage-1 teachers and the Stage-2 student.
"""

from __future__ import annotations

from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.rundir import BEST_DIR


def quiet_transformers() -> None:
    """Silence per-load progress bars and advisory warnings (our own progress is shown)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def resolve_model_dir(path_or_id: str) -> str:
    """A training run directory resolves to its best checkpoint; anything else is returned as is."""
    p = Path(path_or_id)
    if (p / BEST_DIR / "config.json").exists():
        return str(p / BEST_DIR)
    if p.exists() and not (p / "config.json").exists():
        raise MmcseError(
            f"{path_or_id} is neither an HF model directory (no config.json) nor a training run "
            f"(no {BEST_DIR}/config.json)"
        )
    return path_or_id


def load_tokenizer(path_or_id: str):
    from transformers import AutoTokenizer

    quiet_transformers()
    return AutoTokenizer.from_pretrained(resolve_model_dir(path_or_id))
