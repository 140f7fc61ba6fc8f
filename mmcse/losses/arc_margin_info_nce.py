"""InfoNCE between dropout views with an additive angular margin on the negatives (KDMCSE ℓ^S).

Nguyen et al., *KDMCSE: Knowledge Distillation Multimodal Sentence Embeddings with Adaptive
Angular margin Contrastive Learning* (NAACL 2024, arXiv 2403.17486); authors' code
``duyngtr16061999/KDMCSE``, ``src/model.py`` (``ArcSimilarity.calculate_arccos2``):

    ℓ_i = −log  e^{cos θ_ii / τ} / ( e^{cos θ_ii / τ} + Σ_{j≠i} e^{cos(θ_ij − m·[θ_ij > m]) / τ} )

with ``θ_ij = arccos sim(h_i, h_j⁺)``, ``h = MLP([CLS])`` of dropout view 1 and ``h⁺`` of view 2
(the SimCSE head, Linear H→H + Tanh), τ = 0.05. Moving a negative *closer* by ``m`` in angle
raises its logit, so the positive must win by an angular margin. Negatives already within ``m`` of
the anchor (θ ≤ m) are left unchanged, exactly as the code does.

Paper vs code (the default follows the code): the paper motivates the margin ArcCSE-style, where
the margin is *added to the positive* angle (θ_ii + m, ``calculate_arccos1`` in the code, never
called); the released model applies ``θ_ij − m`` to the negatives (``calculate_arccos2``), which is
what this loss computes. The scripts use m = 0.15 (``--margin1``; the argparse default is 0.1).

With ``margin = 0`` this is exactly :class:`~mmcse.losses.info_nce.SimCSELoss` (the cosine is
passed through untouched, so even the gradients match). DALR's ``arc_margin`` text objective
(its code's ``ArcSimilarity`` on the SimCSE term, m = 0.18) is this loss too.

The MLP head is BERT-initialised (``head_init="bert"``: it is the code's ``pooler`` inside
``BertForCL``, set by ``init_weights()``); ``student_head`` names a head shared with other terms
(DALR's released code reuses this pooler for ℓ_rank, ℓ_IMA, ℓ_CMA, ℓ_cons; :mod:`heads`).

Inputs: ``view1``, ``view2`` ``[B, H]``. Returns ``{"arc_margin_loss": scalar}``.
Siblings: :mod:`adaptive_angular_margin` (the same margin, scaled per pair by a teacher) uses
:func:`angular_margin_logits`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.losses.base import Loss, LossInputs, cosine_matrix
from mmcse.losses.heads import resolve_head
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
    terms = ("arc_margin_loss",)

    def __init__(
        self,
        hidden_size: int,
        margin: float = 0.15,
        temperature: float = 0.05,
        head_init: str = "bert",
        student_head: str | None = None,
        student_head_dim: int | None = None,
        shared_heads: dict | None = None,
        **_: object,
    ) -> None:
        super().__init__()
        self.margin = margin
        self.temperature = temperature
        out = student_head_dim if student_head else hidden_size
        self.mlp = resolve_head(shared_heads, student_head, hidden_size, out, head_init)

    @staticmethod
    def compute_loss_from_embeddings(
        h1: Tensor, h2: Tensor, margin: float = 0.15, temperature: float = 0.05
    ) -> Tensor:
        """Margin InfoNCE over the batch gathered from every rank (positives on the diagonal)."""
        h1, h2 = gather_across_ranks(h1), gather_across_ranks(h2)
        logits = angular_margin_logits(cosine_matrix(h1, h2).float(), margin) / temperature
        return F.cross_entropy(logits, torch.arange(h1.shape[0], device=h1.device))

    def forward(self, inputs: LossInputs) -> dict[str, Tensor]:
        h1, h2 = self.mlp(inputs.view1), self.mlp(inputs.view2)
        loss = self.compute_loss_from_embeddings(h1, h2, self.margin, self.temperature)
        return {"arc_margin_loss": loss}
