"""``manifest.json``: what a feature set or corpus holds, who produced it, and its fingerprint.

The manifest is written last and atomically, so its presence is what makes a directory a set.
It has no timestamps or host names: re-running the same producer on the same inputs gives a
byte-identical manifest and therefore the same :attr:`Manifest.fingerprint`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmcse.cache.kinds import CORPUS_KIND
from mmcse.cache.layout import (
    MANIFEST_NAME,
    PENDING_NAME,
    canonical_json,
    is_shard_name,
    shard_name,
    write_json_atomically,
)
from mmcse.errors import CacheError

SCHEMA_VERSION = 1
BACKENDS = ("arrow", "hdf5")
SUFFIXES = {"arrow": ".arrow", "hdf5": ".h5"}
CORPUS_DTYPE = "string"
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: the JSON type of every manifest field (bool is not an int here)
_FIELD_TYPES: dict[str, type] = {
    "kind": str,
    "dataset": str,
    "split": str,
    "producer": dict,
    "dim": int,
    "shape": list,
    "dtype": str,
    "normalized": bool,
    "num_rows": int,
    "ids_sha256": str,
    "shards": list,
    "backend": str,
    "extra": dict,
    "schema_version": int,
}
_SHARD_TYPES: dict[str, type] = {"file": str, "num_rows": int, "sha256": str}


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

    def provenance(self) -> dict[str, Any]:
        """Who produced the rows, for a run's record (``teachers`` in its run info): the
        producer's ``teacher``, ``weights`` (default / random / path), ``weights_source``,
        ``weights_sha256``, ``revision`` and compute ``dtype`` (null where the producer did not
        record one), the stored ``stored_dtype``, ``kind``, ``dataset``, ``split``, the set's
        ``fingerprint`` and the whole ``producer``."""
        producer = self.producer
        named = ("teacher", "weights", "weights_source", "weights_sha256", "revision")
        return {
            **{key: producer.get(key) for key in named},
            "dtype": producer.get("compute_dtype"),
            "stored_dtype": self.dtype,
            "kind": self.kind,
            "dataset": self.dataset,
            "split": self.split,
            "fingerprint": self.fingerprint,
            "producer": producer,
        }

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
            with open(path, encoding="utf-8") as handle:
                payload = json.load(handle)
        except OSError as exc:
            raise CacheError(f"{path}: cannot read ({exc.strerror})") from None
        except ValueError as exc:
            raise CacheError(f"{path} is not a valid manifest: not JSON ({exc})") from None
        try:
            return cls.from_dict(payload)
        except (ValueError, TypeError, KeyError) as exc:
            raise CacheError(f"{path} is not a valid manifest: {exc}") from None

    @classmethod
    def from_dict(cls, payload: Any) -> Manifest:
        """A manifest from its JSON form; ``ValueError`` naming the first field that is wrong."""
        if not isinstance(payload, dict):
            raise ValueError(f"expected a JSON object, got a JSON {_json_type(payload)}")
        version = payload.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {version!r} is not {SCHEMA_VERSION} "
                "(written by another mmcse version; re-extract the set with this one)"
            )
        missing = sorted(set(cls.__dataclass_fields__) - set(payload))
        unknown = sorted(set(payload) - set(cls.__dataclass_fields__))
        if missing or unknown:
            raise ValueError(f"missing fields {missing}, unknown fields {unknown}")
        _check_types(payload, _FIELD_TYPES, "")
        shards = []
        for n, shard in enumerate(payload["shards"]):
            if not isinstance(shard, dict) or set(shard) != set(_SHARD_TYPES):
                raise ValueError(f"shards[{n}] must be an object with keys {sorted(_SHARD_TYPES)}")
            _check_types(shard, _SHARD_TYPES, f"shards[{n}].")
            shards.append(ShardInfo(**shard))
        if not all(
            isinstance(size, int) and not isinstance(size, bool) for size in payload["shape"]
        ):
            raise ValueError(f"shape must be a list of integers, got {payload['shape']!r}")
        manifest = cls(**{**payload, "shards": shards})
        manifest.validate()
        return manifest

    def validate(self) -> None:
        """Internal consistency; raises ValueError naming the first inconsistency."""
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; known: {', '.join(BACKENDS)}")
        if self.kind == CORPUS_KIND:
            if (self.dim, self.shape, self.dtype, self.backend) != (0, [], CORPUS_DTYPE, "arrow"):
                raise ValueError("a corpus has dim 0, shape [], dtype 'string' and backend arrow")
        else:
            try:
                dtype = np.dtype(self.dtype)
            except TypeError:
                raise ValueError(f"unknown dtype {self.dtype!r}") from None
            if dtype.kind not in "biuf" or dtype.name != self.dtype:
                raise ValueError(f"dtype {self.dtype!r} is not a numeric feature dtype")
            if math.prod(self.shape) != self.dim or self.dim <= 0:
                raise ValueError(f"shape {self.shape} does not hold dim={self.dim} values")
        self._validate_shard_names()
        if self.num_rows < 0 or any(shard.num_rows < 0 for shard in self.shards):
            raise ValueError("row counts must not be negative")
        if sum(shard.num_rows for shard in self.shards) != self.num_rows:
            raise ValueError(f"shard row counts do not add up to num_rows={self.num_rows}")
        for name, digest in [("ids_sha256", self.ids_sha256)] + [
            (f"sha256 of {shard.file}", shard.sha256) for shard in self.shards
        ]:
            if not _SHA256.fullmatch(digest):
                raise ValueError(f"{name} is not a sha256 hex digest: {digest!r}")
        if not isinstance(self.producer, dict) or not isinstance(self.extra, dict):
            raise ValueError("producer and extra must be JSON objects")

    def _validate_shard_names(self) -> None:
        """Shards are the set's own files ``shard-00000…`` in index order: a path that leaves
        the set (``../``, absolute) or a reordered list is refused."""
        suffix = SUFFIXES[self.backend]
        for index, shard in enumerate(self.shards):
            if not is_shard_name(shard.file) or not shard.file.endswith(suffix):
                raise ValueError(
                    f"shards[{index}].file {shard.file!r} is not one of this set's {suffix} "
                    "shards (shard paths must be plain names inside the set directory)"
                )
            if shard.file != shard_name(index, suffix):
                raise ValueError(
                    f"shards[{index}] is {shard.file!r}, expected {shard_name(index, suffix)!r} "
                    "(shards listed out of order)"
                )


def _check_types(payload: dict, types: dict[str, type], prefix: str) -> None:
    for key, expected in types.items():
        value = payload[key]
        wrong_bool = expected is int and isinstance(value, bool)
        if not isinstance(value, expected) or wrong_bool:
            raise ValueError(
                f"{prefix}{key} must be a JSON {_json_type(expected())}, "
                f"got {_json_type(value)} {value!r:.60}"
            )


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list"}
    names.update({dict: "object", type(None): "null"})
    return names.get(type(value), type(value).__name__)
