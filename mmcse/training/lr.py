"""The lr schedules of the updates, as factors of the peak lr, on the host and on the device.

A schedule is called with the number of optimizer steps its update has taken and returns the
factor of that update's peak lr for the next step; :meth:`on_device` gives the same factor as a
function of a device step count, for a captured update (its length and warm-up are device scalars
read by the captured step, not constants traced into it: runs that differ only in length or
warm-up — a recipe on another corpus — share one compiled graph and hit inductor's on-disk cache,
``tests/training/test_compile_cache.py``). Whole numbers below 2²⁴ are exact in fp32, so the
device factor equals the host one to float rounding.

* :class:`LinearSchedule`: HF's ``get_linear_schedule_with_warmup`` — the text update of every
  released trainer.
* :class:`CosineSchedule`: VisualCSE/AudioCSE's image (audio) lr, a cosine decay over the run
  without warm-up (constant when the run's length is unknown).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor


def linear_factor(step: int, warmup: int, total: int) -> float:
    """HF's ``get_linear_schedule_with_warmup``: ``s/w`` for ``s < w``, then ``(T − s)/(T − w)``
    (``s`` = optimizer steps taken: the first step runs at factor 0 when ``w > 0``, as released)."""
    if step < warmup:
        return step / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def linear_factor_tensor(step: Tensor, warmup: Tensor | int, total: Tensor | int) -> Tensor:
    """:func:`linear_factor` on a device step count (inside a captured update); ``warmup`` and
    ``total`` may be device scalars."""
    warmup = torch.as_tensor(warmup, dtype=step.dtype, device=step.device)
    total = torch.as_tensor(total, dtype=step.dtype, device=step.device)
    rising = step / warmup.clamp(min=1)
    falling = ((total - step) / (total - warmup).clamp(min=1)).clamp(min=0.0)
    return torch.where(step < warmup, rising, falling)


def cosine_factor(step: int, total: int | None) -> float:
    """The released image lr's cosine decay over ``total`` steps, without warm-up (1 when the
    run's length is unknown)."""
    if not total:
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))


def device_scalar(value: float, device: torch.device) -> Tensor:
    """An fp32 scalar a captured step reads in place (CUDA graphs: not copied into the graph)."""
    scalar = torch.tensor(float(value), dtype=torch.float32, device=device)
    torch._dynamo.mark_static_address(scalar)
    return scalar


class LinearSchedule:
    """:func:`linear_factor` with its warm-up and total."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup, self.total = warmup, total
        self.device_total: Tensor | None = None

    def __call__(self, step: int) -> float:
        return linear_factor(step, self.warmup, self.total)

    def on_device(self, device: torch.device) -> Callable[[Tensor], Tensor]:
        warmup = device_scalar(self.warmup, device)
        self.device_total = total = device_scalar(self.total, device)
        return lambda step: linear_factor_tensor(step, warmup, total)

    def retarget(self, total: int) -> None:
        """The run's length changed (a finished run extended): the decay spans ``total``."""
        self.total = total
        if self.device_total is not None:
            self.device_total.fill_(float(total))


class CosineSchedule:
    """:func:`cosine_factor` over ``total`` steps (None or 0: constant)."""

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.device_total: Tensor | None = None

    def __call__(self, step: int) -> float:
        return cosine_factor(step, self.total)

    def retarget(self, total: int) -> None:
        """The run's length changed (a finished run extended): the decay spans ``total``."""
        self.total = total
        if self.device_total is not None:
            self.device_total.fill_(float(total))

    def on_device(self, device: torch.device) -> Callable[[Tensor], Tensor]:
        if not self.total:
            return torch.ones_like
        self.device_total = total = device_scalar(self.total, device)

        def factor(step: Tensor) -> Tensor:
            return 0.5 * (1.0 + torch.cos(math.pi * (torch.minimum(step, total) / total)))

        return factor
