"""Reading a feature set: memory-mapped shards, vectorised gathers by row or by id.

Opening checks the set against its manifest (:func:`mmcse.cache.integrity.ensure_verified`: a
full check the first time, then a few ``stat`` calls while no shard changes) and maps each
shard; the rows are never copied. The id
index (ids sorted once, then :func:`numpy.searchsorted` per batch) is built on the first
lookup by id. A gather maps global rows to ``(shard, local row)`` with one ``searchsorted`` on
the shard offsets and does one fancy-indexed take per shard it touches — no Python loop over
rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mmcse.cache.integrity import ensure_verified
from mmcse.cache.kinds import CORPUS_KIND
from mmcse.cache.layout import describe_ids
from mmcse.cache.manifest import Manifest
from mmcse.cache.shards import SHARD_READERS, open_shard
from mmcse.errors import CacheError, MissingIdsError

__all__ = ["SHARD_READERS", "FeatureSet", "IdIndex", "rows_or_raise"]


class IdIndex:
    """Id → row lookup over a fixed id array, vectorised with a sorted copy."""

    def __init__(self, ids: np.ndarray) -> None:
        self._order = np.argsort(ids, kind="stable")
        self._sorted = ids[self._order]

    def find(self, query: Sequence[str] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, found)``: ``rows[i]`` is the row of ``query[i]`` wherever ``found[i]``."""
        query = np.asarray(query, dtype=str)
        if len(self._sorted) == 0:
            return np.zeros(len(query), np.int64), np.zeros(len(query), bool)
        positions = np.searchsorted(self._sorted, query).clip(max=len(self._sorted) - 1)
        found = self._sorted[positions] == query
        return self._order[positions].astype(np.int64), found


def rows_or_raise(index: IdIndex, ids: Sequence[str], where: Path) -> np.ndarray:
    rows, found = index.find(ids)
    if not found.all():
        missing = np.asarray(ids, dtype=str)[~found]
        raise MissingIdsError(
            f"{len(missing)} of {len(found)} ids are not in {where}: {describe_ids(missing)}"
        )
    return rows


class FeatureSet:
    """A finished feature set, opened read-only. Use :meth:`open`."""

    def __init__(self, path: Path, manifest: Manifest, shards: list) -> None:
        self.path = path
        self.manifest = manifest
        self._shards = shards
        self._offsets = np.cumsum([0] + [shard.num_rows for shard in shards], dtype=np.int64)
        self._ids: np.ndarray | None = None
        self._index: IdIndex | None = None

    @classmethod
    def open(cls, path: str | Path) -> FeatureSet:
        """The set at ``path``; a :class:`CacheError` if it would fail ``mmcse cache verify``."""
        path = Path(path)
        manifest = Manifest.read(path)
        if manifest.kind == CORPUS_KIND:
            raise CacheError(f"{path} is a corpus, not a feature set; open it with Corpus.open")
        ensure_verified(path, manifest)
        shards = [
            open_shard(
                path / info.file, manifest.backend, manifest.dim, manifest.dtype, info.num_rows
            )
            for info in manifest.shards
        ]
        return cls(path, manifest, shards)

    def __reduce__(self):
        # Memory maps do not pickle: a spawned DataLoader worker re-opens the set by path.
        return (FeatureSet.open, (self.path,))

    def __len__(self) -> int:
        return self.manifest.num_rows

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"FeatureSet({str(self.path)!r}, kind={m.kind!r}, rows={m.num_rows}, "
            f"shape={m.shape}, dtype={m.dtype})"
        )

    @property
    def dim(self) -> int:
        return self.manifest.dim

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.manifest.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.manifest.dtype)

    @property
    def fingerprint(self) -> str:
        return self.manifest.fingerprint

    @property
    def ids(self) -> np.ndarray:
        """All ids in row order (read on first use: O(rows))."""
        if self._ids is None:
            parts = [shard.read_ids() for shard in self._shards]
            self._ids = np.concatenate(parts) if parts else np.empty(0, str)
        return self._ids

    def require_fingerprint(self, expected: str) -> FeatureSet:
        """Refuse a set whose content or producer changed since a run recorded ``expected``."""
        if self.fingerprint != expected:
            raise CacheError(
                f"{self.path} has fingerprint {self.fingerprint[:16]}… but the run expects "
                f"{expected[:16]}…: the set was rewritten since; re-run against it or restore it"
            )
        return self

    def rows_for(self, ids: Sequence[str] | np.ndarray) -> np.ndarray:
        """Row numbers (int64) of ``ids``; :class:`MissingIdsError` if any is absent."""
        if self._index is None:
            self._index = IdIndex(self.ids)
        return rows_or_raise(self._index, ids, self.path)

    def take(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """Rows ``[n, *shape]`` in the order asked (repeats allowed)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise CacheError(f"{self.path}: row numbers must lie in [0, {len(self)})")
        out = np.empty((len(rows), self.dim), self.dtype)
        shard_of = np.searchsorted(self._offsets, rows, side="right") - 1
        for shard in np.unique(shard_of):
            selected = shard_of == shard
            local = rows[selected] - self._offsets[shard]
            out[selected] = self._shards[shard].take(local)
        return out.reshape(len(rows), *self.shape)

    def gather(self, ids: Sequence[str] | np.ndarray) -> np.ndarray:
        """Rows ``[n, *shape]`` for ``ids``, in their order."""
        return self.take(self.rows_for(ids))
