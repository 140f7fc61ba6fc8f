"""InfoNCE between dropout views with an additive angular margin on the negatives
(:class:`ArcMarginInfoNCELoss`, KDMCSE's ℓ^S; :func:`angular_margin_logits`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.losses.base import Heads, Loss, LossInputs, cosine_matrix
from mmcse.registry import register_loss


def angular_margin_logits(
    cos: Tensor, margin: float, teacher_similarity: Tensor | None = None
) -> Tensor:
    """``cos(θ_ij − Δ_ij)`` on the off-diagonal pairs with ``θ_ij > margin``; ``cos`` elsewhere.

    ``Δ_ij = margin`` or, given the teacher's ``[N, N]`` similarities ``s``, ``(1 − s_ij)·margin``
    (KDMCSE's adaptive margin). The diagonal holds the positives and is never shifted. Unshifted
    entries are returned as the input cosine itself, not ``cos(arccos(·))``: arccos has an
    infinite slope at ±1, so going through it would give NaN gradients for near-identical pairs.
    """
    eye = torch.eye(cos.shape[0], cos.shape[1], dtype=torch.bool, device=cos.device)
    theta = torch.acos(cos.clamp(-1 + 1e-6, 1 - 1e-6))
    shift = ~eye & (theta > margin)
    delta = margin if teacher_similarity is None else (1 - teacher_similarity) * margin
    return torch.where(shift, torch.cos(theta - delta), cos)


@register_loss("arc_margin_info_nce")
class ArcMarginInfoNCELoss(Loss):
    """InfoNCE between dropout views with an additive angular margin on the negatives (KDMCSE ℓ^S).

    Nguyen et al., *KDMCSE: Knowledge Distillation Multimodal Sentence Embeddings with Adaptive
    Angular margin Contrastive Learning* (NAACL 2024, arXiv 2403.17486); authors' code
    ``duyngtr16061999/KDMCSE``, ``src/model.py`` (``ArcSimilarity.calculate_arccos2``):

        ℓ_i = −log  e^{cos θ_ii / τ} / ( e^{cos θ_ii / τ} + Σ_{j≠i} e^{cos(θ_ij − m·[θ_ij > m]) / τ} )

    with ``θ_ij = arccos sim(h_i, h_j⁺)``, ``h = MLP([CLS])`` of dropout view 1 and ``h⁺`` of
    view 2, τ = 0.05. Moving a negative *closer* by ``m`` in angle raises its logit, so the
    positive must win by an angular margin. Negatives already within ``m`` of the anchor
    (θ ≤ m) are left unchanged, exactly as the code does.

    Paper vs code (the default follows the code): the paper motivates the margin ArcCSE-style,
    where the margin is *added to the positive* angle (θ_ii + m, ``calculate_arccos1`` in the
    code, never called); the released model applies ``θ_ij − m`` to the negatives
    (``calculate_arccos2``), which is what this loss computes. The scripts use m = 0.15
    (``--margin1``; the argparse default is 0.1).

    Heads: ``student`` — the SimCSE head (Linear H→H + Tanh), BERT-initialised in the code (its
    ``pooler`` inside ``BertForCL``, set by ``init_weights()``). DALR's released code reuses
    this pooler for ℓ_rank, ℓ_IMA, ℓ_CMA, ℓ_cons and ℓ_g2l: its method names one head for all.

    Inputs: ``view1``, ``view2`` ``[B, H]``. Returns ``{"arc_margin_loss": scalar}``.
    Siblings: with ``margin = 0`` this is exactly :class:`~mmcse.losses.info_nce.SimCSELoss`
    (the cosine is passed through untouched, so even the gradients match). DALR's
    ``arc_margin`` text objective (its code's ``ArcSimilarity`` on the SimCSE term, m = 0.18)
    is this loss too. :class:`~mmcse.losses.adaptive_angular_margin.AdaptiveAngularMarginLoss`
    scales the same margin per pair by a teacher (:func:`angular_margin_logits`).

    Args:
        margin: m, in radians.
        temperature: τ.
    """

    terms = ("arc_margin_loss",)
    slots = {"student": "mlp"}

    def __init__(self, margin: float = 0.15, temperature: float = 0.05) -> None:
        super().__init__()
        self.margin = margin
        self.temperature = temperature

    @staticmethod
    def compute_loss_from_embeddings(
        h1: Tensor, h2: Tensor, margin: float = 0.15, temperature: float = 0.05
    ) -> Tensor:
        """Margin InfoNCE over the batch gathered from every rank (positives on the diagonal)."""
        h1, h2 = gather_across_ranks(h1), gather_across_ranks(h2)
        logits = angular_margin_logits(cosine_matrix(h1, h2).float(), margin) / temperature
        return F.cross_entropy(logits, torch.arange(h1.shape[0], device=h1.device))

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        head = heads["student"]
        h1, h2 = head(inputs.view1), head(inputs.view2)
        loss = self.compute_loss_from_embeddings(h1, h2, self.margin, self.temperature)
        return {"arc_margin_loss": loss}
