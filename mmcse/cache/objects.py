"""Reading MCSEO's objects table (``kind='objects'``), the part of it both stages need.

Stage 1 re-encodes objects from it (``extract-objects --from-objects``); Stage 2 adds the
per-caption index and the collate on top (:class:`mmcse.methods.phrases.ObjectsTable`). Each shard is an
Arrow file with ``id``, ``features`` (the numeric :data:`~mmcse.cache.kinds.OBJECT_ROW`) and the
text columns :data:`~mmcse.cache.kinds.OBJECT_TEXT_COLUMNS`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mmcse.cache.arrow import open_table
from mmcse.cache.integrity import ensure_verified
from mmcse.cache.kinds import OBJECT_ROW, OBJECT_TEXT_COLUMNS, OBJECTS_KIND
from mmcse.cache.manifest import Manifest
from mmcse.errors import CacheError


class ObjectsColumns:
    """The objects table as columns (numeric rows under ``"row"``). Use :meth:`open`."""

    def __init__(self, path: Path, manifest: Manifest, columns: dict[str, np.ndarray]) -> None:
        self.path = path
        self.manifest = manifest
        self.fingerprint = manifest.fingerprint
        self.columns = columns

    @classmethod
    def open(cls, path: str | Path):
        path = Path(path)
        manifest = Manifest.read(path)
        if manifest.kind != OBJECTS_KIND:
            raise CacheError(f"{path} is a {manifest.kind!r} set, not an objects table")
        ensure_verified(path, manifest)
        tables = [open_table(path / shard.file) for shard in manifest.shards]
        names = ("id", *OBJECT_TEXT_COLUMNS)
        for shard, table in zip(manifest.shards, tables, strict=True):
            missing = sorted(set(names) - set(table.schema.names))
            if missing:
                raise CacheError(f"{path / shard.file}: objects table shard lacks {missing}")
        columns = {
            name: np.concatenate([t.column(name).to_numpy(zero_copy_only=False) for t in tables])
            if tables
            else np.array([], dtype=object)
            for name in names
        }
        numeric = [
            t.column("features").combine_chunks().flatten().to_numpy().reshape(-1, len(OBJECT_ROW))
            for t in tables
        ]
        columns["row"] = np.concatenate(numeric) if numeric else np.zeros((0, len(OBJECT_ROW)))
        return cls(path, manifest, columns)

    def __len__(self) -> int:
        return len(self.columns["id"])

    def mask(self, row: int) -> dict:
        return json.loads(self.columns["mask_rle"][row])
