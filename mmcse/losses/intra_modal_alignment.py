"""DALR's intra-modal alignment ℓ_IMA (:class:`IntraModalAlignmentLoss`) and the teacher
mixing, student scores and KL that ℓ_rank and ℓ_CMA share with it."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.losses.arc_margin_info_nce import angular_margin_logits
from mmcse.losses.base import Heads, Loss, LossInputs, cosine_matrix, project_views
from mmcse.registry import register_loss

#: DALR's released scripts: first teacher SimCSE with ``--alpha_ 0.33``, second DiffCSE (0.67)
DEFAULT_TEXT_TEACHERS: tuple[tuple[str, float], ...] = (
    ("text_teacher_simcse", 0.33),
    ("text_teacher_diffcse", 0.67),
)
TEACHER_MIXES = ("embeddings", "similarities")


def normalize_teachers(teachers: Sequence[Sequence[object]]) -> tuple[tuple[str, float], ...]:
    """``[(role, weight), ...]`` as a tuple of pairs (configs arrive as JSON lists); non-empty."""
    pairs = tuple((str(role), float(weight)) for role, weight in teachers)
    if not pairs:
        raise ValueError("text_teachers needs at least one (role, weight) pair")
    return pairs


def mixed_teacher_similarity(
    inputs: LossInputs, teachers: Sequence[tuple[str, float]], mix: str = "similarities"
) -> Tensor:
    """``[N, N]`` teacher similarities over the batch gathered from every rank:
    Σ_k w_k cos(t_i^k, t_j^k) (``mix="similarities"``) or cos(Σ_k w_k t_i^k, Σ_k w_k t_j^k)
    (``mix="embeddings"``; the teachers must have one width)."""
    if mix not in TEACHER_MIXES:
        raise ValueError(f"teacher_mix must be one of {TEACHER_MIXES}, not {mix!r}")
    total = None
    for role, weight in teachers:
        features = gather_across_ranks(inputs.feature(role).float())
        if mix == "similarities":
            term = weight * cosine_matrix(features, features)
        elif total is not None and total.shape[-1] != features.shape[-1]:
            raise ValueError(
                f"teacher_mix='embeddings' needs teachers of one width; {role!r} is "
                f"{features.shape[-1]}-d, the others {total.shape[-1]}-d (use 'similarities')"
            )
        else:
            term = weight * features
        total = term if total is None else total + term
    return total if mix == "similarities" else cosine_matrix(total, total)


def student_scores(a: Tensor, b: Tensor, margin: float = 0.0) -> Tensor:
    """``[N, M]`` cos(a_i, b_j), off-diagonal angles reduced by ``margin`` where θ > margin
    (DALR's code's ``ArcSimilarity``; ``margin=0`` leaves the cosines untouched)."""
    cos = cosine_matrix(a.float(), b.float())
    return angular_margin_logits(cos, margin) if margin else cos


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
    """DALR's intra-modal alignment ℓ_IMA: KL from the text teachers' in-batch distribution.

    He et al., *DALR: Dual-level Alignment Learning for Multimodal Sentence Representation
    Learning* (2025), §3.3, eqs. 11–12; authors' code ``Hekang001/DALR``
    (``intra_modal_alignment_loss``):

        ℓ_IMA = (1/N) Σ_i KL( Q_i^{t2t} ‖ P_i^{t2t} )
        P_ij^{t2t} = softmax_j( sim(s_i^z, s_j^{z'}) / τ_s )       (student, two dropout views)
        Q_ij^{t2t} = softmax_j( Σ_k w_k sim(t_i^k, t_j^k) / τ_t )    (cached text teachers k)

    ``s = MLP([CLS])``. The teachers are a weighted mix (``text_teachers``: ``(role, weight)``
    pairs, in the order given). DALR's released scripts (``scripts/run_wiki_{flickr,coco}.sh``)
    pass ``--first_teacher Model/simcse``, ``--second_teacher Model/DiffCSE``, ``--alpha_ 0.33``:
    SimCSE 0.33, DiffCSE 0.67 (:data:`DEFAULT_TEXT_TEACHERS`). ``teacher_mix`` says what is
    mixed: ``"embeddings"`` — the weighted sum of the teachers' [CLS] embeddings, then cosines
    (the paper, §3.3: "a weighted combination of [CLS] token embeddings"; the code for these KL
    targets; needs equal widths) — or ``"similarities"`` — the weighted sum of each teacher's
    cosine matrix (the code's ranking target; works for teachers of different widths). Any
    cached text teacher can be swapped in by mapping it to a role.

    Student margin (``margin``): DALR's code computes the student scores with its
    ``ArcSimilarity`` (``self.sim``, m = ``--margin1`` = 0.18: negatives' angles reduced by m
    where θ > m, as :func:`~mmcse.losses.arc_margin_info_nce.angular_margin_logits`); the
    paper's eq. 11 has plain cosines (``margin=0``, the default of this loss).

    Paper vs code (defaults follow the code, because the paper's form is degenerate):

    * temperatures: eqs. 7/11 apply softmax to raw cosines (τ = 1). Cosines lie in [−1, 1], so
      for a batch of 128 both distributions are nearly uniform and the KL carries almost no
      signal. The code divides the student's cosines by τ = 0.05 and again by 0.45
      (``KLContrastiveSimLoss``), i.e. τ_s = 0.0225, and the teacher's by τ_t = 0.5. Set both to
      1 for the paper's literal form.
    * reduction: eq. 12 sums over anchors; the code (``batchmean``) and mmcse average.
    * student head: in the code ℓ_IMA reads the SimCSE term's pooler (``z1``, ``z2``) with its
      arc margin; the ``dalr`` method wires that shared head and sets ``margin``.

    Heads: ``student`` — Linear H→H + Tanh (BERT-initialised in DALR's methods), on [CLS].

    Inputs: ``view1``, ``view2`` ``[B, H]``; ``features[role]`` ``[B, D_role]`` for every
    teacher role. Returns ``{"ima_loss": scalar}``. Siblings:
    :class:`~mmcse.losses.list_mle_distillation.ListMLEDistillationLoss` (ℓ_rank, the other half
    of ℓ_IML) and :class:`~mmcse.losses.cross_modal_alignment.CrossModalAlignmentLoss` (ℓ_CMA)
    reuse :func:`mixed_teacher_similarity` and :func:`teacher_kl`.

    Args:
        text_teachers: ``(role, weight)`` pairs.
        temperature, teacher_temperature: τ_s, τ_t.
        margin: the student scores' arc margin (0: plain cosines).
        teacher_mix: ``"embeddings"`` or ``"similarities"`` (above).
    """

    requires = tuple(role for role, _ in DEFAULT_TEXT_TEACHERS)
    terms = ("ima_loss",)
    slots = {"student": "mlp"}

    def __init__(
        self,
        text_teachers: Sequence[Sequence[object]] = DEFAULT_TEXT_TEACHERS,
        temperature: float = 0.0225,
        teacher_temperature: float = 0.5,
        margin: float = 0.0,
        teacher_mix: str = "similarities",
    ) -> None:
        super().__init__()
        self.text_teachers = normalize_teachers(text_teachers)
        self.requires = tuple(role for role, _ in self.text_teachers)
        self.temperature = temperature
        self.teacher_temperature = teacher_temperature
        self.margin = margin
        self.teacher_mix = teacher_mix

    @staticmethod
    def compute_loss_from_embeddings(
        h1: Tensor,
        h2: Tensor,
        teacher_similarity: Tensor,
        temperature: float = 0.0225,
        teacher_temperature: float = 0.5,
        margin: float = 0.0,
    ) -> Tensor:
        """KL(Q ‖ P): ``P`` from cos(h1_i, h2_j) (negatives' angles reduced by ``margin``),
        ``Q`` from the teacher's ``[N, N]`` similarities."""
        student = student_scores(h1, h2, margin) / temperature
        return teacher_kl(student, teacher_similarity / teacher_temperature)

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        views = project_views(heads["student"], inputs.view1, inputs.view2)
        h1, h2 = map(gather_across_ranks, views)
        teacher = mixed_teacher_similarity(inputs, self.text_teachers, self.teacher_mix)
        loss = self.compute_loss_from_embeddings(
            h1, h2, teacher, self.temperature, self.teacher_temperature, self.margin
        )
        return {"ima_loss": loss}
