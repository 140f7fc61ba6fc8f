"""``manifest.json``: what a feature set or corpus holds, who produced it, and its fingerprint.

The manifest is written last and atomically, so its presence is what makes a directory a set.
It has no timestamps or host names: re-running the same producer on the same inputs gives a
byte-identical manifest and therefore the same :attr:`Manifest.fingerprint`.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmcse.cache.layout import MANIFEST_NAME, PENDING_NAME, canonical_json, write_json_atomically
from mmcse.errors import CacheError

SCHEMA_VERSION = 1
BACKENDS = ("arrow", "hdf5")
CORPUS_KIND = "corpus"
CORPUS_DTYPE = "string"


@dataclass(frozen=True)
class ShardInfo:
    file: str
    num_rows: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """Everything about a set except its rows.

    ``dim`` is the number of values in one row (the product of ``shape``); rows of shape
    ``shape`` are stored flattened. ``ids_sha256`` hashes the sorted ids, so two sets over the
    same items agree on it whatever their row order. Corpora have ``kind='corpus'``, ``dim=0``,
    ``shape=[]`` and ``dtype='string'``.
    """

    kind: str
    dataset: str
    split: str
    producer: dict[str, Any]
    dim: int
    shape: list[int]
    dtype: str
    normalized: bool
    num_rows: int
    ids_sha256: str
    shards: list[ShardInfo]
    backend: str = "arrow"
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical manifest: changes whenever a row byte (through the shard
        hashes), an id, the producer or any setting changes. Runs record it and compare it."""
        return hashlib.sha256(canonical_json(self.to_dict()).encode("utf-8")).hexdigest()

    @property
    def num_bytes(self) -> int:
        return self.num_rows * self.dim * np.dtype(self.dtype).itemsize if self.dim else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, directory: Path) -> None:
        write_json_atomically(Path(directory) / MANIFEST_NAME, self.to_dict())

    @classmethod
    def read(cls, directory: str | Path) -> Manifest:
        """The manifest of ``directory``; a :class:`CacheError` saying why it is not a set."""
        directory = Path(directory)
        path = directory / MANIFEST_NAME
        if not directory.is_dir():
            raise CacheError(f"{directory}: no such feature set directory")
        if not path.is_file():
            hint = (
                " (an unfinished write: finish it with `mmcse cache finalize` or re-run it)"
                if (directory / PENDING_NAME).exists()
                else ""
            )
            raise CacheError(f"{directory} is not a feature set: it has no {MANIFEST_NAME}{hint}")
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
            return cls.from_dict(payload)
        except (ValueError, TypeError, KeyError) as exc:
            raise CacheError(f"{path} is not a valid manifest: {exc}") from None

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> Manifest:
        if payload.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {payload.get('schema_version')!r} is not {SCHEMA_VERSION} "
                "(written by another mmcse version)"
            )
        missing = sorted(set(cls.__dataclass_fields__) - set(payload))
        unknown = sorted(set(payload) - set(cls.__dataclass_fields__))
        if missing or unknown:
            raise ValueError(f"missing fields {missing}, unknown fields {unknown}")
        manifest = cls(**{**payload, "shards": [ShardInfo(**shard) for shard in payload["shards"]]})
        manifest.validate()
        return manifest

    def validate(self) -> None:
        """Internal consistency; raises ValueError naming the first inconsistency."""
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; known: {', '.join(BACKENDS)}")
        if self.kind == CORPUS_KIND:
            if (self.dim, self.shape, self.dtype) != (0, [], CORPUS_DTYPE):
                raise ValueError("a corpus has dim 0, shape [] and dtype 'string'")
        else:
            np.dtype(self.dtype)  # raises TypeError for an unknown dtype
            if math.prod(self.shape) != self.dim or self.dim <= 0:
                raise ValueError(f"shape {self.shape} does not hold dim={self.dim} values")
        if sum(shard.num_rows for shard in self.shards) != self.num_rows:
            raise ValueError(f"shard row counts do not add up to num_rows={self.num_rows}")
        if not isinstance(self.producer, dict) or not isinstance(self.extra, dict):
            raise ValueError("producer and extra must be JSON objects")
