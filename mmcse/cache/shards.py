"""One entry point to every shard backend: open a shard and check it against its manifest.

A manifest says what its shards hold (rows, dtype, values per row); each shard file carries its
own schema (Arrow) or dataset metadata (HDF5). :func:`open_shard` refuses a shard whose own
schema disagrees, so an edited manifest (``dtype`` or ``shape`` changed) never reinterprets
the bytes of a shard.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from mmcse.cache import arrow, hdf5
from mmcse.errors import CacheError

SHARD_READERS = {"arrow": arrow.Shard, "hdf5": hdf5.Shard}
SHARD_WRITERS = {
    "arrow": (arrow.SUFFIX, arrow.write_shard),
    "hdf5": (hdf5.SUFFIX, hdf5.write_shard),
}


def open_shard(
    path: Path,
    backend: str,
    dim: int,
    dtype: str,
    num_rows: int | None = None,
    shape: list[int] | None = None,
):
    """The shard reader of ``path``, after checking its own schema: values per row, dtype,
    row shape (if the shard records it) and the row count the manifest records."""
    shard = SHARD_READERS[backend](path, dim)
    if shape is not None and shard.row_shape is not None and list(shape) != shard.row_shape:
        raise CacheError(
            f"{path}: the shard holds rows of shape {shard.row_shape}, the manifest says "
            f"{list(shape)} (manifest edited; run `mmcse cache verify`)"
        )
    stored = shard_dtype(shard)
    if stored != np.dtype(dtype):
        raise CacheError(
            f"{path}: the shard stores {stored.name} values, the manifest says {dtype} "
            "(manifest edited or shard replaced; run `mmcse cache verify`)"
        )
    if num_rows is not None and shard.num_rows != num_rows:
        raise CacheError(
            f"{path}: the shard has {shard.num_rows} rows, the manifest says {num_rows} "
            "(run `mmcse cache verify`)"
        )
    return shard


def shard_dtype(shard) -> np.dtype:
    if isinstance(shard, arrow.Shard):
        ids = shard.table.schema.field("id").type
        if not (pa.types.is_string(ids) or pa.types.is_large_string(ids)):
            raise CacheError(f"{shard.path}: id column is {ids}, expected strings")
        value_type = shard.table.schema.field("features").type.value_type
        try:
            return np.dtype(value_type.to_pandas_dtype())
        except (NotImplementedError, TypeError):
            raise CacheError(f"{shard.path}: features hold {value_type} values") from None
    return np.dtype(shard.dtype)
