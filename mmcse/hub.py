"""Loading Hugging Face models and tokenizers: local directories, run directories, hub ids.

A local directory (or a training run, which resolves to its ``best/`` checkpoint:
:func:`mmcse.rundir.resolve_model_dir`) always loads. This module owns the rule that tells a local
path from a hub id (:func:`missing_path_message`): a name that reads as a local path (it holds a
path separator the way no hub id does, starts with ``.`` or ``~``, or its first folder exists
here) but does not exist is refused at once, naming it, never sent to the hub. A hub id resolves when it is cached or the
hub can be reached: :func:`check_hub_id` says which in at most a 3 s probe (``HF_HUB_OFFLINE=1``
keeps every load local), so an offline machine gets one clear line, not the hub client's
retries. Both stages load through here: Stage-1 teachers and the Stage-2 student.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.rundir import resolve_model_dir

HUB_PROBE_SECONDS = 3.0
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
TRUE_WORDS = ("1", "true", "yes", "on")
#: what a hub id looks like: ``name`` or ``org/name`` (a local path can look like one too)
HUB_ID = re.compile(r"[\w][\w.-]*(/[\w][\w.-]*)?")


def quiet_transformers() -> None:
    """Silence per-load progress bars and advisory warnings (our own progress is shown)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_tokenizer(path_or_id: str):
    """The model's tokenizer (transformers' fast one, from its ``tokenizer.json``; a folder that
    ships only a SentencePiece model, as some DeBERTa-v3 checkpoints do, is converted, which
    needs the ``sentencepiece`` package: refused in one line naming it when it is missing)."""
    from transformers import AutoTokenizer

    quiet_transformers()
    source = local_or_hub_id(path_or_id)
    try:
        return AutoTokenizer.from_pretrained(source)
    except (ImportError, ValueError):  # transformers then asks for tiktoken, a wrong lead
        if not needs_sentencepiece(source):
            raise
        raise MmcseError(
            f"{path_or_id}: its tokenizer ships as a SentencePiece model only (no "
            "tokenizer.json); converting it needs `pip install sentencepiece`"
        ) from None


def needs_sentencepiece(folder: str | Path) -> bool:
    """A local tokenizer folder with a SentencePiece ``*.model`` and no ``tokenizer.json``, on a
    machine without the ``sentencepiece`` package that converts it."""
    import importlib.util

    folder = Path(folder)
    return (
        folder.is_dir()
        and not (folder / "tokenizer.json").is_file()
        and any(folder.glob("*.model"))
        and importlib.util.find_spec("sentencepiece") is None
    )


def local_or_hub_id(path_or_id: str | Path) -> str:
    """:func:`~mmcse.rundir.resolve_model_dir` (a run → its best checkpoint), after refusing a
    name that reads as a local path but does not exist (:func:`missing_path_message`)."""
    text = str(path_or_id)
    if not Path(text).expanduser().exists():
        problem = missing_path_message(text)
        if problem:
            raise MmcseError(problem)
    return resolve_model_dir(text)


def missing_path_message(text: str) -> str | None:
    """Why ``text``, which names nothing on disk, cannot be a model: None for a hub id.

    It is a local path, not a hub id, when it is not spelled like one (it starts with ``.``,
    ``~`` or ``/``, holds a backslash, two ``/`` or a trailing one, ...) or when its first
    folder exists here (``runs/mcse-flikr`` when ``runs/`` does)."""
    parts = Path(text).expanduser().parts
    path_like = not HUB_ID.fullmatch(text) or (len(parts) > 1 and Path(parts[0]).is_dir())
    if not path_like:
        return None
    missing = Path(text).expanduser()
    while missing.parent != missing and not missing.parent.exists():
        missing = missing.parent
    parent = missing.parent
    where = f"; {parent} has no {missing.name!r}" if str(parent) not in (".", "/") else ""
    return f"{text}: no such folder (a local path, not a hub id){where}"


def resolve_model_source(path_or_id: str | Path, flag: str = "--model") -> str:
    """:func:`local_or_hub_id`, and for a hub id :func:`check_hub_id`: what ``from_pretrained``
    can load now, or one error line naming ``flag`` and the argument."""
    source = local_or_hub_id(path_or_id)
    if not Path(source).exists():
        check_hub_id(source, flag)
    return source


def check_hub_id(name: str, flag: str = "--model") -> Path | None:
    """The cached config of hub id ``name``, or None when the hub answers (it will download);
    refused at once when it is neither cached nor reachable."""
    from huggingface_hub import constants, try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return Path(cached)
    fix = f"download it where there is network, or pass {flag} DIR (a local HF model folder)"
    offline = [v for v in OFFLINE_VARIABLES if _env_true(v)]
    if offline:
        raise MmcseError(
            f"{flag} {name}: not a local folder, not in the Hugging Face cache, and "
            f"{offline[0]} is set; {fix}"
        )
    host = re.sub(r"^https?://", "", constants.ENDPOINT).split("/")[0]
    try:
        socket.create_connection((host, 443), timeout=HUB_PROBE_SECONDS).close()
    except OSError as exc:
        raise MmcseError(
            f"{flag} {name}: not a local folder, not in the Hugging Face cache, and {host} "
            f"cannot be reached ({exc.strerror or exc}); {fix}"
        ) from None
    return None


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in TRUE_WORDS
