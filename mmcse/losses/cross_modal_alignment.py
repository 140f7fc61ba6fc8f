"""DALR's cross-modal alignment ℓ_CMA: the student's text↔image distributions distilled from
the text and image teachers' in-batch distributions.

He et al., *DALR* (2025), §3.2, eqs. 6–8; authors' code ``Hekang001/DALR``
(``cross_modal_alignment_loss``):

    S_ij   = sim(s_i, h_j^v) / τ_s                       (text i, image j, 256-d shared space)
    ℓ_CMA  = ½ [ (1/N) Σ_i KL(Q_i^{t2t} ‖ softmax_j S_ij) + (1/N) Σ_j KL(Q_j^{v2v} ‖ softmax_i S_ij) ]
    Q^{t2t} = softmax(Σ_k w_k cos(t^k_i, t^k_j) / τ_t),  Q^{v2v} = softmax(cos(v_i, v_j) / τ_t)

``s = norm(g_θ(f_θ(x, z)))`` is dropout view 1's [CLS] through a Linear H→256 + Tanh head and
``h^v = norm(g_v(v))`` the cached image feature (role ``image``: CLIP ViT-B/32 in the paper,
ResNet-50 in App. E.2) through a Linear D→256 + Tanh head (App. B). Text-anchored rows are matched
to the text teachers, image-anchored rows (the transpose, eq. 8's ``(P^{t2v})ᵀ``) to the image
teacher; pairs are aligned, so index ``j`` means both caption ``j`` and its image.

Paper vs code (defaults follow the code where the paper is degenerate or silent):

* temperatures: eqs. 6–7 use raw cosines (τ = 1, a near-uniform softmax); the code uses
  τ_s = 0.05 × 0.45 = 0.0225 on the student and τ_t = 0.5 on the teachers (the default here).
* representations: the code compares the SimCSE pooler output of view 1 directly with the raw
  image feature (it only runs when both are 768-d) and uses the *embedding*-mixed teachers; mmcse
  follows the paper's projected 256-d space and mixes teacher *similarities*
  (:func:`~mmcse.losses.intra_modal_alignment.mixed_teacher_similarity`).
* reduction: eq. 8 sums over anchors; code and mmcse average (``batchmean``).

ℓ_CML = ℓ_cons + ℓ_CMA (eq. 9) is composed by the method from this loss and
:mod:`image_text_consistency`. Inputs: ``view1`` ``[B, H]``, ``features[image_role]`` and every
text-teacher role. Returns ``{"cma_loss": scalar}``. Caption batches only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.losses.base import Loss, LossInputs, cosine_matrix
from mmcse.losses.info_nce import MLPHead
from mmcse.losses.intra_modal_alignment import (
    DEFAULT_TEXT_TEACHERS,
    mixed_teacher_similarity,
    normalize_teachers,
    teacher_kl,
)
from mmcse.registry import register_loss


@register_loss("cross_modal_alignment")
class CrossModalAlignmentLoss(Loss):
    requires = ("image", *(role for role, _ in DEFAULT_TEXT_TEACHERS))
    terms = ("cma_loss",)

    def __init__(
        self,
        hidden_size: int,
        feature_dims: dict[str, int],
        image_role: str = "image",
        text_teachers: Sequence[Sequence[object]] = DEFAULT_TEXT_TEACHERS,
        proj_dim: int = 256,
        temperature: float = 0.0225,
        teacher_temperature: float = 0.5,
        **_: object,
    ) -> None:
        super().__init__()
        self.image_role = image_role
        self.text_teachers = normalize_teachers(text_teachers)
        self.requires = (image_role, *(role for role, _ in self.text_teachers))
        self.temperature = temperature
        self.teacher_temperature = teacher_temperature
        self.text_head = MLPHead(hidden_size, proj_dim)
        self.image_head = MLPHead(feature_dims[image_role], proj_dim)

    @staticmethod
    def compute_loss_from_embeddings(
        text: Tensor,
        image: Tensor,
        text_teacher_similarity: Tensor,
        image_teacher_similarity: Tensor,
        temperature: float = 0.0225,
        teacher_temperature: float = 0.5,
    ) -> Tensor:
        """½ [KL(Q^{t2t} ‖ P^{t2v}) + KL(Q^{v2v} ‖ P^{v2t})]; ``text``/``image`` projected."""
        scores = cosine_matrix(text.float(), image.float()) / temperature
        text_to_image = teacher_kl(scores, text_teacher_similarity / teacher_temperature)
        image_to_text = teacher_kl(scores.T, image_teacher_similarity / teacher_temperature)
        return (text_to_image + image_to_text) / 2

    def forward(self, inputs: LossInputs) -> dict[str, Tensor]:
        raw_image = inputs.feature(self.image_role)
        text = gather_across_ranks(self.text_head(inputs.view1))
        image = gather_across_ranks(self.image_head(raw_image.to(self.image_head[0].weight.dtype)))
        with torch.no_grad():
            teacher_image = gather_across_ranks(raw_image.float())
            image_similarity = cosine_matrix(teacher_image, teacher_image)
            text_similarity = mixed_teacher_similarity(inputs, self.text_teachers)
        loss = self.compute_loss_from_embeddings(
            text,
            image,
            text_similarity,
            image_similarity,
            self.temperature,
            self.teacher_temperature,
        )
        return {"cma_loss": loss}
