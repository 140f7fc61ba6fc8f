"""Whole-set operations behind ``mmcse cache``: verify, list, remove, merge.

``merge`` combines finished sets of the same producer (e.g. one per extraction job) into a new
set; ranks writing *one* set share a directory instead (see :mod:`mmcse.cache.writer`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mmcse.cache.featureset import FeatureSet
from mmcse.cache.integrity import check_set, record_verified, shard_state
from mmcse.cache.layout import (
    MANIFEST_NAME,
    PENDING_NAME,
    VERIFIED_NAME,
    is_layout_file,
    os_errors,
    publish,
)
from mmcse.cache.manifest import Manifest
from mmcse.cache.writer import FeatureSetWriter
from mmcse.errors import CacheError
from mmcse.files import temp_path

logger = logging.getLogger(__name__)

# Fields that must agree for sets to be merged (rows of one producer, one layout).
_MERGE_KEYS = ("kind", "dataset", "split", "producer", "dim", "shape", "dtype", "normalized")


def verify(path: str | Path) -> list[str]:
    """Re-hash every shard, check each shard's schema, re-count rows and ids and scan for
    NaN/Inf; one problem per line (empty: all good, and recorded so opens stay cheap)."""
    path = Path(path)
    try:
        manifest = Manifest.read(path)
    except CacheError as exc:
        return [str(exc)]
    before = shard_state(path, manifest)
    problems = check_set(path, manifest)
    if not problems:
        record_verified(path, manifest, before)
    return problems


def verify_tree(root: str | Path) -> dict[Path, list[str]]:
    """Problems of every set under ``root`` (``root`` itself may be a set); an unfinished
    write counts as a problem. Raises :class:`CacheError` if ``root`` holds no set at all."""
    root = Path(root)
    if (root / MANIFEST_NAME).exists():
        return {root: verify(root)}
    entries = list_sets(root)
    if not entries:
        raise CacheError(f"{root}: no feature set or corpus found under it (no {MANIFEST_NAME})")
    return {
        entry.path: verify(entry.path) if entry.manifest is not None else [entry.problem]
        for entry in entries
    }


def verify_report(root: str | Path) -> str:
    """``mmcse cache verify``: an ``ok:`` line per sound set under ``root``; else the first problem
    as a :class:`CacheError`, with the sound sets and the other problems logged before it."""
    results = verify_tree(root)
    ok = []
    for path, found in results.items():
        if not found:
            m = Manifest.read(path)
            ok.append(
                f"ok: {path} ({m.num_rows} rows, {len(m.shards)} shards, "
                f"fingerprint {m.fingerprint})"
            )
    problems = [problem for found in results.values() for problem in found]
    if not problems:
        return "\n".join(ok)
    for line in ok:
        logger.info(line)
    for problem in problems[1:]:
        logger.error(f"  also: {problem}")
    more = f" (+{len(problems) - 1} more above)" if len(problems) > 1 else ""
    raise CacheError(problems[0] + more)


@dataclass(frozen=True)
class CacheEntry:
    """A set directory under a cache root; ``manifest`` is None for an unfinished write or an
    invalid manifest, and ``problem`` then says which."""

    path: Path
    manifest: Manifest | None
    num_bytes: int
    problem: str | None = None


def list_sets(root: str | Path) -> list[CacheEntry]:
    """Finished and unfinished sets under ``root`` (sets are not searched inside)."""
    root = Path(root)
    if not root.is_dir():
        raise CacheError(f"{root}: no such cache directory")
    entries, found = [], set()
    for directory in sorted(p for p in [root, *root.rglob("*")] if p.is_dir()):
        if found.intersection(directory.parents):
            continue
        if (directory / MANIFEST_NAME).is_file() or (directory / PENDING_NAME).is_file():
            manifest, problem = _manifest_or_problem(directory)
            size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
            entries.append(CacheEntry(directory, manifest, size, problem))
            found.add(directory)
    return entries


def _manifest_or_problem(directory: Path) -> tuple[Manifest | None, str | None]:
    if not (directory / MANIFEST_NAME).is_file():
        return None, f"{directory}: unfinished write (no {MANIFEST_NAME} yet)"
    try:
        return Manifest.read(directory), None
    except CacheError as exc:
        return None, str(exc)


def remove(path: str | Path) -> None:
    """Delete a set (finished or unfinished); refuses a symlink and any directory holding other
    files. Everything is checked before the first file is deleted."""
    path = Path(path)
    if path.is_symlink():
        raise CacheError(
            f"{path} is a symbolic link; not following it into another set (remove the link "
            f"itself with `rm {path}`, or pass the set's own path)"
        )
    if not path.is_dir():
        raise CacheError(f"{path}: no such directory")
    files = list(path.iterdir())
    if not any(f.name in (MANIFEST_NAME, PENDING_NAME) for f in files):
        raise CacheError(
            f"{path} is not a feature set or corpus (no {MANIFEST_NAME}); not removing"
        )
    foreign = [f.name for f in files if f.is_symlink() or not (f.is_file() and is_layout_file(f))]
    if foreign:
        raise CacheError(
            f"{path} also holds files no writer made or links ({foreign[:3]}); not removing"
        )
    for folder in (path, path.parent):
        if not os.access(folder, os.W_OK | os.X_OK):
            raise CacheError(f"{folder}: not writable, cannot remove {path}; nothing was deleted")
    # The manifest goes first, so an interrupted removal leaves an invalid set, never a partial one.
    with os_errors(path, "remove"):
        for name in (MANIFEST_NAME, VERIFIED_NAME, PENDING_NAME):
            (path / name).unlink(missing_ok=True)
        for file in path.iterdir():
            file.unlink()
        path.rmdir()


def merge(sources: Sequence[str | Path], destination: str | Path) -> Manifest:
    """A new set at ``destination`` holding the shards of ``sources`` in the order given.

    The sources must agree on kind, dataset, split, producer, shape, dtype and normalisation;
    ids must stay unique. Each source's ``extra`` is kept under ``extra['merged_from']``.
    """
    sets = [FeatureSet.open(source) for source in sources]
    if not sets:
        raise CacheError("merge needs at least one source set")
    first = sets[0].manifest
    for other in sets[1:]:
        differing = [k for k in _MERGE_KEYS if getattr(other.manifest, k) != getattr(first, k)]
        if differing:
            raise CacheError(
                f"cannot merge {other.path} into {sets[0].path}: they differ in {', '.join(differing)}"
            )
    writer = FeatureSetWriter(
        destination,
        **{key: getattr(first, key) for key in _MERGE_KEYS},
        backend=first.backend,
        extra={
            "merged_from": [{"fingerprint": s.fingerprint, "extra": s.manifest.extra} for s in sets]
        },
    )
    index = 0
    for feature_set in sets:
        for info in feature_set.manifest.shards:
            target = writer.shard_path(index)
            temp = temp_path(target)
            try:
                with os_errors(target):
                    shutil.copyfile(feature_set.path / info.file, temp)
                publish(temp, target)
            finally:
                temp.unlink(missing_ok=True)
            index += 1
    return writer.finalize(num_shards=index)
