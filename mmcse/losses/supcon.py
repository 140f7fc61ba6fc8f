"""Supervised contrastive loss over two views of labelled non-linguistic examples
(:class:`SupConLoss`)."""

from __future__ import annotations

import torch
from torch import Tensor

from mmcse.losses.base import Heads, Loss, LossInputs, l2_normalize
from mmcse.registry import register_loss


@register_loss("supcon")
class SupConLoss(Loss):
    """Supervised contrastive loss (SupCon) over two views of labelled non-linguistic examples.

    Khosla et al., *Supervised Contrastive Learning* (NeurIPS 2020), eq. 2 (ℒ^sup_out), as used
    by VisualCSE/AudioCSE (Jian et al., NeurIPS 2022, §3.3 and App. B) for class-labelled images
    (ImageNet subset, CIFAR) or audio (LibriSpeech speakers). With the ``2N`` views
    ``z = normalize(MLP([CLS]))`` of ``N`` examples and ``A(a)`` every view but ``a``:

        ℓ = 1/2N Σ_a  −1/|P(a)| Σ_{p ∈ P(a)} log  exp(z_a·z_p/τ) / Σ_{k ∈ A(a)} exp(z_a·z_k/τ)

    where ``P(a)`` are the views ≠ ``a`` with ``a``'s label (always including ``a``'s other
    view). τ = 0.07. Without labels every example is its own class and this is SimCLR's NT-Xent
    over ``2N`` anchors.

    Paper vs code, and what this loss follows:

    * The paper's eq. 4 writes a different ratio (positives summed in the numerator, only
      different-class cross-view pairs in the denominator), which is not a normalised likelihood
      (it can exceed 1). We implement SupCon as published by Khosla et al., which is the
      ``SupConLoss`` the authors ship (Tian's reference implementation). Its τ/τ_base rescale is
      omitted: it is 1 at the defaults (τ = τ_base = 0.07).
    * The published runs pass ``--new_supcon``, whose "SupCon" is a cross-entropy over
      cos(f'_i, f''_j)/τ with target = the rank of ``i``'s label among the batch's distinct
      labels (an arbitrary column, not a positive):
      :class:`~mmcse.losses.class_rank_cross_entropy.ClassRankCrossEntropyLoss`, VisualCSE's and
      AudioCSE's default. This loss is the code's path without ``--new_supcon`` (Tian's
      ``SupConLoss`` on normalised features, ``VisualCSE/src/trainers.py`` line 579 at 3e1e01c)
      and the paper's name.
    * As the paper notes (§4.4), with batch 48 and 60 classes same-class pairs are rare, so
      SupCon and SimCLR (:class:`~mmcse.losses.simclr.SimCLRLoss`) give similar results.

    Heads: ``student`` — the task's image MLP (Linear H→H + Tanh, BERT-initialised as the
    authors' ``image_mlp``), as in :class:`~mmcse.losses.simclr.SimCLRLoss`.

    Inputs: ``view1``, ``view2`` ``[B, H]`` ([CLS] of the two views); ``extras["labels"]``
    ``[B]`` integer class ids (optional, see above). Returns ``{"supcon_loss": scalar}``.

    Args:
        temperature: τ.
    """

    terms = ("supcon_loss",)
    slots = {"student": "mlp"}

    def __init__(self, temperature: float = 0.07) -> None:
        super().__init__()
        self.temperature = temperature

    @staticmethod
    def compute_loss_from_embeddings(
        f1: Tensor, f2: Tensor, labels: Tensor | None = None, temperature: float = 0.07
    ) -> Tensor:
        """SupCon ℒ^sup_out over the ``2N`` views ``[f1; f2]`` (labels ``None``: NT-Xent)."""
        n = f1.shape[0]
        if labels is None:
            labels = torch.arange(n, device=f1.device)
        z = l2_normalize(torch.cat([f1, f2]).float())
        is_self = torch.eye(2 * n, dtype=torch.bool, device=z.device)
        logits = (z @ z.T / temperature).masked_fill(is_self, float("-inf"))
        log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
        both = torch.cat([labels, labels]).to(z.device)
        positive = (both[:, None] == both[None, :]) & ~is_self
        per_anchor = log_prob.masked_fill(~positive, 0.0).sum(1) / positive.sum(1)
        return -per_anchor.mean()

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        head = heads["student"]
        f1, f2 = head(inputs.view1), head(inputs.view2)
        labels = inputs.extras.get("labels")
        loss = self.compute_loss_from_embeddings(f1, f2, labels, self.temperature)
        return {"supcon_loss": loss}
