"""MCSE's multimodal objective: text→image InfoNCE in a grounded space
(:class:`ImageTextInfoNCELoss`)."""

from __future__ import annotations

from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.losses.base import (
    Heads,
    Loss,
    LossInputs,
    l2_normalize,
    project_features,
    project_views,
)
from mmcse.losses.info_nce import info_nce
from mmcse.registry import register_loss

#: how the two dropout views' InfoNCE terms combine (see the class docstring)
VIEW_REDUCTIONS = ("mean", "sum", "first")


@register_loss("image_text_info_nce")
class ImageTextInfoNCELoss(Loss):
    """MCSE's multimodal objective: text→image InfoNCE in a grounded space.

    Zhang et al., *MCSE: Multimodal Contrastive Learning of Sentence Embeddings* (NAACL 2022),
    eq. 3:

        ℓ_i^M = − Σ_{z ∈ {z_i, z_i'}} log  exp(sim(s_i^z, v_i)/τ') / Σ_j exp(sim(s_i^z, v_j)/τ')

    with ``s^z = g_φ1(f_θ(x, z))`` the sentence ([CLS]) of dropout view ``z`` through a text head
    and ``v = g_φ2(f^v(y))`` the frozen image feature (cached by Stage 1: ResNet-50 2048-d, or
    CLIP) through an image head. Both heads are single Linear + Tanh layers into a 256-d space and
    both outputs are L2-normalised (App. A); τ' = 0.05. Images are gathered across ranks.

    Views (``views``): eq. 3 *sums* the two dropout views; MCSE's released ``src/model.py``
    (``MCSE.compute_loss``: ``inter_loss = (loss_fct(cos_sim_p0, …) + loss_fct(cos_sim_p1, …)) / 2``)
    *averages* them, and λ of Tables 3/4 was tuned with that mean. Default ``"mean"`` (the code);
    ``"sum"`` is eq. 3 as printed (twice the code's value, i.e. λ doubled); ``"first"`` uses
    view 1 alone (DALR's eq. 4 writes a single ``s^z``).

    Heads: ``student`` (H→d, on [CLS]) and ``image`` (D→d, on the cached feature), both
    PyTorch-default-initialised, as MCSE's ``grounding`` and ``ResNetVisnModel`` ``MLPLayer`` s
    (built outside ``BertForCL``, so ``init_weights`` never touches them). DALR's paper variant
    shares both with ℓ_CMA (its method names the same heads for both terms).

    Inputs: ``view1``, ``view2`` ``[B, H]``; ``features[feature_role]`` ``[B, D]``.
    Returns ``{"image_text_loss": scalar}``. Sibling of :class:`~mmcse.losses.info_nce.SimCSELoss`
    (same :func:`~mmcse.losses.info_nce.info_nce` core); KDMCSE's
    :class:`~mmcse.losses.adaptive_angular_margin.AdaptiveAngularMarginLoss` adds margins.

    Args:
        feature_role: the cached image feature role.
        temperature: τ'.
        views: ``"mean"``, ``"sum"`` or ``"first"`` (above).
    """

    requires = ("image",)
    terms = ("image_text_loss",)
    slots = {"student": "mlp", "image": "mlp"}

    def __init__(
        self, feature_role: str = "image", temperature: float = 0.05, views: str = "mean"
    ) -> None:
        super().__init__()
        if views not in VIEW_REDUCTIONS:
            raise ValueError(f"views must be one of {VIEW_REDUCTIONS}, not {views!r}")
        self.feature_role = feature_role
        self.requires = (feature_role,)
        self.temperature = temperature
        self.views = views

    @staticmethod
    def compute_loss_from_embeddings(
        text_views: list[Tensor], images: Tensor, temperature: float = 0.05, views: str = "mean"
    ) -> Tensor:
        """InfoNCE(text_view → images) per view, then their mean, sum or the first alone;
        inputs already projected."""
        images = gather_across_ranks(l2_normalize(images))
        if views == "first":
            text_views = text_views[:1]
        losses = [
            info_nce(gather_across_ranks(l2_normalize(s)), images, temperature) for s in text_views
        ]
        total = sum(losses)
        return total / len(losses) if views == "mean" else total

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        v = project_features(heads["image"], inputs.feature(self.feature_role))
        views = list(project_views(heads["student"], inputs.view1, inputs.view2))
        loss = self.compute_loss_from_embeddings(views, v, self.temperature, self.views)
        return {"image_text_loss": loss}
