"""DALR's ranking distillation ℓ_rank (:class:`ListMLEDistillationLoss`; :func:`list_mle`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.losses.base import Heads, Loss, LossInputs, project_views
from mmcse.losses.intra_modal_alignment import (
    DEFAULT_TEXT_TEACHERS,
    mixed_teacher_similarity,
    normalize_teachers,
    student_scores,
)
from mmcse.registry import register_loss

#: DALR's released ``ListMLE``: ``self.eps = 1e-7`` inside the log (model_modified.py:186)
RELEASED_LOG_EPS = 1e-7


def list_mle(student_scores: Tensor, teacher_scores: Tensor, log_eps: float = 0.0) -> Tensor:
    """Mean over rows of the ListMLE negative log-likelihood of the teacher's ordering.

    ``log_eps`` > 0 adds ε inside each log after subtracting the row's maximum, as DALR's
    released ``ListMLE``: ``log(Σ_{q ≥ r} exp(S_q − M) + ε) − (S_r − M)``; 0 is exact.
    """
    order = teacher_scores.argsort(dim=-1, descending=True, stable=True)
    ranked = student_scores.float().gather(-1, order)
    if log_eps == 0:  # log Σ_{q ≥ r} exp(ranked_q): a reversed cumulative logsumexp
        tail_lse = ranked.flip(-1).logcumsumexp(dim=-1).flip(-1)
        return (tail_lse - ranked).sum(dim=-1).mean()
    # not detached: with ε > 0 the max no longer cancels, and the code's gradient flows through it
    shifted = ranked - ranked.max(dim=-1, keepdim=True).values
    tail_sum = shifted.exp().flip(-1).cumsum(dim=-1).flip(-1)
    return (torch.log(tail_sum + log_eps) - shifted).sum(dim=-1).mean()


@register_loss("list_mle_distillation")
class ListMLEDistillationLoss(Loss):
    """DALR's ranking distillation ℓ_rank: ListMLE over each anchor's in-batch list, teacher-ranked.

    He et al., *DALR* (2025), §3.3, eq. 10; the ListMLE of Xia et al. (ICML 2008) as RankCSE
    (Liu et al., ACL 2023) uses it for sentence embeddings; authors' code ``kangverse/DALR`` at
    849ece9 (it continues the history of ``Hekang001/DALR``, the paper's link),
    ``src/model_modified.py`` ``ListMLE`` (lines 178–212), ``--distillation_loss listmle`` in
    the scripts. Eq. 10, averaged over anchors:

        ℓ_rank = −(1/N) Σ_i Σ_{r=1}^{N} log  exp(S_i[π_i(r)]) / Σ_{q=r}^{N} exp(S_i[π_i(q)])

    ``S_i[j] = sim(s_i^z, s_j^{z'}) / τ`` is the student's score of candidate ``j`` for anchor
    ``i`` (``s = MLP([CLS])``; τ = 0.05), and ``π_i`` sorts the candidates by the teachers'
    mixed similarity ``Σ_k w_k cos(t_i^k, t_j^k)`` (descending). The list is the whole batch,
    the anchor itself included (the teacher always ranks it first). Only the teacher's *order*
    matters, so its scale is irrelevant.

    The released log-sum (``log_eps``, default 1e-7 = the code's ``self.eps``): with
    ``M_i = max_j S_i[j]`` and ``T_i(r) = Σ_{q ≥ r} exp(S_i[π_i(q)] − M_i)`` (a reversed
    cumulative sum) the code's loss is

        ℓ_rank = (1/N) Σ_i Σ_r [ log(T_i(r) + ε) − (S_i[π_i(r)] − M_i) ]

    — eq. 10 with ``log T`` replaced by ``log(T + ε)``. ε is not negligible: late in the
    teacher's order the tail sums ``T`` fall below ε (a score 16 below the row's maximum,
    i.e. a cosine 0.8 below it at τ = 0.05, gives exp(−16) ≈ 1e-7), so the code floors those
    terms' log at log ε ≈ −16.1 and gives them almost no gradient; the max ``M_i`` no longer
    cancels and carries gradient too (it is not detached, as in the code). The change grows
    with the gap between a list's top (the anchor's own other view, when the views are close)
    and its tail: on random vectors with close views it ranged from +2 % of the loss (B = 128,
    768-d, arc margin 0.18) to +14–30 % (no margin, or 16-d), the gradient turned by up to 60°.
    ``log_eps=0`` is eq. 10 exactly (``dalr-paper``).

    Other paper vs code points: eq. 10 sums over anchors; the code (and mmcse) average. The code
    breaks ties between equal teacher scores by a random shuffle (``torch.randperm``); mmcse
    uses a stable sort (ties keep batch order), so the loss is a deterministic function of its
    inputs — ties need equal teacher scores (duplicate sentences; the scripts' ``--fp16`` casts
    the teacher embeddings to float16, which makes near-equal scores tie more often). The code
    zeroes the terms whose teacher score is exactly −1 (RankCSE's padding marker; never hit by
    a real cosine/τ₂ batch), which mmcse does not reproduce. In the code the student scores are
    the SimCSE term's logits (``student_top1_sim_pred = cos_sim.clone()``: the pooler's
    ``z1·z2`` cosines with the arc margin m = 0.18, over τ = 0.05); the ``dalr`` method wires
    the shared pooler and sets ``margin``, and with a head of its own, ``margin=0`` and
    ``log_eps=0`` this is eq. 10. The teacher order comes from ``teacher_mix``
    (:func:`~mmcse.losses.intra_modal_alignment.mixed_teacher_similarity`): the code ranks by
    the mixed *similarities* (``α·cos₁/τ₂ + (1−α)·cos₂/τ₂``); the paper by the similarity of the
    mixed *embeddings*. ``gamma_`` (1.0) is not a separate knob: the method's term weight scales
    the loss.

    Heads: ``student`` — Linear H→H + Tanh (BERT-initialised in DALR's methods), on [CLS].

    Inputs: ``view1``, ``view2`` ``[B, H]``; ``features[role]`` per teacher role.
    Returns ``{"rank_loss": scalar}``. Siblings:
    :class:`~mmcse.losses.intra_modal_alignment.IntraModalAlignmentLoss` (ℓ_IMA; teacher mixing).

    Args:
        text_teachers: ``(role, weight)`` pairs.
        temperature: τ.
        margin: the student scores' arc margin (0: plain cosines).
        teacher_mix: ``"embeddings"`` or ``"similarities"``.
        log_eps: ε inside the log after the max shift (released: 1e-7; 0: eq. 10 exactly).
    """

    requires = tuple(role for role, _ in DEFAULT_TEXT_TEACHERS)
    terms = ("rank_loss",)
    slots = {"student": "mlp"}

    def __init__(
        self,
        text_teachers: Sequence[Sequence[object]] = DEFAULT_TEXT_TEACHERS,
        temperature: float = 0.05,
        margin: float = 0.0,
        teacher_mix: str = "similarities",
        log_eps: float = RELEASED_LOG_EPS,
    ) -> None:
        super().__init__()
        if log_eps < 0:
            raise ValueError(f"log_eps must be >= 0, not {log_eps}")
        self.text_teachers = normalize_teachers(text_teachers)
        self.requires = tuple(role for role, _ in self.text_teachers)
        self.temperature = temperature
        self.margin = margin
        self.teacher_mix = teacher_mix
        self.log_eps = log_eps

    @staticmethod
    def compute_loss_from_embeddings(
        h1: Tensor,
        h2: Tensor,
        teacher_similarity: Tensor,
        temperature: float = 0.05,
        margin: float = 0.0,
        log_eps: float = RELEASED_LOG_EPS,
    ) -> Tensor:
        """ListMLE of cos(h1_i, h2_j)/τ (negatives' angles reduced by ``margin``) under the
        order of ``teacher_similarity`` ``[N, N]``, ε = ``log_eps`` inside the log."""
        scores = student_scores(h1, h2, margin) / temperature
        return list_mle(scores, teacher_similarity, log_eps)

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        views = project_views(heads["student"], inputs.view1, inputs.view2)
        h1, h2 = map(gather_across_ranks, views)
        with torch.no_grad():
            teacher = mixed_teacher_similarity(inputs, self.text_teachers, self.teacher_mix)
        loss = self.compute_loss_from_embeddings(
            h1, h2, teacher, self.temperature, self.margin, self.log_eps
        )
        return {"rank_loss": loss}
