"""HDF5 shard backend, for reading and writing HDF5 feature files (as MCSE-era code wrote).

A shard is an ``.h5`` file with an ``ids`` dataset (strings; integer ids such as COCO image
ids are read as their decimal strings) and a ``features`` dataset ``[n, ...]`` whose rows are
flattened on read. mmcse writes ``features`` contiguous and uncompressed, which lets reads
memory-map it like an Arrow shard; chunked or compressed files written elsewhere are read
through h5py (one sorted read per gather).

:mod:`pipeline.hdf5_import` (``mmcse import-hdf5``) imports MCSE's released files, which carry no ids.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from mmcse.errors import CacheError

SUFFIX = ".h5"
SHAPE_ATTR = "mmcse_row_shape"


def write_shard(
    path: Path, ids: list[str], rows: np.ndarray, shape: list[int] | None = None
) -> None:
    """Write ``rows`` (``[n, dim]``) keyed by ``ids`` (``shape``, the row shape, goes into an
    attribute); ``track_times=False`` keeps reruns byte-identical."""
    with h5py.File(path, "w") as handle:
        handle.create_dataset(
            "ids", data=np.array(ids, dtype=object), dtype=h5py.string_dtype(), track_times=False
        )
        features = handle.create_dataset("features", data=rows, track_times=False)
        if shape is not None:
            features.attrs[SHAPE_ATTR] = np.asarray(shape, dtype=np.int64)


class Shard:
    """One HDF5 file read as ``ids`` + flattened ``features`` rows."""

    def __init__(
        self, path: Path, width: int | None, ids_key: str = "ids", features_key: str = "features"
    ) -> None:
        self.path = path
        try:
            with h5py.File(path, "r") as handle:
                features, ids = handle[features_key], handle[ids_key]
                shape, dtype, id_count = features.shape, features.dtype, ids.shape[0]
                offset = features.id.get_offset()
                recorded = features.attrs.get(SHAPE_ATTR)
                mappable = features.chunks is None and features.compression is None
        except (OSError, KeyError) as exc:
            raise CacheError(
                f"{path}: not a readable HDF5 shard with {ids_key!r} and {features_key!r} "
                f"datasets ({exc})"
            ) from None
        self.num_rows = shape[0]
        self.width = int(np.prod(shape[1:], dtype=np.int64))
        if width is not None and self.width != width:
            raise CacheError(f"{path}: rows hold {self.width} values, expected {width}")
        if id_count != self.num_rows:
            raise CacheError(f"{path}: {id_count} ids for {self.num_rows} feature rows")
        self.dtype = dtype
        self.row_shape = [int(size) for size in recorded] if recorded is not None else None
        self._keys = (ids_key, features_key)
        # An empty dataset has no storage (offset None) but then nothing needs mapping either.
        self._offset = offset if mappable else None
        self._matrix: np.ndarray | None = None

    def read_ids(self) -> np.ndarray:
        with h5py.File(self.path, "r") as handle:
            ids = handle[self._keys[0]]
            if ids.dtype.kind in "SOU":
                return np.asarray(ids.asstr()[:], dtype=str)
            return ids[:].astype(str)

    def take(self, local_rows: np.ndarray) -> np.ndarray:
        if self._offset is not None or self.num_rows == 0:
            return self._rows()[local_rows]
        # h5py fancy indexing wants increasing unique indices: read those, then re-expand.
        unique, inverse = np.unique(local_rows, return_inverse=True)
        with h5py.File(self.path, "r") as handle:
            block = handle[self._keys[1]][unique]
        return block.reshape(len(unique), self.width)[inverse]

    def iter_rows(self, block_rows: int = 65_536):
        """``[n, width]`` blocks of the rows, in order (for scans such as finiteness)."""
        for start in range(0, self.num_rows, block_rows):
            stop = min(start + block_rows, self.num_rows)
            if self._offset is not None:
                yield self._rows()[start:stop]
            else:
                yield self.read_block(start, stop)[1]

    def read_block(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Ids and flattened rows ``start:stop`` (a scan of a file that cannot be mapped)."""
        with h5py.File(self.path, "r") as handle:
            ids, features = handle[self._keys[0]], handle[self._keys[1]]
            id_block = ids.asstr()[start:stop] if ids.dtype.kind in "SOU" else ids[start:stop]
            rows = features[start:stop].reshape(stop - start, self.width)
        return np.asarray(id_block).astype(str), rows

    def _rows(self) -> np.ndarray:
        if self._matrix is None:
            shape = (self.num_rows, self.width)
            if self.num_rows == 0:
                self._matrix = np.empty(shape, self.dtype)
            else:
                self._matrix = np.memmap(
                    self.path, self.dtype, mode="r", offset=self._offset, shape=shape
                )
        return self._matrix
