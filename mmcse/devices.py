"""Device choice, in one place: what ``--device`` accepts, what ``auto`` means, what exists."""

from __future__ import annotations

import re

from mmcse.errors import MmcseError

DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?|mps"
DEVICES = "auto, cpu, cuda, cuda:N or mps"


def default_device_name() -> str:
    """What ``auto`` means: the first CUDA device when there is one, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(name: str) -> None:
    """Refuse a malformed name, or a CUDA device this machine does not have, with one line."""
    if not re.fullmatch(DEVICE_PATTERN, name):
        raise MmcseError(f"--device must be {DEVICES}, not {name!r}")
    if name in ("auto", "cpu"):
        return  # exists everywhere: no torch import (seconds) to say so
    import torch

    if name.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(name.partition(":")[2] or 0)
        if index >= count:
            found = f"{count} CUDA device(s)" if count else "no CUDA device"
            raise MmcseError(f"--device {name}: this machine has {found}; use --device cpu or auto")
    if name == "mps" and not torch.backends.mps.is_available():
        raise MmcseError("--device mps: MPS is not available here; use --device cpu or auto")


def pick_device(name: str):
    """``torch.device`` for a ``--device`` value (``auto`` resolved; a missing GPU refused)."""
    import torch

    if name == "auto":
        return torch.device(default_device_name())
    check_device(name)
    return torch.device(name)


def to_device(batch, device, non_blocking: bool = False):
    """``batch`` on ``device``: the one copy of a batch to a device (a training
    :class:`~mmcse.training.data.Batch`, a :class:`~mmcse.packing.PackedTokens`, or anything
    else that owns ``map``; a tensor; a tuple of them). On the CPU a host batch is returned as it
    is. ``non_blocking``: the copy does not wait (pinned host memory, a side stream's copy)."""
    import torch

    device = torch.device(device)
    if isinstance(batch, tuple):
        return tuple(to_device(item, device, non_blocking) for item in batch)
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    return batch.map(lambda t: t.to(device, non_blocking=non_blocking))
