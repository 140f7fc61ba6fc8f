"""Writing a feature set: atomic shards, then the manifest last.

Contract
--------
* ``write_shard(index, ids, values)`` writes the whole shard to a hidden temp file and renames
  it to ``shard-{index:05d}.arrow`` (or ``.h5``) in one step. A file under a shard name is
  therefore always complete; a crash leaves at most a hidden ``.shard-*.tmp-*`` file, which
  readers ignore and :meth:`FeatureSetWriter.finalize` deletes.
* ``finalize()`` lists the shard files present, in index order, hashes them, checks that ids
  are unique across the set, and writes ``manifest.json`` last (atomically). Until then the
  directory is not a feature set and :meth:`FeatureSet.open` refuses it.

Several ranks, one set
----------------------
Ranks (or separate jobs) each construct a ``FeatureSetWriter`` on the *same* directory with the
same settings and write disjoint shard indices chosen by the caller (e.g. shard ``k`` holds
items ``k*S:(k+1)*S`` and rank ``r`` of ``W`` writes shards ``r, r+W, r+2W, …``). The first
writer records its settings in ``.pending.json``; a writer whose settings differ is refused, so
shards of two different teachers cannot be mixed. After all ranks are done (a barrier), one
rank calls ``finalize(num_shards=K)``, which insists on exactly shards ``0..K-1`` — a missing
rank shows up as an error, not as a silently smaller set. ``mmcse cache finalize DIR`` does
the same from the shell (:meth:`FeatureSetWriter.reopen`).

Resume: :meth:`has_shard` is true only for a renamed shard that opens and has a readable
footer, so a restarted job skips exactly the finished shards.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import mmcse
from mmcse.cache.kinds import CORPUS_KIND
from mmcse.cache.layout import (
    MANIFEST_NAME,
    PENDING_NAME,
    canonical_json,
    describe_ids,
    is_temp_file,
    os_errors,
    progress,
    publish,
    remove_stale_temp_files,
    sha256_ids,
    shard_files,
    shard_name,
    write_json_atomically,
)
from mmcse.cache.manifest import BACKENDS, Manifest, ShardInfo
from mmcse.cache.shards import SHARD_WRITERS, open_shard
from mmcse.errors import CacheError
from mmcse.files import sha256_file, temp_path

_NORM_TOLERANCE = 1e-2  # float16 rounding alone moves a unit norm by ~1e-3


class FeatureSetWriter:
    """Writes one feature set; see the module docstring for the shard and rank contract.

    ``dim`` is the number of values per row; ``shape`` (default ``[dim]``) is the row shape
    (e.g. ``[3, 224, 224]`` for uint8 images; rows are stored flattened). ``producer`` names
    what made the rows (``teacher``, ``weights_sha256`` or ``revision``, ``preprocessing``;
    ``code_version`` defaults to mmcse's version).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        kind: str,
        dim: int,
        dtype: str,
        dataset: str,
        split: str,
        producer: dict[str, Any],
        normalized: bool = False,
        backend: str = "arrow",
        shape: Sequence[int] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self._settings = _checked_settings(
            kind=kind,
            dim=int(dim),
            dtype=dtype,
            dataset=dataset,
            split=split,
            producer={"code_version": mmcse.__version__, **producer},
            normalized=normalized,
            backend=backend,
            shape=[int(size) for size in shape] if shape is not None else [int(dim)],
            extra=dict(extra or {}),
        )
        if (self.path / MANIFEST_NAME).exists():
            raise CacheError(
                f"{self.path} already holds a finished set; remove it (`mmcse cache rm`) "
                "or write elsewhere"
            )
        with os_errors(self.path, "create the folder"):
            self.path.mkdir(parents=True, exist_ok=True)
        remove_stale_temp_files(self.path)
        self._claim_directory()
        self._suffix, self._write = SHARD_WRITERS[backend]

    @classmethod
    def reopen(cls, path: str | Path) -> FeatureSetWriter:
        """The writer whose shards sit unfinished in ``path`` (to finalize from another process)."""
        pending = Path(path) / PENDING_NAME
        if not pending.is_file():
            raise CacheError(f"{path}: no unfinished feature set here (no {PENDING_NAME})")
        return cls(path, **_read_json(pending))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._settings["dtype"])

    def shard_path(self, index: int) -> Path:
        return self.path / shard_name(index, self._suffix)

    def has_shard(self, index: int) -> bool:
        """True iff shard ``index`` was completely written (renamed and readable)."""
        try:
            self._open_shard(self.shard_path(index))
        except (CacheError, OSError):
            return False
        return True

    def shard_num_rows(self, index: int) -> int:
        """Rows of the finished shard ``index`` (its footer only)."""
        return self._open_shard(self.shard_path(index)).num_rows

    def write_shard(self, index: int, ids: Sequence[str], values: Any) -> Path:
        """Atomically write rows ``values`` (``[n, *shape]`` or ``[n, dim]``; numpy or CPU/GPU
        torch) keyed by ``ids`` as shard ``index``; replaces a shard of that index."""
        if not isinstance(index, int | np.integer) or index < 0:
            raise CacheError(f"shard index must be a non-negative int, got {index!r}")
        ids = _checked_ids(ids)
        rows = self._checked_rows(values, ids)
        final = self.shard_path(int(index))
        temp = temp_path(final)
        try:
            with os_errors(final):
                self._write(temp, ids, rows, self._settings["shape"])
            publish(temp, final)
        finally:
            temp.unlink(missing_ok=True)
        return final

    def finalize(
        self,
        extra: dict[str, Any] | None = None,
        num_shards: int | None = None,
        allow_empty: bool = False,
    ):
        """Check every shard present, then write the manifest; returns the :class:`Manifest`.

        ``extra`` is merged into the writer's extra (e.g. skipped/error counts known only at
        the end). With ``num_shards``, exactly shards ``0..num_shards-1`` must be present. A set
        of 0 rows is refused unless ``allow_empty`` (e.g. no object was detected at all).
        """
        files = self._shard_files(num_shards)
        shards, ids = [], []
        for path in progress(files, f"finalize {self.path.name}"):
            shard = self._open_shard(path)
            ids.append(shard.read_ids())
            shards.append(ShardInfo(path.name, shard.num_rows, sha256_file(path)))
        all_ids = np.concatenate(ids)
        if len(all_ids) == 0 and not allow_empty:
            raise CacheError(
                f"{self.path}: every shard is empty; a set with 0 rows is not written "
                "(were all inputs left out? check the input paths)"
            )
        _refuse_duplicates(all_ids, self.path)
        settings = {**self._settings, "extra": {**self._settings["extra"], **(extra or {})}}
        manifest = Manifest(
            **settings, num_rows=len(all_ids), ids_sha256=sha256_ids(all_ids), shards=shards
        )
        manifest.validate()
        manifest.write(self.path)
        (self.path / PENDING_NAME).unlink(missing_ok=True)
        for leftover in filter(is_temp_file, self.path.iterdir()):
            leftover.unlink(missing_ok=True)
        return manifest

    def _open_shard(self, path: Path):
        settings = self._settings
        return open_shard(
            path, settings["backend"], settings["dim"], settings["dtype"], shape=settings["shape"]
        )

    def _claim_directory(self) -> None:
        """Record the settings for other ranks, or check ours against theirs."""
        pending = self.path / PENDING_NAME
        if not pending.exists():
            write_json_atomically(pending, self._settings)
        theirs = _read_json(pending)
        if theirs != self._settings:
            differing = sorted(k for k in self._settings if theirs.get(k) != self._settings[k])
            raise CacheError(
                f"{self.path} holds unfinished shards written with other settings (differs in "
                f"{', '.join(differing)}); remove it (`mmcse cache rm`) or write elsewhere"
            )

    def _shard_files(self, num_shards: int | None) -> list[Path]:
        present = shard_files(self.path)
        foreign = [p.name for p in present.values() if p.suffix != self._suffix]
        if foreign:
            raise CacheError(f"{self.path}: shards of another backend present: {foreign[:3]}")
        expected = num_shards if num_shards is not None else max(present, default=-1) + 1
        missing = sorted(set(range(expected)) - set(present))
        if missing or expected == 0:
            raise CacheError(
                f"{self.path}: cannot finalize, shards missing: {missing[:10]}"
                if missing
                else f"{self.path}: cannot finalize a set without shards"
            )
        extra = sorted(set(present) - set(range(expected)))
        if extra:
            raise CacheError(f"{self.path}: shards beyond num_shards={num_shards}: {extra[:5]}")
        return [present[index] for index in range(expected)]

    def _checked_rows(self, values: Any, ids: list[str]) -> np.ndarray:
        rows = _to_numpy(values)
        shape, dim = tuple(self._settings["shape"]), self._settings["dim"]
        if rows.shape[:1] != (len(ids),) or rows.shape[1:] not in (shape, (dim,)):
            raise CacheError(
                f"{self.path}: got values of shape {rows.shape} for {len(ids)} ids; "
                f"rows must have shape {list(shape)} (or [{dim}] flattened)"
            )
        if rows.dtype.kind == "f" and self.dtype.kind in "iu":
            raise CacheError(f"{self.path}: refusing to cast float values to {self.dtype}")
        with np.errstate(over="ignore"):  # an overflow becomes inf, refused just below
            rows = rows.reshape(len(ids), dim).astype(self.dtype, copy=False)
        if self.dtype.kind == "f":
            self._check_finite(rows, ids)
        if self._settings["normalized"]:
            self._check_unit_norm(rows, ids)
        return rows

    def _check_finite(self, rows: np.ndarray, ids: list[str]) -> None:
        bad = ~np.isfinite(rows).all(axis=1)
        if bad.any():
            bad_ids = np.asarray(ids)[bad]
            raise CacheError(
                f"{self.path}: non-finite values in {self.dtype} for {len(bad_ids)} rows "
                f"(overflow or NaN): {describe_ids(bad_ids)}"
            )

    def _check_unit_norm(self, rows: np.ndarray, ids: list[str]) -> None:
        norms = np.linalg.norm(rows.astype(np.float32), axis=1)
        bad = np.abs(norms - 1) > _NORM_TOLERANCE
        if bad.any():
            bad_ids = np.asarray(ids)[bad]
            raise CacheError(
                f"{self.path}: normalized=True but {len(bad_ids)} rows do not have unit norm: "
                f"{describe_ids(bad_ids)}"
            )


