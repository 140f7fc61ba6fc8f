"""Arrow IPC shard backend (the default).

One shard is one Arrow IPC *file* (random-access format) with a non-null ``id`` string column
and a ``features`` column of ``FixedSizeList<dtype>[dim]`` holding each row flattened. Reading
memory-maps the file, so a gather touches only the pages of the rows it asks for and the OS
page cache is shared by every DataLoader worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyarrow import ipc

from mmcse.errors import CacheError

SUFFIX = ".arrow"
SHAPE_KEY = "mmcse.row_shape"


def write_shard(
    path: Path, ids: list[str], rows: np.ndarray, shape: list[int] | None = None
) -> None:
    """Write ``rows`` (``[n, dim]``, already in the set's dtype) keyed by ``ids`` to ``path``;
    ``shape`` (the row shape) is kept in the schema metadata so a reader can check it."""
    width = rows.shape[1]
    values = pa.array(np.ascontiguousarray(rows).reshape(-1))
    metadata = {SHAPE_KEY: json.dumps(list(shape))} if shape is not None else None
    schema = pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("features", pa.list_(values.type, width), nullable=False),
        ],
        metadata=metadata,
    )
    batch = pa.record_batch(
        [pa.array(ids, pa.string()), pa.FixedSizeListArray.from_arrays(values, width)],
        schema=schema,
    )
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)


def open_table(path: Path) -> pa.Table:
    """The memory-mapped table of an Arrow IPC file (zero-copy; reads only the footer)."""
    try:
        return ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise CacheError(f"{path}: not a readable Arrow IPC file ({exc})") from None


class Shard:
    """A memory-mapped feature shard."""

    def __init__(self, path: Path, width: int) -> None:
        self.path = path
        self._table = open_table(path)
        if not {"id", "features"} <= set(self._table.schema.names):
            raise CacheError(f"{path}: an Arrow feature shard needs 'id' and 'features' columns")
        features = self._table.schema.field("features").type
        if not (pa.types.is_fixed_size_list(features) and features.list_size == width):
            raise CacheError(f"{path}: features column is {features}, expected {width} values/row")
        self.num_rows = self._table.num_rows
        self._width = width
        self._matrix: np.ndarray | None = None

    @property
    def table(self) -> pa.Table:
        return self._table

    @property
    def row_shape(self) -> list[int] | None:
        """The row shape recorded by the writer (None for shards written without it)."""
        raw = (self._table.schema.metadata or {}).get(SHAPE_KEY.encode())
        return json.loads(raw) if raw else None

    def read_ids(self) -> np.ndarray:
        return self._table.column("id").to_numpy().astype(str)

    def iter_rows(self, block_rows: int = 65_536):
        """``[n, width]`` blocks of the mapped rows, in order (for scans such as finiteness)."""
        rows = self._rows()
        for start in range(0, self.num_rows, block_rows):
            yield rows[start : start + block_rows]

    def take(self, local_rows: np.ndarray) -> np.ndarray:
        return self._rows()[local_rows]

    def _rows(self) -> np.ndarray:
        """``[num_rows, width]`` view onto the mapped file (a copy only if a writer outside
        mmcse split the shard into several record batches)."""
        if self._matrix is None:
            chunks = [
                chunk.flatten().to_numpy(zero_copy_only=True).reshape(len(chunk), self._width)
                for chunk in self._table.column("features").chunks
            ]
            self._matrix = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        return self._matrix
