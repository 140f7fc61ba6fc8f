"""Loading Hugging Face models and tokenizers: local directories, run directories, hub ids.

A local directory (or a training run, which resolves to its ``best/`` checkpoint:
:func:`mmcse.rundir.resolve_model_dir`) always loads;
a hub id resolves when the machine is online or has it cached (``HF_HUB_OFFLINE=1`` keeps every
load local). Both stages load through here: Stage-1 teachers and the Stage-2 student.
"""

from __future__ import annotations

from mmcse.rundir import resolve_model_dir


def quiet_transformers() -> None:
    """Silence per-load progress bars and advisory warnings (our own progress is shown)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_tokenizer(path_or_id: str):
    from transformers import AutoTokenizer

    quiet_transformers()
    return AutoTokenizer.from_pretrained(resolve_model_dir(path_or_id))
