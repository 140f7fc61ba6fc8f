"""MCSEO's object–phrase InfoNCE (:class:`ObjectPhraseInfoNCELoss`; :func:`mean_over_spans`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mmcse.losses.base import (
    Heads,
    Loss,
    LossInputs,
    l2_normalize,
    project_features,
    project_views,
)
from mmcse.losses.image_text_info_nce import VIEW_REDUCTIONS
from mmcse.registry import register_loss

MIN_PAIRS = 2


def mean_over_spans(token_states: Tensor, spans: Tensor) -> Tensor:
    """``[B, P, H]`` mean of ``token_states`` ``[B, L, H]`` over each ``[start, end)`` of
    ``spans`` ``[B, P, 2]`` (padded spans give zeros)."""
    positions = torch.arange(token_states.shape[1], device=token_states.device)
    inside = (positions >= spans[..., :1]) & (positions < spans[..., 1:])  # [B, P, L]
    weights = inside.to(token_states.dtype)
    counts = weights.sum(-1, keepdim=True).clamp_min(1)
    return torch.bmm(weights, token_states) / counts


@register_loss("object_phrase_info_nce")
class ObjectPhraseInfoNCELoss(Loss):
    """MCSEO's object–phrase InfoNCE: each phrase against the objects of its own image–caption pair.

    Zhao, Miao & Tsuruoka, *Improving Multimodal Contrastive Learning of Sentence Embeddings with
    Object-Phrase Alignment* (MCSEO), eq. 7:

        ℓ_i^obj-phra = − Σ_k  log  exp(sim(h_p^{i,k}, h_o^{i,k})/τ) / Σ_{j=1..K_i} exp(sim(h_p^{i,k}, h_o^{i,j})/τ)

    for image–caption pair ``i`` with ``K_i`` object–phrase pairs: phrase ``k``'s positive is its
    own object, its negatives the other objects *of the same pair* (never other pairs of the
    batch). The phrase embedding ``h_p`` is the mean of the student's last-layer token states over
    the phrase's tokens, taken from the same forward pass as the sentence (§3.3); ``h_o`` is the
    frozen teacher feature of the segmented object (ResNet-50, 2048-d; cached by Stage 1). Both
    go through a projection into a shared 256-d space (§4.1) and sim is cosine; τ = 0.05.

    Choices the paper leaves open (the authors' code is not public; this is a first
    implementation):

    * Projection heads: one Linear + Tanh per side, as MCSE's heads (the paper says "MLP"); the
      MCSEO method gives the term its own heads, not shared with the image–caption term.
    * Dropout views (``views``): eq. 7 writes a single phrase embedding. The term is applied to
      both views and *averaged* by default (``"mean"``), the way MCSE's released ``model.py``
      combines the views of its image–caption term (which MCSEO builds on), so β = 0.005 acts
      on the scale of one view's eq. 7; ``"sum"`` adds them (2× eq. 7, the reading of MCSE's
      printed eq. 3); ``"first"`` uses view 1 alone (eq. 7 literally).
    * Reduction: eq. 7 sums over the pair's phrases; eq. 8 adds it per pair, so the batch value
      is the mean over the ``B`` pairs of the batch, pairs without the term counting zero.
    * Pairs with fewer than two surviving pairs skip the term (§4.1; one object makes a
      softmax over one candidate). Phrases truncated by ``max_length`` arrive already removed,
      together with their object, so ``K_i`` counts surviving pairs only.

    Heads: ``phrase`` (H→d, on the pooled phrase states) and ``object`` (D→d, on the cached
    object feature), PyTorch-default init.

    Inputs (contract with :meth:`mmcse.methods.phrases.PhraseIndex.batch`, which builds them):

    * ``token_states``: ``([B, L, H], [B, L, H])`` last-layer states of the two dropout views.
    * ``extras['phrase_spans']``: ``[B, P, 2]`` long, token ``(start, end)`` (end exclusive) of
      pair ``k`` of caption ``b``; ``-1`` where padded.
    * ``extras['phrase_mask']``: ``[B, P]`` bool, True for real pairs.
    * ``features['object']``: ``[B, P, D]`` the object feature paired with each phrase (zeros
      where padded).

    Returns ``{"object_phrase_loss": scalar}``. Sibling of
    :class:`~mmcse.losses.image_text_info_nce.ImageTextInfoNCELoss` (batch-level caption→image
    InfoNCE); here negatives are in-pair, so nothing is gathered across ranks.

    Args:
        feature_role: the cached object feature role.
        temperature: τ.
        views: ``"mean"``, ``"sum"`` or ``"first"`` (above).
    """

    requires = ("object",)
    terms = ("object_phrase_loss",)
    slots = {"phrase": "mlp", "object": "mlp"}
    needs_token_states = True

    def __init__(
        self, feature_role: str = "object", temperature: float = 0.05, views: str = "mean"
    ) -> None:
        super().__init__()
        if views not in VIEW_REDUCTIONS:
            raise ValueError(f"views must be one of {VIEW_REDUCTIONS}, not {views!r}")
        self.views = views
        self.feature_role = feature_role
        self.requires = (feature_role,)
        self.temperature = temperature

    @staticmethod
    def compute_loss_from_embeddings(
        phrases: Tensor, objects: Tensor, mask: Tensor, temperature: float = 0.05
    ) -> Tensor:
        """Eq. 7 per pair, mean over the batch's pairs. ``phrases``/``objects``: ``[B, P, d]``
        (already projected), ``mask``: ``[B, P]``."""
        logits = torch.einsum("bpd,bqd->bpq", l2_normalize(phrases), l2_normalize(objects))
        logits = (logits / temperature).float()
        logits = logits.masked_fill(~mask[:, None, :], float("-inf"))  # only real objects
        use = mask & (mask.sum(-1) >= MIN_PAIRS)[:, None]  # phrases that take part
        # shape-static (no indexing by ``use``, no branch on it), so the step compiles to one
        # graph: every phrase is scored, the ones that take no part weighted 0, their rows zeroed
        # first (a padded row has no finite logit; zeroed, its loss and gradient stay finite)
        logits = logits.masked_fill(~use[..., None], 0.0)
        targets = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        per_phrase = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        return (per_phrase * use.flatten()).sum() / mask.shape[0]

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        if inputs.token_states is None:
            raise ValueError("object_phrase_info_nce needs the student's token states")
        spans, mask = inputs.extras["phrase_spans"], inputs.extras["phrase_mask"]
        o = project_features(heads["object"], inputs.feature(self.feature_role))
        pooled = [mean_over_spans(states, spans) for states in inputs.token_states]
        phrases = project_views(heads["phrase"], *pooled)  # one matmul for both views
        if self.views == "first":
            phrases = phrases[:1]
        losses = [self.compute_loss_from_embeddings(p, o, mask, self.temperature) for p in phrases]
        loss = sum(losses) / len(losses) if self.views == "mean" else sum(losses)
        return {"object_phrase_loss": loss}