def remove_finished_leftovers(path: str | Path) -> None:
    """Delete the writer state a finished set no longer needs: ``.pending.json`` and temp files
    of dead writers, left when a writer was killed between writing the manifest and cleaning
    up (the manifest alone makes the set complete, so nothing of value goes)."""
    path = Path(path)
    if not (path / MANIFEST_NAME).is_file():
        return
    with os_errors(path / PENDING_NAME, "remove"):
        (path / PENDING_NAME).unlink(missing_ok=True)
    remove_stale_temp_files(path)


def settings_mismatch(manifest: Manifest, **settings: Any) -> list[str]:
    """How a finished set's manifest differs from the :class:`FeatureSetWriter` settings a
    command would write it with (``"dtype: float32 in the set, float16 asked"``; empty: same).
    Keys of ``extra`` the command does not set (e.g. error counts) are not compared."""
    wanted = _checked_settings(
        **{
            "normalized": False,
            "backend": "arrow",
            "extra": {},
            **settings,
            "producer": {"code_version": mmcse.__version__, **settings["producer"]},
            "shape": [int(size) for size in settings.get("shape") or [settings["dim"]]],
            "dim": int(settings["dim"]),
        }
    )
    have = manifest.to_dict()
    differences = []
    for key, value in wanted.items():
        if key == "extra":
            differences += [
                f"extra.{k}: {have['extra'].get(k)!r} in the set, {v!r} asked"
                for k, v in value.items()
                if have["extra"].get(k) != v
            ]
        elif key == "producer":
            differences += [
                f"producer.{k}: {have['producer'].get(k)!r} in the set, {value.get(k)!r} asked"
                for k in sorted(set(value) | set(have["producer"]))
                if have["producer"].get(k) != value.get(k)
            ]
        elif have.get(key) != value:
            differences.append(f"{key}: {have.get(key)!r} in the set, {value!r} asked")
    return differences


