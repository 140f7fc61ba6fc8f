"""Registered losses: one file per loss, named after it. Importing this package registers all."""

from mmcse.losses import (  # noqa: F401  (importing registers each loss)
    adaptive_angular_margin,
    arc_margin_info_nce,
    class_rank_cross_entropy,
    cross_modal_alignment,
    global_local_info_nce,
    image_text_consistency,
    image_text_info_nce,
    info_nce,
    intra_modal_alignment,
    list_mle_distillation,
    object_phrase,
    simclr,
    supcon,
)
from mmcse.losses.base import Heads, Loss, LossInputs, MissingInputError, build_loss
from mmcse.losses.heads import HIDDEN, AlignerHead, Head, MLPHead

__all__ = [
    "HIDDEN",
    "AlignerHead",
    "Head",
    "Heads",
    "Loss",
    "LossInputs",
    "MLPHead",
    "MissingInputError",
    "build_loss",
]
