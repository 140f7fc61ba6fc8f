"""The one precision policy: what ``--precision`` means for autocast, loss scaling and the name a
run records (training, the VisualCSE/AudioCSE image/audio step and evaluation all ask here).

``fp32``: no autocast; with ``tf32`` (every recipe's default: the released runs' torch 1.7–1.11
did so on Ampere and later GPUs), CUDA matmuls and cuDNN convolutions take TF32 tensor cores
(:func:`tf32_settings`; ``docs/fidelity.md``). ``fp16``: fp16 autocast with a GradScaler (the released ``--fp16``
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


def precision_name(device: torch.device, precision: str | None = None, tf32: bool = False) -> str:
    """What a run (or, with no ``precision``, an evaluation) on ``device`` computes in, as
    recorded in its environment; ``tf32``: the run's setting (:func:`tf32_settings`)."""
    import torch

    dtype = autocast_dtype(device, precision or evaluation_precision())
    if dtype is None:
        name = "fp32"
    else:
        name = "fp16 autocast + GradScaler" if dtype == torch.float16 else "bf16 autocast"
    if tf32 and tf32_settings(device, tf32) is not None:
        name += " + TF32 matmuls" if dtype is not None else " (TF32 matmuls and convolutions)"
    return name


#: what a run sets on CUDA for fp32 matmuls and cuDNN convolutions, by ``tf32``: the
#: ``allow_tf32`` flags that torch 1.7-1.11 turned on by default (the released runs' arithmetic);
#: True: TF32 tensor cores (~1e-3 relative error), False: full fp32. torch >= 2.9 also has
#: per-backend ``fp32_precision`` settings, but once one is set torch refuses to read the flags
#: that inductor (``torch.get_float32_matmul_precision``) and the run's environment record read,
#: so a run sets only these
TF32_SETTINGS = {
    True: {"matmul": True, "cudnn": True},
    False: {"matmul": False, "cudnn": False},
}


def tf32_settings(device: torch.device | str, tf32: bool) -> dict[str, bool] | None:
    """The fp32 arithmetic a run on ``device`` sets (:data:`TF32_SETTINGS`); None off CUDA,
    where nothing is set (TF32 is a CUDA tensor-core format)."""
    import torch

    return dict(TF32_SETTINGS[bool(tf32)]) if torch.device(device).type == "cuda" else None


def set_fp32_arithmetic(settings: dict[str, bool]) -> None:
    """torch's process-wide CUDA fp32 switches (:func:`tf32_settings`): flags only, so a CPU
    test sets and reads them as a CUDA run does."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = settings["matmul"]
    torch.backends.cudnn.allow_tf32 = settings["cudnn"]


def describe_precision(precision: str, tf32: bool) -> str:
    """What a run of ``precision`` computes in, in words, device by device (plans, dry runs)."""
    words = {
        "fp32": "plain fp32",
        "fp16": "fp16 autocast + GradScaler on CUDA; fp32 on CPU",
        "bf16": "bf16 autocast on CUDA; fp32 on CPU",
        "auto": "bf16 autocast on CUDA; fp32 on CPU",
    }[precision]
    if precision == "fp32" and tf32:
        words = "fp32, TF32 matmuls and cuDNN convolutions on CUDA (as torch 1.7-1.11 on Ampere+)"
    elif tf32:
        words += "; fp32 ops outside autocast in TF32 on CUDA"
    return f"{precision} ({words})"


def autocast_context(device: torch.device, precision: str):
    """:func:`autocast_for` with the dtype resolved now: a factory of autocast contexts for a
    step that enters one every time (inside a captured step no device query may run)."""
    import torch

    dtype = autocast_dtype(device, precision)
    if dtype is None:
        return nullcontext
    return lambda: torch.autocast(torch.device(device).type, dtype=dtype)
