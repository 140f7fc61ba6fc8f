"""Whole-set operations behind ``mmcse cache``: verify, list, remove, merge.

``merge`` combines finished sets of the same producer (e.g. one per extraction job) into a new
set; ranks writing *one* set share a directory instead (see :mod:`mmcse.cache.writer`).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmcse.cache.arrow import open_table
from mmcse.cache.featureset import SHARD_READERS, FeatureSet
from mmcse.cache.layout import (
    MANIFEST_NAME,
    PENDING_NAME,
    is_layout_file,
    progress,
    publish,
    sha256_file,
    sha256_ids,
    shard_files,
    temp_path,
)
from mmcse.cache.manifest import CORPUS_KIND, Manifest
from mmcse.cache.writer import FeatureSetWriter
from mmcse.errors import CacheError

# Fields that must agree for sets to be merged (rows of one producer, one layout).
_MERGE_KEYS = ("kind", "dataset", "split", "producer", "dim", "shape", "dtype", "normalized")


def verify(path: str | Path) -> list[str]:
    """Re-hash every shard and re-count rows and ids; one problem per line (empty: all good)."""
    path = Path(path)
    try:
        manifest = Manifest.read(path)
    except CacheError as exc:
        return [str(exc)]
    problems, ids = [], []
    for info in progress(manifest.shards, f"verify {path.name}"):
        shard_path = path / info.file
        if not shard_path.is_file():
            problems.append(f"{shard_path}: missing")
            continue
        if sha256_file(shard_path) != info.sha256:
            problems.append(
                f"{shard_path}: sha256 differs from the manifest (corrupted or replaced)"
            )
            continue
        try:
            shard_ids = _shard_ids(shard_path, manifest)
        except CacheError as exc:
            problems.append(str(exc))
            continue
        if len(shard_ids) != info.num_rows:
            problems.append(f"{shard_path}: {len(shard_ids)} rows, manifest says {info.num_rows}")
        ids.append(shard_ids)
    if not problems and sha256_ids(np.concatenate(ids) if ids else []) != manifest.ids_sha256:
        problems.append(f"{path}: ids differ from ids_sha256 in the manifest")
    listed = {info.file for info in manifest.shards}
    problems += [
        f"{shard}: shard file not listed in the manifest (left over from another write?)"
        for shard in shard_files(path).values()
        if shard.name not in listed
    ]
    return problems


def _shard_ids(shard_path: Path, manifest: Manifest) -> np.ndarray:
    if manifest.kind == CORPUS_KIND:
        return open_table(shard_path).column("id").to_numpy().astype(str)
    return SHARD_READERS[manifest.backend](shard_path, manifest.dim).read_ids()


@dataclass(frozen=True)
class CacheEntry:
    """A set directory under a cache root; ``manifest`` is None for an unfinished write."""

    path: Path
    manifest: Manifest | None
    num_bytes: int


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
            manifest = _manifest_or_none(directory)
            size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
            entries.append(CacheEntry(directory, manifest, size))
            found.add(directory)
    return entries


def _manifest_or_none(directory: Path) -> Manifest | None:
    try:
        return Manifest.read(directory)
    except CacheError:
        return None


def remove(path: str | Path) -> None:
    """Delete a set (finished or unfinished); refuses any directory holding other files."""
    path = Path(path)
    if not path.is_dir():
        raise CacheError(f"{path}: no such directory")
    files = list(path.iterdir())
    if not any(f.name in (MANIFEST_NAME, PENDING_NAME) for f in files):
        raise CacheError(
            f"{path} is not a feature set or corpus (no {MANIFEST_NAME}); not removing"
        )
    foreign = [f.name for f in files if not (f.is_file() and is_layout_file(f))]
    if foreign:
        raise CacheError(f"{path} also holds files no writer made ({foreign[:3]}); not removing")
    # The manifest goes first, so an interrupted removal leaves an invalid set, never a partial one.
    for name in (MANIFEST_NAME, PENDING_NAME):
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
            shutil.copyfile(feature_set.path / info.file, temp)
            publish(temp, target)
            index += 1
    return writer.finalize(num_shards=index)
