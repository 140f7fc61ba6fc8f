"""The one precision policy: what ``--precision`` means for autocast, loss scaling and the name a
run records (training, the VisualCSE/AudioCSE image/audio step and evaluation all ask here).

``fp32``: no autocast. ``fp16``: fp16 autocast with a GradScaler (the released ``--fp16``
runs). ``bf16`` and ``auto``: bf16 autocast where the GPU supports it, else fp32. Autocast is
CUDA only: a CPU always computes in fp32 (CPU autocast emulates the formats; ``mmcse bench
precision`` measures it on purpose). Evaluation (``mmcse eval``, a run's dev and test scoring)
encodes in fp32 by default (:data:`EVAL_PRECISION`), as every released trainer evaluated — the
evaluation that picked their checkpoints and gave their numbers: MCSE/KDMCSE/DALR's
``utils.evaluate`` runs the encoder under ``torch.no_grad()`` with no autocast, and the HF
Trainer's SentEval ``evaluate`` (SimCSE, VisualCSE/AudioCSE) enters none either. ``mmcse eval
--precision`` / ``--eval-precision`` of a run select autocast instead (:func:`evaluating_in`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the settings name PRECISIONS without importing torch
    import torch

#: ``auto`` = bf16 autocast on CUDA where supported; ``fp16`` = fp16 autocast + GradScaler on
#: CUDA (the released SimCSE/VisualCSE ``--fp16``); every value computes in plain fp32 on CPU
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
#: what evaluation (``mmcse eval``, the run's dev and test scoring) encodes under by default:
#: fp32, as the released evaluations (``auto``/``bf16``: bf16 autocast on CUDA, faster)
EVAL_PRECISION = "fp32"
_evaluation_precision: ContextVar[str] = ContextVar("evaluation_precision", default=EVAL_PRECISION)


def evaluation_precision() -> str:
    """The precision evaluation encodes under here (:func:`evaluating_in`; else fp32)."""
    return _evaluation_precision.get()


@contextmanager
def evaluating_in(precision: str) -> Iterator[None]:
    """Evaluations inside encode under ``precision`` (one of :data:`PRECISIONS`)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    token = _evaluation_precision.set(precision)
    try:
        yield
    finally:
        _evaluation_precision.reset(token)


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


def precision_name(device: torch.device, precision: str | None = None) -> str:
    """What a run (or, with no ``precision``, an evaluation) on ``device`` computes in, as
    recorded in its environment."""
    import torch

    dtype = autocast_dtype(device, precision or evaluation_precision())
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
