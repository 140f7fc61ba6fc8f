"""Corpus tables: the sentences (and their image ids) that Stage 2 trains on.

Same directory contract as a feature set (manifest written last, atomic Arrow shards) with
``kind='corpus'`` and columns ``id``, ``text``, ``image_id`` (nullable) and ``source``
(nullable: e.g. ``'coco'`` or ``'wiki1m'``). Features are joined to sentences by id —
``image_features.gather(corpus.image_ids)`` — never by row order.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyarrow import ipc

import mmcse
from mmcse.cache import arrow
from mmcse.cache.featureset import IdIndex, rows_or_raise
from mmcse.cache.integrity import ensure_verified
from mmcse.cache.kinds import CORPUS_COLUMNS, CORPUS_KIND
from mmcse.cache.layout import (
    MANIFEST_NAME,
    describe_ids,
    os_errors,
    publish,
    remove_stale_temp_files,
    sha256_ids,
    shard_name,
)
from mmcse.cache.manifest import CORPUS_DTYPE, Manifest, ShardInfo
from mmcse.errors import CacheError
from mmcse.files import sha256_file, temp_path

_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("image_id", pa.string()),
        pa.field("source", pa.string()),
    ]
)
assert tuple(_SCHEMA.names) == CORPUS_COLUMNS


def write_corpus(
    path: str | Path,
    ids: Sequence[str],
    texts: Sequence[str],
    image_ids: Sequence[str | None] | None = None,
    sources: Sequence[str | None] | None = None,
    *,
    dataset: str,
    split: str,
    producer: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    shard_rows: int = 1_000_000,
) -> Manifest:
    """Write a corpus table (ids unique, texts non-null) and return its manifest."""
    path = Path(path)
    columns = _checked_columns(path, ids, texts, image_ids, sources)
    if (path / MANIFEST_NAME).exists():
        raise CacheError(f"{path} already holds a finished set; remove it or write elsewhere")
    with os_errors(path, "create the folder"):
        path.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(path)
    shards = [
        _write_shard(
            path,
            index,
            {name: values[start : start + shard_rows] for name, values in columns.items()},
        )
        for index, start in enumerate(range(0, max(len(ids), 1), shard_rows))
    ]
    manifest = Manifest(
        kind=CORPUS_KIND,
        dataset=dataset,
        split=split,
        producer={"code_version": mmcse.__version__, **(producer or {})},
        dim=0,
        shape=[],
        dtype=CORPUS_DTYPE,
        normalized=False,
        num_rows=len(ids),
        ids_sha256=sha256_ids(columns["id"]),
        shards=shards,
        extra=dict(extra or {}),
    )
    manifest.validate()
    manifest.write(path)
    return manifest


def _checked_columns(path, ids, texts, image_ids, sources) -> dict[str, list]:
    columns = {
        "id": list(ids),
        "text": list(texts),
        "image_id": list(image_ids) if image_ids is not None else [None] * len(ids),
        "source": list(sources) if sources is not None else [None] * len(ids),
    }
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) != 1:
        raise CacheError(f"{path}: corpus columns differ in length: {lengths}")
    if not all(isinstance(i, str) and i for i in columns["id"]):
        raise CacheError(f"{path}: corpus ids must be non-empty strings")
    if not all(isinstance(t, str) for t in columns["text"]):
        raise CacheError(f"{path}: every corpus text must be a string")
    unique, counts = np.unique(np.asarray(columns["id"], dtype=str), return_counts=True)
    if len(unique) != len(columns["id"]):
        raise CacheError(f"{path}: duplicate corpus ids: {describe_ids(unique[counts > 1])}")
    return columns


def _write_shard(path: Path, index: int, columns: dict[str, list]) -> ShardInfo:
    final = path / shard_name(index, arrow.SUFFIX)
    temp = temp_path(final)
    try:
        table = pa.table(columns, schema=_SCHEMA)
        with (
            os_errors(final),
            pa.OSFile(str(temp), "wb") as sink,
            ipc.new_file(sink, _SCHEMA) as writer,
        ):
            writer.write_table(table)
        publish(temp, final)
    finally:
        temp.unlink(missing_ok=True)
    return ShardInfo(final.name, len(columns["id"]), sha256_file(final))


class Corpus:
    """A corpus table opened read-only (memory-mapped). Use :meth:`open`."""

    def __init__(self, path: Path, manifest: Manifest, table: pa.Table) -> None:
        self.path = path
        self.manifest = manifest
        self._table = table
        self._index: IdIndex | None = None

    @classmethod
    def open(cls, path: str | Path) -> Corpus:
        path = Path(path)
        manifest = Manifest.read(path)
        if manifest.kind != CORPUS_KIND:
            raise CacheError(f"{path} is a {manifest.kind} feature set, not a corpus")
        ensure_verified(path, manifest)
        tables = []
        for info in manifest.shards:
            table = arrow.open_table(path / info.file)
            if table.schema.names != _SCHEMA.names or table.num_rows != info.num_rows:
                raise CacheError(f"{path}: shard {info.file} does not match the manifest")
            tables.append(table)
        return cls(path, manifest, pa.concat_tables(tables))

    def __len__(self) -> int:
        return self.manifest.num_rows

    @property
    def fingerprint(self) -> str:
        return self.manifest.fingerprint

    @property
    def ids(self) -> np.ndarray:
        return self._table.column("id").to_numpy().astype(str)

    def column(self, name: str) -> np.ndarray:
        """One column as an object array (None where null), without touching the others."""
        return self._table.column(name).to_numpy(zero_copy_only=False)

    @property
    def texts(self) -> list[str]:
        return self._table.column("text").to_pylist()

    @property
    def image_ids(self) -> list[str | None]:
        return self._table.column("image_id").to_pylist()

    @property
    def sources(self) -> list[str | None]:
        return self._table.column("source").to_pylist()

    def rows_for(self, ids: Sequence[str] | np.ndarray) -> np.ndarray:
        """Row numbers of ``ids`` (:class:`MissingIdsError` naming any that are absent)."""
        if self._index is None:
            self._index = IdIndex(self.ids)
        return rows_or_raise(self._index, ids, self.path)

    def require_fingerprint(self, expected: str) -> Corpus:
        if self.fingerprint != expected:
            raise CacheError(
                f"{self.path} has fingerprint {self.fingerprint[:16]}… but the run expects "
                f"{expected[:16]}…: the corpus was rewritten since; re-run against it or restore it"
            )
        return self
