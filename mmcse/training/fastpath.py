"""Switchable fast paths of a training run (each a :class:`~mmcse.training.config.TrainConfig` field).

=====================  ==================  ====================================================
field                  flag                effect
=====================  ==================  ====================================================
``attn_implementation``  ``--attn-implementation``  ``sdpa`` (default): PyTorch's fused attention
                                           kernels; ``eager``: HF's reference attention. Same
                                           function; dropout draws differ.
``fused_adamw``        ``--fused-adamw``   AdamW's single fused CUDA kernel (default on; the
                                           same update; a CPU run uses the plain loop)
``compile_encoder``    ``--compile``       ``torch.compile`` of the encoder (off by default:
                                           the first steps compile; every new batch width may
                                           recompile, so pair it with ``--no-dynamic-padding``)
``tf32``               ``--tf32``          TF32 tensor-core matmuls for ``--precision fp32`` on
                                           CUDA (off by default: ~1e-3 relative error)
``dynamic_padding``    ``--dynamic-padding``  pad each batch to its longest sentence (default);
                                           off: always ``max_seq_length`` (static shapes)
=====================  ==================  ====================================================

All of them are recorded in the run's ``config.json`` like every other field.
"""

from __future__ import annotations

import torch

from mmcse.training.config import TrainConfig


def fused_adamw(cfg: TrainConfig, device: torch.device) -> bool | None:
    """The ``fused=`` argument of AdamW: True on CUDA when asked for, else PyTorch's default."""
    return True if cfg.fused_adamw and device.type == "cuda" else None


def set_matmul_precision(cfg: TrainConfig, device: torch.device) -> None:
    """TF32 for fp32 runs on CUDA when ``cfg.tf32``; full fp32 matmuls otherwise."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high" if cfg.tf32 else "highest")


def compile_encoder(cfg: TrainConfig, encoder: torch.nn.Module) -> None:
    """``torch.compile`` the HF backbone in place (its state-dict keys stay unchanged, so
    checkpoints are ordinary HF directories)."""
    if cfg.compile_encoder:
        encoder.backbone.compile()


def apply_fast_paths(cfg: TrainConfig, encoder: torch.nn.Module, device: torch.device) -> None:
    """Everything except the optimizer's ``fused=`` (see :func:`fused_adamw`)."""
    set_matmul_precision(cfg, device)
    compile_encoder(cfg, encoder)
