"""Integrity of a finished set: the full check behind ``mmcse cache verify``, and the cheap
"verified once" state that lets every open of a set enforce it.

:func:`check_set` re-hashes every shard, checks each shard's own schema (dtype, values per row,
rows) against the manifest, re-reads the ids (count, uniqueness, ``ids_sha256``) and scans
float rows for NaN/Inf.

Opening a set (:func:`ensure_verified`) must not cost a re-hash of gigabytes every time, so a
successful check is recorded in ``.verified.json`` beside the manifest: the manifest's
fingerprint and, per shard, its size, mtime, ctime and inode. The next open compares those with
``os.stat`` and re-runs the full check when anything differs. Editing, replacing or restoring a
shard changes its ctime (which no user tool can set back), so it cannot keep the recorded
state; editing the manifest changes the fingerprint. A set on a read-only disk is checked on
every open (the state cannot be recorded there).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from mmcse.cache.arrow import open_table
from mmcse.cache.kinds import CORPUS_COLUMNS, CORPUS_KIND, NAN_ALLOWED_KINDS
from mmcse.cache.layout import (
    VERIFIED_NAME,
    describe_ids,
    progress,
    sha256_ids,
    shard_files,
    write_json_atomically,
)
from mmcse.cache.manifest import Manifest
from mmcse.cache.shards import open_shard
from mmcse.errors import CacheError
from mmcse.files import sha256_file

_BLOCK_ROWS = 65_536
#: states verified in this process (and inherited by forked DataLoader workers), so a
#: read-only cache, where nothing can be recorded on disk, is still checked once per process
_VERIFIED: dict[tuple[str, str], dict] = {}


def check_set(path: Path, manifest: Manifest) -> list[str]:
    """Every problem of the set at ``path`` (one line each; empty: the set is sound)."""
    problems, ids = [], []
    for info in progress(manifest.shards, f"verify {path.name}"):
        shard_path = path / info.file
        if shard_path.is_symlink() or not shard_path.is_file():
            kind = "a symlink (shards must be files of the set)" if shard_path.is_symlink() else ""
            problems.append(f"{shard_path}: {kind or 'missing'}")
            continue
        try:
            if sha256_file(shard_path) != info.sha256:
                problems.append(
                    f"{shard_path}: sha256 differs from the manifest (corrupted or replaced)"
                )
                continue
            shard_ids, bad_rows = _check_shard(shard_path, manifest, info.num_rows)
        except CacheError as exc:
            problems.append(str(exc))
            continue
        except OSError as exc:
            problems.append(f"{shard_path}: cannot read ({exc.strerror})")
            continue
        if len(bad_rows):
            problems.append(
                f"{shard_path}: {len(bad_rows)} rows hold NaN or Inf values: "
                f"{describe_ids(bad_rows)}"
            )
        ids.append(shard_ids)
    if not problems:
        problems += _check_ids(path, manifest, np.concatenate(ids) if ids else np.empty(0, str))
    listed = {info.file for info in manifest.shards}
    problems += [
        f"{shard}: shard file not listed in the manifest (left over from another write?)"
        for shard in shard_files(path).values()
        if shard.name not in listed
    ]
    return problems


def _check_shard(shard_path: Path, manifest: Manifest, num_rows: int):
    """``(ids, ids of rows holding NaN/Inf)`` of one shard after checking its schema."""
    if manifest.kind == CORPUS_KIND:
        table = open_table(shard_path)
        id_type = table.schema.field("id").type if "id" in table.schema.names else None
        if tuple(table.schema.names) != CORPUS_COLUMNS or not pa.types.is_string(id_type):
            raise CacheError(
                f"{shard_path}: columns {table.schema.names} are not a corpus table's "
                f"{list(CORPUS_COLUMNS)}"
            )
        if table.num_rows != num_rows:
            raise CacheError(f"{shard_path}: {table.num_rows} rows, manifest says {num_rows}")
        return table.column("id").to_numpy().astype(str), []
    shard = open_shard(
        shard_path, manifest.backend, manifest.dim, manifest.dtype, num_rows, manifest.shape
    )
    shard_ids = shard.read_ids()
    if len(shard_ids) != num_rows:
        raise CacheError(f"{shard_path}: {len(shard_ids)} ids, manifest says {num_rows}")
    if np.dtype(manifest.dtype).kind != "f" or manifest.kind in NAN_ALLOWED_KINDS:
        return shard_ids, []
    bad = np.concatenate(
        [nonfinite_rows(block) for block in shard.iter_rows(_BLOCK_ROWS)] or [np.empty(0, bool)]
    )
    return shard_ids, shard_ids[bad]


def nonfinite_rows(rows: np.ndarray) -> np.ndarray:
    """``[n]`` bool: rows holding a NaN or ±Inf."""
    return ~np.isfinite(rows).all(axis=1)


def _check_ids(path: Path, manifest: Manifest, ids: np.ndarray) -> list[str]:
    ordered = np.sort(ids)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if len(repeated):
        return [
            f"{path}: {len(np.unique(repeated))} ids occur more than once: "
            f"{describe_ids(np.unique(repeated))}"
        ]
    if sha256_ids(ordered.tolist()) != manifest.ids_sha256:
        return [f"{path}: ids differ from ids_sha256 in the manifest"]
    return []


# ---- the recorded verified state -------------------------------------------------------------


def ensure_verified(path: Path, manifest: Manifest) -> None:
    """Raise :class:`CacheError` unless the set would pass :func:`check_set`; cheap (a few
    ``stat`` calls) when nothing changed since the last successful check."""
    before = shard_state(path, manifest)
    key = (str(Path(path).resolve()), manifest.fingerprint)
    if before is not None and (
        _VERIFIED.get(key) == before or read_verified(path) == _record(manifest, before)
    ):
        return
    problems = check_set(path, manifest)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CacheError(
            f"{problems[0]}{more}; this set fails `mmcse cache verify {path}`: re-extract it "
            "or restore it"
        )
    record_verified(path, manifest, before)
    if before is not None:
        _VERIFIED[key] = before


def record_verified(path: Path, manifest: Manifest, before: dict | None) -> None:
    """Record a passed check, if no shard changed while it ran and the folder is writable."""
    after = shard_state(path, manifest)
    if after is None or after != before:
        return
    with contextlib.suppress(CacheError, OSError):  # read-only cache: every open re-checks
        write_json_atomically(path / VERIFIED_NAME, _record(manifest, after))


def shard_state(path: Path, manifest: Manifest) -> dict | None:
    """Per shard ``[size, mtime_ns, ctime_ns, inode]``; None if a shard cannot be stat'ed."""
    state = {}
    for info in manifest.shards:
        try:
            stat = os.stat(path / info.file, follow_symlinks=False)
        except OSError:
            return None
        state[info.file] = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]
    return state


def read_verified(path: Path) -> dict | None:
    try:
        return json.loads((path / VERIFIED_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _record(manifest: Manifest, state: dict) -> dict:
    return {"fingerprint": manifest.fingerprint, "shards": state}
