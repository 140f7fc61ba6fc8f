"""DALR's cross-modal alignment ℓ_CMA (:class:`CrossModalAlignmentLoss`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.errors import MmcseError
from mmcse.losses.base import Heads, Loss, LossInputs, cosine_matrix, project_features
from mmcse.losses.intra_modal_alignment import (
    DEFAULT_TEXT_TEACHERS,
    mixed_teacher_similarity,
    normalize_teachers,
    student_scores,
    teacher_kl,
)
from mmcse.registry import register_loss

PAIRINGS = ("released", "paper")


@register_loss("cross_modal_alignment")
class CrossModalAlignmentLoss(Loss):
    """DALR's cross-modal alignment ℓ_CMA: the student's text↔image distributions distilled from
    the text and image teachers' in-batch distributions.

    He et al., *DALR* (2025), §3.2, eqs. 6–8; authors' code ``kangverse/DALR`` at 849ece9 (the
    history of ``Hekang001/DALR``, the paper's link, continued), ``src/model_modified.py``
    lines 741–750 (``cross_modal_alignment_loss``):

        S_ij   = sim(s_i, v_j) / τ_s                         (caption i, image j)
        ℓ_CMA  = ½ [ (1/N) Σ_i KL(Q_i^{t2t} ‖ softmax_j S_ij) + (1/N) Σ_j KL(Q_j^{v2v} ‖ softmax_i S_ij) ]
        Q^{t2t} = softmax(Σ_k w_k cos(t^k_i, t^k_j) / τ_t),  Q^{v2v} = softmax(cos(v_i, v_j) / τ_t)

    ``s`` is dropout view 1's [CLS] through the ``student`` head; ``v`` is the cached image
    feature (role ``image``) — raw, or through the ``image`` head when the method gives one.
    Text-anchored rows are matched to the text teachers, image-anchored rows (the transpose,
    eq. 8's ``(P^{t2v})ᵀ``) to the image teacher; pairs are aligned, so index ``j`` means both
    caption ``j`` and its image.

    Paper vs code (defaults follow the code where the paper is degenerate or silent):

    * image side (the ``image`` slot is optional): the code compares ``z1``, its SimCSE pooler
      output (768-d, BERT-base), with the *raw* CLIP image feature (line 745:
      ``self.sim(z1, vis_feats_t)``) — possible only because its scripts' teacher is CLIP
      ViT-L/14, whose image embedding is 768-d too (``flickr30k_ViT_L14.json``,
      ``train_coco_ViT_L14.json``). Without an image head this loss does the same and refuses
      a student head whose width differs from the image feature's. The paper (eq. 6, App. B)
      projects both into a shared 256-d space: ``s = norm(g_θ(f_θ(x, z)))`` and
      ``h^v = norm(g_v(v))`` (Linear + Tanh heads) with a CLIP ViT-B/32 (512-d) teacher — give
      the ``image`` head (``dalr``'s ``cma_image_head=True``; ``dalr-paper`` shares eq. 3's).
    * temperatures: eqs. 6–7 use raw cosines (τ = 1, a near-uniform softmax); the code uses
      τ_s = 0.05 × 0.45 = 0.0225 on the student and τ_t = 0.5 on the teachers (the default here).
    * pairing (``pairing``): the code (``"released"``, default) matches the *text*-anchored rows
      ``softmax_j S_ij`` to the text teacher and the *image*-anchored rows (``S.T``) to the image
      teacher — the formula above. Eqs. 6/8 as printed (``"paper"``) do the opposite: eq. 6
      defines ``P_i^{t2v}`` as image ``i``'s distribution over texts ``j``
      (``softmax_j sim(s_j, h_i^v)``), which eq. 8 matches to ``Q_i^{t2t}``, and matches
      ``(P^{t2v})ᵀ`` to ``Q^{v2v}``; a column of a row-stochastic matrix is not a distribution,
      so mmcse reads ``(P^{t2v})ᵀ`` as the softmax of the transposed scores (text ``i`` over
      images ``j``): ``½ [KL(Q^{t2t} ‖ softmax(Sᵀ)) + KL(Q^{v2v} ‖ softmax(S))]``.
    * student margin (``margin``): the code's ``S`` is its ``ArcSimilarity`` (``self.sim``,
      m = 0.18 on the off-diagonal angles where θ > m); eq. 6 has plain cosines (``margin=0``).
    * teachers: the code uses the *embedding*-mixed text teachers (line 742);
      ``teacher_mix`` picks mixed embeddings (paper and code) or mixed similarities
      (:func:`~mmcse.losses.intra_modal_alignment.mixed_teacher_similarity`). The teacher
      targets always use the frozen cached features (eq. 7 writes ``h^t``, ``h^v`` of eq. 3,
      whose heads are trainable; a trainable target could be collapsed by the KL, and the code
      uses the frozen features).
    * reduction: eq. 8 sums over anchors; code and mmcse average (``batchmean``).

    Heads: ``student`` (H→d, on [CLS]) and, optionally, ``image`` (D→d, on the cached image
    feature), of one output width; without ``image`` the student head's width must be the image
    feature's.

    ℓ_CML = ℓ_cons + ℓ_CMA (eq. 9) is composed by the method from this loss and
    :class:`~mmcse.losses.image_text_consistency.ImageTextConsistencyLoss`. Inputs: ``view1``
    ``[B, H]``, ``features[image_role]`` and every text-teacher role. Returns
    ``{"cma_loss": scalar}``. Caption batches only.

    Args:
        image_role: the cached image feature role.
        text_teachers: ``(role, weight)`` pairs.
        temperature, teacher_temperature: τ_s, τ_t.
        margin: the student scores' arc margin (0: plain cosines).
        pairing: ``"released"`` or ``"paper"`` (above).
        teacher_mix: ``"embeddings"`` or ``"similarities"``.
    """

    requires = ("image", *(role for role, _ in DEFAULT_TEXT_TEACHERS))
    terms = ("cma_loss",)
    slots = {"student": "mlp", "image": "mlp"}
    optional_slots = ("image",)  # empty: the raw image feature (the released code)

    def __init__(
        self,
        image_role: str = "image",
        text_teachers: Sequence[Sequence[object]] = DEFAULT_TEXT_TEACHERS,
        temperature: float = 0.0225,
        teacher_temperature: float = 0.5,
        margin: float = 0.0,
        pairing: str = "released",
        teacher_mix: str = "similarities",
    ) -> None:
        super().__init__()
        if pairing not in PAIRINGS:
            raise ValueError(f"pairing must be one of {PAIRINGS}, not {pairing!r}")
        self.image_role = image_role
        self.text_teachers = normalize_teachers(text_teachers)
        self.requires = (image_role, *(role for role, _ in self.text_teachers))
        self.temperature = temperature
        self.teacher_temperature = teacher_temperature
        self.margin, self.pairing, self.teacher_mix = margin, pairing, teacher_mix

    @staticmethod
    def compute_loss_from_embeddings(
        text: Tensor,
        image: Tensor,
        text_teacher_similarity: Tensor,
        image_teacher_similarity: Tensor,
        temperature: float = 0.0225,
        teacher_temperature: float = 0.5,
        margin: float = 0.0,
        pairing: str = "released",
    ) -> Tensor:
        """½ [KL(Q^{t2t} ‖ ·) + KL(Q^{v2v} ‖ ·)] over the text→image scores ``S`` and ``Sᵀ``,
        paired as ``pairing`` says; ``text``/``image`` projected."""
        scores = student_scores(text, image, margin) / temperature
        text_rows, image_rows = (scores, scores.T) if pairing == "released" else (scores.T, scores)
        text_part = teacher_kl(text_rows, text_teacher_similarity / teacher_temperature)
        image_part = teacher_kl(image_rows, image_teacher_similarity / teacher_temperature)
        return (text_part + image_part) / 2

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        raw_image = inputs.feature(self.image_role)
        text = gather_across_ranks(heads["student"](inputs.view1))
        teacher_image = gather_across_ranks(raw_image.float())  # frozen: no gradient
        if "image" in heads:
            image = gather_across_ranks(project_features(heads["image"], raw_image))
        elif teacher_image.shape[-1] == text.shape[-1]:
            image = teacher_image
        else:
            raise MmcseError(
                f"ℓ_CMA without an image head compares the {text.shape[-1]}-d student head "
                f"output with the raw {self.image_role!r} feature, which is "
                f"{teacher_image.shape[-1]}-d: use an image teacher of that width (the released "
                "code's CLIP ViT-L/14 is 768-d) or give the term an image head (DALR: "
                "cma_image_head=true)"
            )
        with torch.no_grad():
            image_similarity = cosine_matrix(teacher_image, teacher_image)
            text_similarity = mixed_teacher_similarity(inputs, self.text_teachers, self.teacher_mix)
        loss = self.compute_loss_from_embeddings(
            text,
            image,
            text_similarity,
            image_similarity,
            self.temperature,
            self.teacher_temperature,
            self.margin,
            self.pairing,
        )
        return {"cma_loss": loss}
