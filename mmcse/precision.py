"""The one precision policy: what ``--precision`` means for autocast, loss scaling and the name a
run records (training, the VisualCSE/AudioCSE image/audio step and evaluation all ask here).

``fp32``: no autocast. ``fp16``: fp16 autocast with a GradScaler (the released ``--fp16``
runs). ``bf16`` and ``auto``: bf16 autocast where the GPU supports it, else fp32. Autocast is
CUDA only: a CPU always computes in fp32 (CPU autocast emulates the formats; ``mmcse bench
precision`` measures it on purpose). Evaluation has no precision setting: it encodes under
:data:`EVAL_PRECISION`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the settings name PRECISIONS without importing torch
    import torch

#: ``auto`` = bf16 autocast on CUDA where supported; ``fp16`` = fp16 autocast + GradScaler on
#: CUDA (the released SimCSE/VisualCSE ``--fp16``); every value computes in plain fp32 on CPU
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
#: what evaluation (``mmcse eval``, the run's dev and test scoring) encodes under
EVAL_PRECISION = "auto"


def bf16_supported(device: torch.device) -> bool:
    import torch

    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def autocast_dtype(
    device: torch.device | str, precision: str, bf16: bool | None = None
) -> torch.dtype | None:
    """The dtype ``precision`` autocasts to on ``device``, None for none. ``bf16``: whether the
    device supports bf16 (asked of the device when None)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or precision == "fp32":
        return None
    if precision == "fp16":
        return torch.float16
    supported = bf16_supported(device) if bf16 is None else bf16
    return torch.bfloat16 if supported else None


def autocast_for(device: torch.device, precision: str) -> AbstractContextManager:
    """The autocast context of a forward pass under ``precision`` (a no-op where none)."""
    import torch

    dtype = autocast_dtype(device, precision)
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def grad_scaler_for(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """fp16 needs loss scaling (as the released ``--fp16`` runs had); disabled otherwise."""
    import torch

    enabled = autocast_dtype(device, precision) == torch.float16
    return torch.amp.GradScaler("cuda", enabled=enabled)


def precision_name(device: torch.device, precision: str = EVAL_PRECISION) -> str:
    """What a run (or an evaluation) on ``device`` computes in, as recorded in its environment."""
    import torch

    dtype = autocast_dtype(device, precision)
    if dtype is None:
        return "fp32"
    return "fp16 autocast + GradScaler" if dtype == torch.float16 else "bf16 autocast"


def autocast_context(device: torch.device, precision: str):
    """:func:`autocast_for` with the dtype resolved now: a factory of autocast contexts for a
    step that enters one every time (inside a captured step no device query may run)."""
    import torch

    dtype = autocast_dtype(device, precision)
    if dtype is None:
        return nullcontext
    return lambda: torch.autocast(torch.device(device).type, dtype=dtype)
