"""Gather throughput of a feature set: the rate Stage 2 can pull cached teacher rows.

The synthetic set is written shard by shard (each shard's random rows generated, written and
dropped), so a 1M × 2048 float16 set (4 GiB) never sits in memory. Timings are of a warm page
cache — the steady state of training on a set that fits in RAM — and include the one-off id
index build separately.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from mmcse.bench.timing import timed, timed_result
from mmcse.cache.featureset import FeatureSet
from mmcse.cache.layout import progress
from mmcse.cache.writer import FeatureSetWriter

_GENERATE_ROWS = 16_384  # rows generated at a time inside one shard (bounds float32 scratch)


def gather_throughput(
    num_rows: int = 1_000_000,
    dim: int = 2048,
    dtype: str = "float16",
    batch: int = 128,
    num_shards: int = 16,
    num_batches: int = 200,
    backend: str = "arrow",
    seed: int = 0,
    directory: str | Path | None = None,
) -> dict[str, float]:
    """Write a synthetic set under a temp dir (in ``directory``), then time ``num_batches``
    random ``batch``-row gathers by id and by row number. Returns rates and one-off costs."""
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-", dir=directory) as temp:
        path = Path(temp) / "set"
        write_s = timed(
            lambda: _write_synthetic(path, num_rows, dim, dtype, num_shards, backend, rng)
        )
        # the first open verifies the whole set and records it; later opens read that record
        verify_open_s = timed(lambda: FeatureSet.open(path))
        features, open_s = timed_result(lambda: FeatureSet.open(path))
        # builds the id index once, as the first training batch would
        index_s = timed(lambda: features.rows_for(["0"]))

        batches = rng.integers(0, num_rows, size=(num_batches, batch))
        id_batches = [[str(row) for row in rows] for rows in batches]
        by_ids_s = timed(lambda: [features.gather(ids) for ids in id_batches])
        by_rows_s = timed(lambda: [features.take(rows) for rows in batches])
    rows = num_batches * batch
    return {
        "rows_per_s": rows / by_ids_s,
        "rows_per_s_by_rows": rows / by_rows_s,
        "write_s": write_s,
        "verify_open_s": verify_open_s,
        "open_s": open_s,
        "index_build_s": index_s,
        "num_rows": num_rows,
        "dim": dim,
        "batch": batch,
    }


def _write_synthetic(path, num_rows, dim, dtype, num_shards, backend, rng) -> None:
    writer = FeatureSetWriter(
        path,
        kind="synthetic",
        dim=dim,
        dtype=dtype,
        dataset="synthetic",
        split="bench",
        producer={"teacher": "numpy.random"},
        backend=backend,
    )
    bounds = np.linspace(0, num_rows, num_shards + 1).astype(np.int64)
    for index in progress(range(num_shards), "bench: write synthetic set"):
        start, stop = bounds[index], bounds[index + 1]
        rows = np.empty((stop - start, dim), dtype)
        for offset in range(0, len(rows), _GENERATE_ROWS):
            block = rows[offset : offset + _GENERATE_ROWS]
            block[:] = rng.standard_normal(block.shape, dtype=np.float32)
        writer.write_shard(index, [str(i) for i in range(start, stop)], rows)
    writer.finalize(num_shards=num_shards)