def write_feature_set(
    path: str | Path, ids: Sequence[str], values: Any, shard_rows: int = 100_000, **meta: Any
) -> Manifest:
    """Write a whole set in one call (``meta``: the :class:`FeatureSetWriter` settings)."""
    writer = FeatureSetWriter(path, **meta)
    ids = _checked_ids(ids)
    starts = range(0, len(ids), shard_rows)
    for index, start in enumerate(starts):
        writer.write_shard(
            index, ids[start : start + shard_rows], values[start : start + shard_rows]
        )
    return writer.finalize(num_shards=len(starts))


def _checked_settings(**settings: Any) -> dict[str, Any]:
    if settings["kind"] == CORPUS_KIND:
        raise CacheError("write corpora with write_corpus, not FeatureSetWriter")
    if settings["backend"] not in BACKENDS:
        raise CacheError(f"unknown backend {settings['backend']!r}; known: {', '.join(BACKENDS)}")
    try:
        np.dtype(settings["dtype"])
    except TypeError:
        raise CacheError(f"unknown dtype {settings['dtype']!r}") from None
    settings["dtype"] = np.dtype(settings["dtype"]).name
    if math.prod(settings["shape"]) != settings["dim"] or settings["dim"] <= 0:
        raise CacheError(f"shape {settings['shape']} does not hold dim={settings['dim']} values")
    try:  # a JSON round trip now, so ranks compare exactly what .pending.json stores
        return json.loads(canonical_json(settings))
    except TypeError as exc:
        raise CacheError(f"producer and extra must be JSON-serialisable: {exc}") from None


def _checked_ids(ids: Sequence[str]) -> list[str]:
    ids = [str(i) if isinstance(i, np.str_) else i for i in ids]
    wrong = [i for i in ids if not isinstance(i, str) or not i]
    if wrong:
        raise CacheError(f"ids must be non-empty strings; got {describe_ids(wrong)}")
    return ids


def _refuse_duplicates(ids: np.ndarray, where: Path) -> None:
    unique, counts = np.unique(ids, return_counts=True)
    if len(unique) != len(ids):
        duplicated = unique[counts > 1]
        raise CacheError(
            f"{where}: {len(duplicated)} ids occur more than once: {describe_ids(duplicated)}"
        )


def _to_numpy(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, possibly on GPU or in bfloat16
        values = values.detach().cpu()
        if str(values.dtype) == "torch.bfloat16":
            values = values.float()
        return values.numpy()
    return np.asarray(values)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise CacheError(f"{path}: unreadable ({exc})") from None
