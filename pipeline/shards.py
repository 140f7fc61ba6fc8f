"""Stage 1's resumable shard loop: the one owner of skip-done, progress and write-each-shard-once.

Every extraction command (``extract-images``/``-texts``, ``extract-objects`` and its re-encode,
``extract-image-tensors``/``-audio``) cuts its sorted work list into fixed shards
(:class:`ShardPlan`) and calls :func:`run_shards` with what differs: when a shard counts as done,
the batches that compute the missing ones, and how one finished shard is written. The loop skips
the shards already done, shows one progress bar over the rows it computes, and writes each shard
once, in order, as soon as its last batch arrived; so a run killed at any moment and rerun computes
only what is missing. Refusing a rerun whose settings changed stays with the writer
(:class:`~mmcse.cache.FeatureSetWriter` checks its ``.pending.json``) before the loop starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


@dataclass(frozen=True)
class ShardPlan:
    """Fixed shard boundaries over a sorted work list of ``num_items``."""

    num_items: int
    shard_size: int

    @property
    def num_shards(self) -> int:
        return max(1, math.ceil(self.num_items / self.shard_size))

    def rows(self, shard: int) -> range:
        start = shard * self.shard_size
        return range(start, min(start + self.shard_size, self.num_items))

    def batches(self, shard: int, batch_size: int) -> list[range]:
        rows = self.rows(shard)
        return [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]

    def shards_for_rank(self, rank: int, world_size: int) -> list[int]:
        return [k for k in range(self.num_shards) if k % world_size == rank]


def run_shards(
    plan: ShardPlan,
    shards: Sequence[int],
    *,
    batch_size: int,
    done: Callable[[int], bool],
    batches: Callable[[list[int]], Iterable[tuple[int, Sequence[int], T]]],
    write: Callable[[int, list[T]], None],
    desc: str,
    unit: str,
    progress: bool = True,
) -> list[int]:
    """Compute and write the shards of ``shards`` that are not ``done``; the ones written.

    ``batches(pending)`` yields ``(shard, rows, result)`` for the pending shards in order, each
    shard's rows as ``plan.batches(shard, batch_size)`` cuts them (a stream, so a DataLoader may
    prefetch across shards); ``write(shard, results)`` stores one whole shard. A shard with no
    rows is written with no results."""
    pending = [k for k in shards if not done(k)]
    total = sum(len(plan.rows(k)) for k in pending)
    stream = iter(batches(pending))
    with tqdm(total=total, desc=desc, unit=unit, disable=not progress or not total) as bar:
        for shard in pending:
            results = []
            for expected in plan.batches(shard, batch_size):
                got_shard, rows, result = next(stream, (None, (), None))
                if got_shard != shard or list(rows) != list(expected):
                    raise RuntimeError(
                        f"batch of shard {got_shard} rows {list(rows)[:3]}… arrived where shard "
                        f"{shard} rows {list(expected)[:3]}… were due"
                    )
                results.append(result)
                bar.update(len(rows))
            write(shard, results)
    return pending
