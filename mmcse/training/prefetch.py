"""The next batch is gathered on a worker thread while the current step runs.

Gathering is a row ``take`` from memory-mapped features plus an int32 → int64 copy of the token
ids: host work that would otherwise sit between two steps. One batch ahead is enough (the gather
is much shorter than a step). On CUDA the gathered tensors are pinned on the worker, so the copy
to the device is issued ``non_blocking`` and overlaps the previous step's kernels. No RNG is
drawn here, so a run's random stream is the same with or without prefetching.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from mmcse.training.data import Batch

CPU = torch.device("cpu")


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Copy a host batch to ``device`` without waiting (its tensors are pinned on CUDA)."""
    if device.type == "cpu":
        return batch
    move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
    return dataclasses.replace(
        batch,
        input_ids=move(batch.input_ids),
        attention_mask=move(batch.attention_mask),
        features={role: move(t) for role, t in batch.features.items()},
    )


def pin(batch: Batch) -> Batch:
    return dataclasses.replace(
        batch,
        input_ids=batch.input_ids.pin_memory(),
        attention_mask=batch.attention_mask.pin_memory(),
        features={role: t.pin_memory() for role, t in batch.features.items()},
    )


def prefetched(
    items: Iterable[Any], gather: Callable[[Any], Batch], device: torch.device
) -> Iterator[tuple[Any, Batch, float]]:
    """``(item, batch on device, seconds waited for it)`` with the next item gathered meanwhile."""
    pinned = device.type == "cuda"

    def host_batch(item: Any) -> Batch:
        batch = gather(item)
        return pin(batch) if pinned else batch

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmcse-prefetch")
    try:
        it = iter(items)
        pending = next(((item, pool.submit(host_batch, item)) for item in it), None)
        while pending is not None:
            item, future = pending
            started = time.perf_counter()
            batch = to_device(future.result(), device)
            waited = time.perf_counter() - started
            pending = next(((nxt, pool.submit(host_batch, nxt)) for nxt in it), None)
            yield item, batch, waited
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
