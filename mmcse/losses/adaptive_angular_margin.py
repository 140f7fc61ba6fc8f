"""KDMCSE's grounding objective AdapACSE (:class:`AdaptiveAngularMarginLoss`) and its
false-negative filter (:func:`false_negative_mask`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmcse.distributed import gather_across_ranks
from mmcse.losses.arc_margin_info_nce import angular_margin_logits
from mmcse.losses.base import (
    Heads,
    Loss,
    LossInputs,
    cosine_matrix,
    l2_normalize,
    project_features,
    project_views,
)
from mmcse.registry import register_loss


def false_negative_mask(anchors: Tensor, candidates: Tensor, threshold: float | None) -> Tensor:
    """``[N, N]`` True where candidate ``j`` is a false negative of anchor ``i`` (never ``i = i``)."""
    n = anchors.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=anchors.device)
    if threshold is None:
        return torch.zeros_like(eye)
    return ~eye & (cosine_matrix(anchors.float(), candidates.float()) > threshold)


@register_loss("adaptive_angular_margin")
class AdaptiveAngularMarginLoss(Loss):
    """AdapACSE: KDMCSE's grounding objective with teacher-scaled angular margins (ℓ^{V} + ℓ^{C}).

    Nguyen et al., *KDMCSE* (NAACL 2024, arXiv 2403.17486), AdapACSE; authors' code
    ``duyngtr16061999/KDMCSE`` (``src/model.py``: ``MCSE.compute_loss``, ``ArcSimilarity``;
    ``src/train_mix.py``: the collator that builds the teacher score matrices).

    For each dropout view ``z ∈ {z, z'}`` the grounded sentence ``p^z = norm(g(f(x, z)))`` (a
    Linear H→256 + Tanh head on [CLS]) is contrasted with a cached CLIP target ``k`` projected by
    its own Linear + Tanh head into the same 256-d space and L2-normalised:

        ℓ_i(k) = −log  e^{cos θ_ii / τ} / ( e^{cos θ_ii / τ} + Σ_{j≠i, j∉F_i} e^{cos(θ_ij − Δ_ij) / τ} )
        Δ_ij   = (1 − s_ij)·m    where θ_ij > m (else 0),

    ``θ_ij = arccos sim(p_i^z, k_j)``, ``s_ij`` the *teacher's* cosine between targets ``i`` and
    ``j`` (so near-duplicate negatives get almost no margin, unrelated ones the full ``m``),
    τ = 0.05 and ``F_i`` the filtered false negatives (below). Two targets, one grounding head:

    * ``image_margin_loss``: ``k`` = CLIP image features (role ``clip_image``), ``s`` =
      image–image.
    * ``text_margin_loss``: ``k`` = CLIP text features of the captions (role ``clip_text``),
      ``s`` = caption–caption. Omitted when ``text_role=None`` (DALR's ``adapacse`` variant uses
      the image half alone on its image teacher).

    Each is the mean over the two views; KDMCSE's total is ``ℓ^S + λ·(image + text)`` with
    λ = 0.01. Teacher similarities come from the cached features of the batch's rows (no teacher
    forward pass), always L2-normalised first.

    False-negative filter (``false_negative_threshold``, off by default): negative ``j`` of
    anchor ``i`` is dropped from the denominator when the teacher's *normalised* cosine between
    the anchor's CLIP text and candidate ``j``'s CLIP image (image target) — or between the
    anchor's CLIP image and candidate ``j``'s CLIP text (text target) — exceeds the threshold.
    Positives are never filtered.

    Paper vs code (defaults follow the authors' released scripts ``scripts/run_wiki_*.sh``):

    * margin: paper ``Δ_ij = |1 − α_ij|·m``; code ``(1 − s_ij)·m`` applied only where
      ``θ_ij > m``. Equal for cosines (α ≤ 1); the ``θ > m`` gate is the code's and is kept.
    * views: the code *averages* the two views' cross-entropies (MCSE's eq. 3 and
      :class:`~mmcse.losses.image_text_info_nce.ImageTextInfoNCELoss` sum them); averaged here.
    * filter: the paper presents threshold filtering as part of KDMCSE; the released scripts do
      not pass ``--using_threshhold``, so it is off by default. The code thresholds the *raw* dot
      product of unnormalised CLIP ViT-L/14 features (``--score_base 0.8``, argparse default 70),
      whose scale depends on the feature norms; mmcse thresholds the normalised cosine instead,
      so a threshold means the same thing for every cached teacher (CLIP image–text cosines of
      matching pairs are typically 0.25–0.35).
    * margins: scripts m1 = m2 = 0.15 (argparse defaults 0.1); temperatures τ = τ_vl = 0.05.

    Heads (PyTorch-default init, as the code's, 256-d in KDMCSE): ``student`` — the grounding
    head on [CLS] (H→d); ``image`` — on the ``image_role`` feature (D_v→d); ``text`` — on the
    ``text_role`` feature (D_t→d; absent when ``text_role=None``).

    Inputs: ``view1``, ``view2`` ``[B, H]``; ``features[image_role]`` ``[B, D_v]``,
    ``features[text_role]`` ``[B, D_t]``. Returns ``{"image_margin_loss", "text_margin_loss"}``.
    Siblings: :class:`~mmcse.losses.arc_margin_info_nce.ArcMarginInfoNCELoss` (constant margin,
    text–text; :func:`~mmcse.losses.arc_margin_info_nce.angular_margin_logits`),
    :class:`~mmcse.losses.image_text_info_nce.ImageTextInfoNCELoss` (MCSE: no margin, no filter).

    Args:
        image_role, text_role: the cached CLIP image and caption feature roles
            (``text_role=None``: the image half alone).
        margin: m, in radians.
        temperature: τ.
        false_negative_threshold: the filter's cosine threshold; ``None`` switches it off.
    """

    requires = ("clip_image", "clip_text")
    terms = ("image_margin_loss", "text_margin_loss")
    slots = {"student": "mlp", "image": "mlp", "text": "mlp"}

    def __init__(
        self,
        image_role: str = "clip_image",
        text_role: str | None = "clip_text",
        margin: float = 0.15,
        temperature: float = 0.05,
        false_negative_threshold: float | None = None,
    ) -> None:
        super().__init__()
        if false_negative_threshold is not None and text_role is None:
            raise ValueError("the false-negative filter compares image and text teacher features")
        self.image_role, self.text_role = image_role, text_role
        if text_role is None:
            self.requires = (image_role,)
            self.terms = ("image_margin_loss",)
            self.slots = {"student": "mlp", "image": "mlp"}
        else:
            self.requires = (image_role, text_role)
        self.margin = margin
        self.temperature = temperature
        self.threshold = false_negative_threshold

    @staticmethod
    def compute_loss_from_embeddings(
        text_views: list[Tensor],
        targets: Tensor,
        teacher_targets: Tensor,
        margin: float = 0.15,
        temperature: float = 0.05,
        false_negatives: Tensor | None = None,
    ) -> Tensor:
        """Mean over views of the margin InfoNCE ``view → targets`` (row ``i`` ↔ row ``i``).

        ``text_views`` and ``targets`` are projected (normalised here); ``teacher_targets`` are the
        raw cached teacher features whose cosines scale the margins; ``false_negatives`` an
        optional ``[N, N]`` mask of negatives to drop. All are already gathered across ranks.
        """
        teacher_similarity = cosine_matrix(teacher_targets.float(), teacher_targets.float())
        targets = l2_normalize(targets.float())
        labels = torch.arange(targets.shape[0], device=targets.device)
        losses = []
        for view in text_views:
            cos = l2_normalize(view.float()) @ targets.T
            logits = angular_margin_logits(cos, margin, teacher_similarity) / temperature
            if false_negatives is not None:
                logits = logits.masked_fill(false_negatives, float("-inf"))
            losses.append(F.cross_entropy(logits, labels))
        return torch.stack(losses).mean()

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        # project locally, then gather (as MCSE's term does): every rank's loss is the global one
        views = [
            gather_across_ranks(v)
            for v in project_views(heads["student"], inputs.view1, inputs.view2)
        ]
        image, image_keys = self._gathered(inputs, self.image_role, heads["image"])
        if self.text_role is None:
            loss = self.compute_loss_from_embeddings(
                views, image_keys, image, self.margin, self.temperature
            )
            return {"image_margin_loss": loss}
        text, text_keys = self._gathered(inputs, self.text_role, heads["text"])
        return {
            "image_margin_loss": self.compute_loss_from_embeddings(
                views,
                image_keys,
                image,
                self.margin,
                self.temperature,
                false_negative_mask(text, image, self.threshold),
            ),
            "text_margin_loss": self.compute_loss_from_embeddings(
                views,
                text_keys,
                text,
                self.margin,
                self.temperature,
                false_negative_mask(image, text, self.threshold),
            ),
        }

    @staticmethod
    def _gathered(inputs: LossInputs, role: str, head: nn.Module) -> tuple[Tensor, Tensor]:
        """(raw teacher features, their projection), both gathered across ranks."""
        raw = inputs.feature(role)
        keys = project_features(head, raw)
        return gather_across_ranks(raw.float()), gather_across_ranks(keys)
