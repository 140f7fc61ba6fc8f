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

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from mmcse.devices import to_device
from mmcse.training.data import Batch

CPU = torch.device("cpu")


class CudaStreams:
    """The thin CUDA adapter of the copy: a side stream, an event, pinning and the allocator's
    stream bookkeeping (everything else of the copy runs, and is tested, on the CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)  # pragma: cuda

    def copying(self):
        return torch.cuda.stream(self.stream)  # pragma: cuda

    def copied(self) -> torch.cuda.Event:
        done = torch.cuda.Event()  # pragma: cuda
        done.record(self.stream)  # pragma: cuda
        return done  # pragma: cuda

    def wait(self, done: torch.cuda.Event):
        """The current stream, made to wait for ``done`` on the device (not the host)."""
        current = torch.cuda.current_stream(self.device)  # pragma: cuda
        current.wait_event(done)  # pragma: cuda
        return current  # pragma: cuda

    @staticmethod
    def pin(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory()  # pragma: cuda

    @staticmethod
    def keep(tensor: torch.Tensor, stream) -> None:
        """The allocator frees ``tensor`` only once ``stream``'s queued work is done."""
        tensor.record_stream(stream)  # pragma: cuda


class SideStreamCopy:
    """Host batches copied to a CUDA device on a stream of their own (called on the worker).
    ``streams``: the device adapter (:class:`CudaStreams`; a stand-in in the CPU tests)."""

    def __init__(self, device: torch.device, streams: CudaStreams | None = None) -> None:
        self.device = device
        self.streams = streams if streams is not None else CudaStreams(device)

    def __call__(self, batch: Batch) -> tuple[Batch, Any]:
        with self.streams.copying():
            moved = to_device(batch.map(self.streams.pin), self.device, non_blocking=True)
            done = self.streams.copied()
        return moved, done

    def hand_over(self, moved: Batch, done: Any) -> Batch:
        """Make the current stream wait for the copy (on the device, not the host) and own the
        batch's memory from now on."""
        current = self.streams.wait(done)
        for tensor in moved.tensors():
            self.streams.keep(tensor, current)
        return moved


def side_stream_copy(device: torch.device) -> SideStreamCopy | None:
    """The copy a device's batches take: a side stream on CUDA, none elsewhere."""
    return SideStreamCopy(device) if device.type == "cuda" else None


def prefetched(
    items: Iterable[Any],
    gather: Callable[[Any], Batch],
    device: torch.device,
    copy: SideStreamCopy | None = None,
) -> Iterator[tuple[Any, Batch, float]]:
    """``(item, batch on device, seconds waited for it)`` with the next item gathered meanwhile.
    ``copy``: how a batch reaches the device (default :func:`side_stream_copy`; else a plain
    copy, none on the CPU)."""
    copy = copy if copy is not None else side_stream_copy(device)

    def ready_batch(item: Any):
        batch = gather(item)
        return copy(batch) if copy is not None else (to_device(batch, device), None)

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
