"""Bad inputs of an extraction run: per-shard sidecars, merged into ``errors.jsonl`` at finalize.

Each shard's bad inputs are written (atomically) *before* the shard itself, so a shard on disk
always has its sidecar and a resumed run keeps the errors of shards it skips. Rows are sorted, so
the merged file is byte-identical however the run was interrupted or split across ranks.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from mmcse.cache.layout import (
    os_errors,
    remove_stale_temp_files,
)
from mmcse.files import write_text_atomically
from pipeline.datasets.base import RecordError

ERRORS_FILE = "errors.jsonl"
SIDECAR_DIR = ".errors"
LOADER_PART = "captions"  # rows the dataset loader could not read


def sidecar_path(out: Path, part: str, shard: int | None = None) -> Path:
    name = f"{part}.jsonl" if shard is None else f"{part}-shard-{shard:05d}.jsonl"
    return out / SIDECAR_DIR / name


def write_sidecar(path: Path, errors: Iterable[RecordError]) -> None:
    _write_atomically(path, _lines(errors))


def _write_atomically(path: Path, text: str) -> None:
    with os_errors(path):
        write_text_atomically(path, text)


def read_sidecar(path: Path) -> list[RecordError]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [RecordError(r["id"], r["path"], r["reason"]) for r in rows]


def read_parts(out: Path, part: str, num_shards: int) -> list[RecordError]:
    """The errors of one feature set: every shard's sidecar."""
    return [e for k in range(num_shards) for e in read_sidecar(sidecar_path(out, part, k))]


def error_counts(errors: Iterable[RecordError]) -> dict:
    """For the manifest extra: how many inputs were left out, and why."""
    errors = list(errors)
    return {"num_errors": len(errors), "errors_by_reason": dict(sorted(_reasons(errors).items()))}


def merge_errors(out: Path) -> Path:
    """Rewrite ``out/errors.jsonl`` from every sidecar (one JSON object per bad input)."""
    rows = []
    for sidecar in sorted((out / SIDECAR_DIR).glob("*.jsonl")):
        part = sidecar.stem.split("-shard-")[0]
        rows += [{"stage": part, **e.to_dict()} for e in read_sidecar(sidecar)]
    target = out / ERRORS_FILE
    _write_atomically(target, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return target


def remove_stale_temp_files_under(out: Path) -> None:
    """Temp files of killed runs (this host, dead pid) in ``out``, its sets and ``.errors``."""
    if not out.is_dir():
        return
    for folder in [out, *(p for p in out.iterdir() if p.is_dir() and not p.is_symlink())]:
        remove_stale_temp_files(folder)


def _lines(errors: Iterable[RecordError]) -> str:
    ordered = sorted(errors, key=lambda e: (e.id, e.path, e.reason))
    return "".join(json.dumps(e.to_dict(), sort_keys=True) + "\n" for e in ordered)


#: where a reason names its line or row first (``line 7: blank``): not part of its kind
_WHERE = re.compile(r"^(?:line|row) \d+: ")


def reason_kind(reason: str) -> str:
    """``"corrupt image: <PIL detail>"`` → ``"corrupt image"``, ``"line 7: blank"`` →
    ``"blank"``: what a count of reasons counts by."""
    return _WHERE.sub("", reason).split(":")[0]


def _reasons(errors: list[RecordError]) -> Counter:
    return Counter(reason_kind(e.reason) for e in errors)


def summarize_errors(out: Path) -> str | None:
    """The console line for ``out/errors.jsonl``: how many inputs were left out, by stage and
    reason, counted from the file itself (so the summary and the file always agree); None
    when nothing was left out."""
    path = out / ERRORS_FILE
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    if not rows:
        return None
    counts = Counter((row.get("stage", "?"), reason_kind(row["reason"])) for row in rows)
    shown = ", ".join(f"{n} {stage} ({why})" for (stage, why), n in sorted(counts.items()))
    return f"left out: {len(rows)} in all, every one in {path}: {shown}"
