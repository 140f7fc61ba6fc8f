"""Importing external HDF5 feature files (as MCSE-era code wrote) into feature sets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmcse.cache.hdf5 import Shard
from mmcse.cache.layout import progress
from mmcse.cache.manifest import Manifest
from mmcse.cache.writer import FeatureSetWriter


def import_hdf5(
    source: str | Path,
    destination: str | Path,
    *,
    ids_key: str = "ids",
    features_key: str = "features",
    shard_rows: int = 100_000,
    **meta: Any,
) -> Manifest:
    """Copy an external HDF5 feature file (``ids`` + ``features`` datasets) into a feature set
    at ``destination``, streaming (the file may be larger than memory); ``meta`` are
    :class:`~mmcse.cache.FeatureSetWriter` settings (``dim`` and ``dtype`` default to the
    file's)."""
    shard = Shard(Path(source), None, ids_key, features_key)
    meta.setdefault("dim", shard.width)
    meta.setdefault("dtype", shard.dtype.name)
    writer = FeatureSetWriter(destination, **meta)
    starts = range(0, shard.num_rows, shard_rows)
    for index, start in enumerate(progress(starts, f"import {Path(source).name}")):
        ids, rows = shard.read_block(start, min(start + shard_rows, shard.num_rows))
        writer.write_shard(index, ids, rows)
    return writer.finalize(num_shards=len(starts))
