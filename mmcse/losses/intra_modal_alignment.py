"""DALR's intra-modal alignment ℓ_IMA: KL from the text teachers' in-batch distribution.

He et al., *DALR: Dual-level Alignment Learning for Multimodal Sentence Representation Learning*
(2025), §3.3, eqs. 11–12; authors' code ``Hekang001/DALR`` (``intra_modal_alignment_loss``):

    ℓ_IMA = (1/N) Σ_i KL( Q_i^{t2t} ‖ P_i^{t2t} )
    P_ij^{t2t} = softmax_j( sim(s_i^z, s_j^{z'}) / τ_s )       (student, two dropout views)
    Q_ij^{t2t} = softmax_j( Σ_k w_k sim(t_i^k, t_j^k) / τ_t )    (cached text teachers k)

``s = MLP([CLS])`` (Linear H→H + Tanh, this loss's own head). The teachers are a weighted mix
(``text_teachers``: ``(role, weight)`` pairs); DALR follows RankCSE's release: DiffCSE weight 0.33,
SimCSE 0.67. Teachers are mixed at the level of their similarity matrices, which lets teachers
of different widths be combined (the code mixes the SimCSE/DiffCSE *embeddings* for these KL
targets, and the similarities for the ranking term; with equal-width teachers the two differ only
slightly). Any cached text teacher can be swapped in by mapping it to a role.

Paper vs code (defaults follow the code, because the paper's form is degenerate):

* temperatures: eqs. 7/11 apply softmax to raw cosines (τ = 1). Cosines lie in [−1, 1], so for a
  batch of 128 both distributions are nearly uniform and the KL carries almost no signal. The
  code divides the student's cosines by τ = 0.05 and again by 0.45 (``KLContrastiveSimLoss``),
  i.e. τ_s = 0.0225, and the teacher's by τ_t = 0.5. Set both to 1 for the paper's literal form.
* reduction: eq. 12 sums over anchors; the code (``batchmean``) and mmcse average.
* student head: in the code ℓ_IMA reads the SimCSE term's pooler (with its arc margin when that
  variant is on); here it has its own head, so it can be ablated without touching ℓ_SimCSE.

Inputs: ``view1``, ``view2`` ``[B, H]``; ``features[role]`` ``[B, D_role]`` for every teacher role.
Returns ``{"ima_loss": scalar}``. Siblings: :mod:`list_mle_distillation` (ℓ_rank, the other half of
ℓ_IML) and :mod:`cross_modal_alignment` (ℓ_CMA) reuse :func:`mixed_teacher_similarity` and
:func:`teacher_kl`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.losses.base import Loss, LossInputs, cosine_matrix, project_views
from mmcse.losses.info_nce import MLPHead
from mmcse.registry import register_loss

#: RankCSE's released teacher mix, which DALR says it follows (first teacher DiffCSE, α = 0.33)
DEFAULT_TEXT_TEACHERS: tuple[tuple[str, float], ...] = (
    ("text_teacher_diffcse", 0.33),
    ("text_teacher_simcse", 0.67),
)


def normalize_teachers(teachers: Sequence[Sequence[object]]) -> tuple[tuple[str, float], ...]:
    """``[(role, weight), ...]`` as a tuple of pairs (configs arrive as JSON lists); non-empty."""
    pairs = tuple((str(role), float(weight)) for role, weight in teachers)
    if not pairs:
        raise ValueError("text_teachers needs at least one (role, weight) pair")
    return pairs


def mixed_teacher_similarity(inputs: LossInputs, teachers: Sequence[tuple[str, float]]) -> Tensor:
    """``[N, N]`` Σ_k w_k cos(t_i^k, t_j^k) over the batch gathered from every rank."""
    total = None
    for role, weight in teachers:
        features = gather_across_ranks(inputs.feature(role).float())
        term = weight * cosine_matrix(features, features)
        total = term if total is None else total + term
    return total


def teacher_kl(student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
    """Mean over rows of KL(softmax(teacher_logits) ‖ softmax(student_logits))."""
    return F.kl_div(
        F.log_softmax(student_logits.float(), dim=-1),
        F.log_softmax(teacher_logits.float(), dim=-1),
        reduction="batchmean",
        log_target=True,
    )


@register_loss("intra_modal_alignment")
class IntraModalAlignmentLoss(Loss):
    requires = tuple(role for role, _ in DEFAULT_TEXT_TEACHERS)
    terms = ("ima_loss",)

    def __init__(
        self,
        hidden_size: int,
        text_teachers: Sequence[Sequence[object]] = DEFAULT_TEXT_TEACHERS,
        temperature: float = 0.0225,
        teacher_temperature: float = 0.5,
        **_: object,
    ) -> None:
        super().__init__()
        self.text_teachers = normalize_teachers(text_teachers)
        self.requires = tuple(role for role, _ in self.text_teachers)
        self.temperature = temperature
        self.teacher_temperature = teacher_temperature
        self.mlp = MLPHead(hidden_size, hidden_size)

    @staticmethod
    def compute_loss_from_embeddings(
        h1: Tensor,
        h2: Tensor,
        teacher_similarity: Tensor,
        temperature: float = 0.0225,
        teacher_temperature: float = 0.5,
    ) -> Tensor:
        """KL(Q ‖ P) with ``P`` from cos(h1_i, h2_j) and ``Q`` from the teacher's ``[N, N]``."""
        student = cosine_matrix(h1.float(), h2.float()) / temperature
        return teacher_kl(student, teacher_similarity / teacher_temperature)

    def forward(self, inputs: LossInputs) -> dict[str, Tensor]:
        h1, h2 = map(gather_across_ranks, project_views(self.mlp, inputs.view1, inputs.view2))
        teacher = mixed_teacher_similarity(inputs, self.text_teachers)
        loss = self.compute_loss_from_embeddings(
            h1, h2, teacher, self.temperature, self.teacher_temperature
        )
        return {"ima_loss": loss}
