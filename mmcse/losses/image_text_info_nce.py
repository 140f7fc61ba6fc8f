"""MCSE's multimodal objective: text→image InfoNCE in a grounded space.

Zhang et al., *MCSE: Multimodal Contrastive Learning of Sentence Embeddings* (NAACL 2022), eq. 3:

    ℓ_i^M = − Σ_{z ∈ {z_i, z_i'}} log  exp(sim(s_i^z, v_i)/τ') / Σ_j exp(sim(s_i^z, v_j)/τ')

with ``s^z = g_φ1(f_θ(x, z))`` the sentence ([CLS]) of dropout view ``z`` through a text head and
``v = g_φ2(f^v(y))`` the frozen image feature (cached by Stage 1: ResNet-50 2048-d, or CLIP)
through an image head. Both heads are single Linear + Tanh layers into a 256-d space and both
outputs are L2-normalised (App. A); τ' = 0.05. The sum over the two views is kept as a sum, as in
eq. 3 (MCSE's code adds the two cross-entropies).

Inputs: ``view1``, ``view2`` ``[B, H]``; ``features[feature_role]`` ``[B, D]``.
Returns ``{"image_text_loss": scalar}``. Sibling of :mod:`info_nce` (same :func:`info_nce` core).
"""

from __future__ import annotations

from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.losses.base import Loss, LossInputs, l2_normalize, project_views
from mmcse.losses.info_nce import MLPHead, info_nce
from mmcse.registry import register_loss


@register_loss("image_text_info_nce")
class ImageTextInfoNCELoss(Loss):
    requires = ("image",)
    terms = ("image_text_loss",)

    def __init__(
        self,
        hidden_size: int,
        feature_dims: dict[str, int],
        feature_role: str = "image",
        proj_dim: int = 256,
        temperature: float = 0.05,
        **_: object,
    ) -> None:
        super().__init__()
        self.feature_role = feature_role
        self.requires = (feature_role,)
        self.temperature = temperature
        self.text_head = MLPHead(hidden_size, proj_dim)
        self.image_head = MLPHead(feature_dims[feature_role], proj_dim)

    @staticmethod
    def compute_loss_from_embeddings(
        text_views: list[Tensor], images: Tensor, temperature: float = 0.05
    ) -> Tensor:
        """Σ over views of InfoNCE(text_view → images); inputs already projected."""
        images = gather_across_ranks(l2_normalize(images))
        return sum(
            info_nce(gather_across_ranks(l2_normalize(s)), images, temperature) for s in text_views
        )

    def forward(self, inputs: LossInputs) -> dict[str, Tensor]:
        image = inputs.feature(self.feature_role)
        v = self.image_head(image.to(self.image_head[0].weight.dtype))
        views = project_views(self.text_head, inputs.view1, inputs.view2)
        return {"image_text_loss": self.compute_loss_from_embeddings(views, v, self.temperature)}
