"""SimCSE's unsupervised InfoNCE between two dropout views.

Gao et al., *SimCSE: Simple Contrastive Learning of Sentence Embeddings* (EMNLP 2021), eq. 1;
MCSE (Zhang et al., NAACL 2022) eq. 1 uses it unchanged as ℓ^S:

    ℓ_i = −log  exp(sim(h_i, h_i⁺)/τ) / Σ_j exp(sim(h_i, h_j⁺)/τ)

where ``h = MLP([CLS])`` of dropout view 1, ``h⁺`` the same for view 2 and the sum runs over the
batch (gathered across ranks, so N GPUs act as one N-times-larger batch). τ = 0.05. The MLP
(Linear H→H + Tanh) is used in training only: the sentence embedding is [CLS] before it. It is
initialised like BERT (normal(0, 0.02) weights, zero bias; ``head_init="bert"``), as SimCSE's and
MCSE's ``cl_init`` do; ``head_init="torch"`` keeps PyTorch's default Linear init.

Inputs: ``view1``, ``view2`` of shape ``[B, H]``. Returns ``{"simcse_loss": scalar}``.
Siblings: :mod:`image_text_info_nce` (MCSE's text→image term) reuses :func:`info_nce`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.losses.base import Loss, LossInputs, cosine_matrix, project_views
from mmcse.losses.heads import HEAD_INITS, MLPHead, resolve_head  # noqa: F401  (re-exported)
from mmcse.registry import register_loss


def info_nce(queries: Tensor, keys: Tensor, temperature: float, offset: int = 0) -> Tensor:
    """Mean InfoNCE of ``queries[i]`` against ``keys``, whose positive is row ``offset + i``."""
    logits = cosine_matrix(queries, keys) / temperature
    targets = torch.arange(queries.shape[0], device=queries.device) + offset
    return F.cross_entropy(logits.float(), targets)


@register_loss("simcse")
class SimCSELoss(Loss):
    terms = ("simcse_loss",)

    def __init__(
        self,
        hidden_size: int,
        temperature: float = 0.05,
        head_init: str = "bert",
        student_head: str | None = None,
        student_head_dim: int | None = None,
        shared_heads: dict | None = None,
        **_: object,
    ) -> None:
        super().__init__()
        self.temperature = temperature
        out = student_head_dim if student_head else hidden_size
        self.mlp = resolve_head(shared_heads, student_head, hidden_size, out, head_init)

    @staticmethod
    def compute_loss_from_embeddings(h1: Tensor, h2: Tensor, temperature: float = 0.05) -> Tensor:
        """InfoNCE over the batch gathered from every rank (each rank computes the global loss,
        its own rows differentiable, exactly as SimCSE's DDP code does)."""
        return info_nce(gather_across_ranks(h1), gather_across_ranks(h2), temperature)

    def forward(self, inputs: LossInputs) -> dict[str, Tensor]:
        h1, h2 = project_views(self.mlp, inputs.view1, inputs.view2)
        return {"simcse_loss": self.compute_loss_from_embeddings(h1, h2, self.temperature)}
