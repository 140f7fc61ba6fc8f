"""SimCSE's unsupervised InfoNCE between two dropout views (:class:`SimCSELoss`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.losses.base import Heads, Loss, LossInputs, cosine_matrix, project_views
from mmcse.registry import register_loss


def info_nce(queries: Tensor, keys: Tensor, temperature: float) -> Tensor:
    """Mean InfoNCE of ``queries[i]`` against ``keys``, whose positive is row ``i``."""
    logits = cosine_matrix(queries, keys) / temperature
    targets = torch.arange(queries.shape[0], device=queries.device)
    return F.cross_entropy(logits.float(), targets)


@register_loss("simcse")
class SimCSELoss(Loss):
    """SimCSE's unsupervised InfoNCE between two dropout views.

    Gao et al., *SimCSE: Simple Contrastive Learning of Sentence Embeddings* (EMNLP 2021), eq. 1;
    MCSE (Zhang et al., NAACL 2022) eq. 1 uses it unchanged as ℓ^S:

        ℓ_i = −log  exp(sim(h_i, h_i⁺)/τ) / Σ_j exp(sim(h_i, h_j⁺)/τ)

    where ``h = MLP([CLS])`` of dropout view 1, ``h⁺`` the same for view 2 and the sum runs over
    the batch (gathered across ranks, so N GPUs act as one N-times-larger batch). τ = 0.05.

    Heads: ``student`` — the MLP (Linear H→H + Tanh), used in training only: the sentence
    embedding is [CLS] before it. SimCSE's and MCSE's ``cl_init`` initialise it like BERT
    (normal(0, 0.02) weights, zero bias); the methods' ``head_init="torch"`` keeps PyTorch's
    default Linear init.

    Inputs: ``view1``, ``view2`` ``[B, H]``. Returns ``{"simcse_loss": scalar}``.
    Siblings: :class:`~mmcse.losses.image_text_info_nce.ImageTextInfoNCELoss` (MCSE's
    text→image term) reuses :func:`info_nce`;
    :class:`~mmcse.losses.arc_margin_info_nce.ArcMarginInfoNCELoss` with margin 0 equals it.

    Args:
        temperature: τ.
    """

    terms = ("simcse_loss",)
    slots = {"student": "mlp"}

    def __init__(self, temperature: float = 0.05) -> None:
        super().__init__()
        self.temperature = temperature

    @staticmethod
    def compute_loss_from_embeddings(h1: Tensor, h2: Tensor, temperature: float = 0.05) -> Tensor:
        """InfoNCE over the batch gathered from every rank (each rank computes the global loss,
        its own rows differentiable, exactly as SimCSE's DDP code does)."""
        return info_nce(gather_across_ranks(h1), gather_across_ranks(h2), temperature)

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        h1, h2 = project_views(heads["student"], inputs.view1, inputs.view2)
        return {"simcse_loss": self.compute_loss_from_embeddings(h1, h2, self.temperature)}
