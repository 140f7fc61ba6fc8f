"""Registered losses: one file per loss, named after it. Importing this package registers all."""

from mmcse.losses import image_text_info_nce, info_nce  # noqa: F401  (registration side effect)
from mmcse.losses.base import Loss, LossInputs, MissingInputError

__all__ = ["Loss", "LossInputs", "MissingInputError"]
