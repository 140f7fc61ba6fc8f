"""Counted FLOPs of a training step and MFU (model FLOPs utilisation) against a device's peak.

What is counted — the encoder's matmuls, written out (``h`` hidden size, ``f`` FFN size,
``n`` layers, ``L`` padded sequence length, ``T`` tokens in the step)::

    matmul weights   P = n · (4·h² + 2·h·f)          Q, K, V, O projections + the two FFN matrices
    forward          2·P·T  +  4·n·h·L·T             2 FLOPs per multiply-add; QKᵀ and A·V
    train (fwd+bwd)  3 × forward = 6·P·T + 12·n·h·L·T

``T = 2 · batch · L``: SimCSE encodes every sentence twice (the two dropout views) in one
forward. ``L`` is the width the kernels run at (the batch's longest sentence under dynamic
padding), so padding is counted as work, as the hardware does it. Not counted: embeddings
(lookups, no matmul), BERT's pooler (not in the loss, no backward), layer norms, softmax,
and the methods' heads (a few ``h × 256`` matmuls on ``batch`` rows: under 1% at BERT-base).
So the MFU of a multimodal method is computed with SimCSE's FLOPs: its extra work shows up
as a lower MFU, exactly like its step ratio.

Peaks are dense (no sparsity) bf16 tensor-core FLOP/s from the vendors' datasheets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: dense bf16 peak FLOP/s by a substring of ``torch.cuda.get_device_name`` (first match wins,
#: so the more specific names come first: "H100 PCIe" before "H100", "A100" before "A10")
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM5 (the name reads e.g. "NVIDIA H100 80GB HBM3")
    ("H200", 989e12),
    ("GH200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10", 125e12),
)


@dataclass(frozen=True)
class EncoderShape:
    hidden: int
    layers: int
    ffn: int

    @classmethod
    def of(cls, config) -> EncoderShape:
        """From an HF config (BERT/RoBERTa names) or a dict with the same keys."""
        get = config.get if isinstance(config, dict) else lambda k: getattr(config, k)
        return cls(get("hidden_size"), get("num_hidden_layers"), get("intermediate_size"))

    @property
    def matmul_params(self) -> int:
        return self.layers * (4 * self.hidden**2 + 2 * self.hidden * self.ffn)


def train_step_flops(shape: EncoderShape, batch: int, seq_len: int) -> int:
    """Forward + backward FLOPs of one step over two (dropout-view) encodings of ``batch``
    sentences."""
    tokens = 2 * batch * seq_len
    dense = 6 * shape.matmul_params * tokens
    attention = 12 * shape.layers * shape.hidden * seq_len * tokens
    return dense + attention


def peak_flops(device: torch.device | str, declared_tflops: float | None = None):
    """(peak FLOP/s, where it came from) of ``device``; ``(None, reason)`` when unknown.

    ``declared_tflops`` (e.g. ``--peak-tflops``) overrides the table, and is the only way to
    get an MFU on a CPU (no datasheet peak applies to a shared, throttled CPU).
    """
    if declared_tflops:
        return declared_tflops * 1e12, f"declared {declared_tflops:g} TFLOP/s"
    device = torch.device(device)
    if device.type != "cuda":
        return None, "n/a on CPU (no datasheet peak; pass --peak-tflops to declare one)"
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16_FLOPS:
        if key in name:
            return value, f"{name}: dense bf16 datasheet peak {value / 1e12:g} TFLOP/s"
    return None, f"{name}: not in the peak table (pass --peak-tflops)"


def mfu(flops_per_step: int, step_seconds: float, peak: float | None) -> float | None:
    """Achieved FLOP/s ÷ peak, or None without a peak."""
    if peak is None or step_seconds <= 0:
        return None
    return flops_per_step / step_seconds / peak
