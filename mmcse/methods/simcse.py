"""SimCSE and MCSE as compositions of registered losses (seeds 000/002)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmcse.losses.heads import HIDDEN, Head
from mmcse.methods.base import Method, Term
from mmcse.registry import register_method


@register_method("simcse")
@dataclass
class SimCSE(Method):
    """Unsupervised SimCSE: InfoNCE between dropout views on every batch (text and captions).

    ``head_init``: the [CLS] MLP head's init — ``"bert"`` (default; normal(0, 0.02), zero bias,
    as SimCSE's/MCSE's ``cl_init`` → ``init_weights()``) or ``"torch"`` (PyTorch's Linear default).
    """

    name: ClassVar[str] = "simcse"
    simcse_weight: float = 1.0
    temperature: float = 0.05
    head_init: str = "bert"

    def terms(self) -> list[Term]:
        options = {"temperature": self.temperature}
        heads = {"student": Head(HIDDEN, HIDDEN, self.head_init)}  # the [CLS] MLP, H→H
        return [Term("simcse", "simcse", self.simcse_weight, "all", options, heads)]


@register_method("mcse")
@dataclass
class MCSE(SimCSE):
    """MCSE: ℓ = ℓ^S + λ·ℓ^M (eq. 4); ℓ^M only on caption batches, where images exist.

    λ defaults to 0.01 (Table 3, BERT wiki+flickr); recipes set the per-setting values.
    ``views``: ℓ^M's two dropout views are averaged (``"mean"``, MCSE's released ``src/model.py``,
    with which λ was tuned) or summed (``"sum"``, eq. 3 as printed); see
    :mod:`~mmcse.losses.image_text_info_nce`.
    """

    name: ClassVar[str] = "mcse"
    caption_roles: ClassVar[tuple[str, ...]] = ("image",)
    image_text_weight: float = 0.01
    image_temperature: float = 0.05
    proj_dim: int = 256
    views: str = "mean"

    def terms(self) -> list[Term]:
        options = {"temperature": self.image_temperature, "views": self.views}
        heads = {  # MCSE's grounding and image MLPLayer: PyTorch's default init
            "student": Head(HIDDEN, self.proj_dim),
            "image": Head("image", self.proj_dim),
        }
        grounding = Term(
            "image_text", "image_text_info_nce", self.image_text_weight, "caption", options, heads
        )
        return [*super().terms(), grounding]
