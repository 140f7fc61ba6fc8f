"""The one timing helper every benchmark uses (``mmcse bench ...``).

Three rules make GPU timings honest and CPU timings comparable, and they live here once:

* the device is synchronised before the clock starts and before it stops (CUDA work is
  asynchronous: without it a timer measures kernel *launches*);
* warm-up calls (allocator, kernel selection, ``torch.compile``, DataLoader workers) are run
  and thrown away before anything is timed;
* a figure is the **median** of the timed repeats (robust to the odd slow call on a shared
  machine), with the raw samples kept for anyone who wants the spread.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from mmcse.errors import MmcseError

T = TypeVar("T")


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued work on ``device`` (a no-op on CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(work: Callable[[], object], device: torch.device | str | None = None) -> float:
    """Wall seconds of one call of ``work``, the device synchronised on both sides."""
    return timed_result(work, device)[1]


def timed_result(
    work: Callable[[], T], device: torch.device | str | None = None
) -> tuple[T, float]:
    """``work()``'s result and its wall seconds (device synchronised on both sides)."""
    synchronize(device)
    start = time.perf_counter()
    result = work()
    synchronize(device)
    return result, time.perf_counter() - start


@dataclass
class Timing:
    """Samples (seconds) of repeated calls; ``seconds`` is their median."""

    samples: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        if not self.samples:
            raise MmcseError("nothing was timed")
        return statistics.median(self.samples)

    def extend(self, other: Timing) -> None:
        self.samples.extend(other.samples)


def repeat(
    work: Callable[[], object],
    device: torch.device | str | None = None,
    warmup: int = 1,
    repeats: int = 3,
) -> Timing:
    """``warmup`` untimed calls, then ``repeats`` timed ones (each synchronised)."""
    if repeats < 1:
        raise MmcseError("a benchmark needs at least one timed repeat")
    for _ in range(warmup):
        work()
    synchronize(device)
    return Timing([timed(work, device) for _ in range(repeats)])


def steady_rate(batches: Iterable[int], device: torch.device | str | None = None) -> float:
    """Items/s of a stream of batches, the first one (start-up) left out.

    ``batches`` yields each batch's item count once its work is queued; the device is
    synchronised after every batch, so the count is of finished work. With a single batch,
    that batch alone is timed.
    """
    start = time.perf_counter()
    first_done, first_count, counted = None, 0, 0
    for count in batches:
        synchronize(device)
        if first_done is None:
            first_done, first_count = time.perf_counter(), count
        else:
            counted += count
    end = time.perf_counter()
    if first_done is None:
        raise MmcseError("nothing to time: use at least one item")
    if counted == 0:
        return first_count / (end - start)
    return counted / (end - first_done)


def peak_memory_bytes(device: torch.device | str) -> int | None:
    """Peak allocated CUDA memory since the last :func:`reset_peak_memory`; None on CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))


def reset_peak_memory(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


@contextmanager
def quiet_profile(**kwargs):
    """``torch.profiler.profile`` without the lines its C++ side prints to the terminal when it
    starts and stops (``USDT … profiler_start``, ``gpuGetDeviceCount failed`` on a machine
    without a GPU): third-party noise, written straight to file descriptor 2."""
    from torch.profiler import profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        with profile(**kwargs) as prof:
            os.dup2(saved, 2)  # the profiled work may log as usual
            yield prof
            sys.stderr.flush()
            os.dup2(devnull, 2)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
