"""The next batch is gathered and copied to the device while the current step runs.

Gathering is a row ``take`` from memory-mapped features, an int32 → int64 copy of the token ids
and the method's per-batch extras (MCSEO's phrase spans and object features): host work that
would otherwise sit between two steps. A worker thread does it one batch ahead (the gather is
much shorter than a step). On CUDA the gathered tensors are pinned and copied on a side stream
by the worker, so the copy overlaps the running step's kernels; the step's stream waits for the
copy's event before it reads the batch (no host wait). No RNG is drawn here, so a run's random
stream is the same with or without prefetching.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from mmcse.training.data import Batch

CPU = torch.device("cpu")


def batch_tensors(batch: Batch) -> list[Tensor]:
    packed = batch.packed.tensors() if batch.packed is not None else []
    return [batch.input_ids, batch.attention_mask, *batch.features.values(),
            *batch.extras.values(), *packed]  # fmt: skip


def map_tensors(batch: Batch, fn: Callable[[Tensor], Tensor]) -> Batch:
    return dataclasses.replace(
        batch,
        input_ids=fn(batch.input_ids),
        attention_mask=fn(batch.attention_mask),
        features={role: fn(t) for role, t in batch.features.items()},
        extras={key: fn(t) for key, t in batch.extras.items()},
        packed=batch.packed.map(fn) if batch.packed is not None else None,
    )


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Copy a host batch to ``device`` without waiting (its tensors are pinned on CUDA)."""
    if device.type == "cpu":
        return batch
    return map_tensors(batch, lambda t: t.to(device, non_blocking=True))


def pin(batch: Batch) -> Batch:
    return map_tensors(batch, lambda t: t.pin_memory())


class SideStreamCopy:
    """Host batches copied to a CUDA device on a stream of their own (called on the worker)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def __call__(self, batch: Batch) -> tuple[Batch, torch.cuda.Event]:
        with torch.cuda.stream(self.stream):
            moved = to_device(pin(batch), self.device)
            done = torch.cuda.Event()
            done.record(self.stream)
        return moved, done

    def hand_over(self, moved: Batch, done: torch.cuda.Event) -> Batch:
        """Make the current stream wait for the copy (on the device, not the host) and own the
        batch's memory from now on."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(done)
        for tensor in batch_tensors(moved):
            tensor.record_stream(current)
        return moved


def prefetched(
    items: Iterable[Any], gather: Callable[[Any], Batch], device: torch.device
) -> Iterator[tuple[Any, Batch, float]]:
    """``(item, batch on device, seconds waited for it)`` with the next item gathered meanwhile."""
    copy = SideStreamCopy(device) if device.type == "cuda" else None

    def ready_batch(item: Any):
        batch = gather(item)
        return copy(batch) if copy is not None else (batch, None)

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmcse-prefetch")
    try:
        it = iter(items)
        pending = next(((item, pool.submit(ready_batch, item)) for item in it), None)
        while pending is not None:
            item, future = pending
            started = time.perf_counter()
            batch, done = future.result()
            if done is not None:
                batch = copy.hand_over(batch, done)
            waited = time.perf_counter() - started
            pending = next(((nxt, pool.submit(ready_batch, nxt)) for nxt in it), None)
            yield item, batch, waited
    finally:
        # the one batch gathered ahead is let finish (milliseconds): cancelling it would need
        # the queue module, gone when an unclosed generator is finalised at interpreter exit
        pool.shutdown(wait=True)
